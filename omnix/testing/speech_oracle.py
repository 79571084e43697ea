"""The reference a served Qwen3-Omni is held equal to: transformers' generate.

Owns: ``Reference`` (transformers' ``Qwen3OmniMoeForConditionalGeneration``
loaded from a folder, with its processor) and ``Reference.speak``, which
runs ``generate(..., return_audio=True)`` greedily on one conversation and
returns what omnix's pipeline must reproduce: the thinker's generated ids,
the talker's codes in every code group (``generate`` returns only the
waveform, so the codes are taken where it hands them to Code2Wav), and the
waveform of those codes decoded with a given chunking.  Used by the oracle
tests and ``omnix bench speech``; never by the server.

The prompt is rendered the way vLLM renders it for omnix's thinker: the
checkpoint's chat template over text, with one placeholder token per media
item that the processor expands (audio before images, as omnix sends them).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Spoken:
    """One reference answer."""

    prompt_ids: list[int]
    thinker_ids: list[int]  # generated, the stop token included
    codes: np.ndarray  # [frames, groups]
    waveform: np.ndarray  # float32, the codes decoded with the given chunking
    seconds: float  # wall time of generate (thinker, talker and its decode)


class Reference:
    """transformers' own Qwen3-Omni on one folder, on the CPU."""

    def __init__(self, folder: str | Path) -> None:
        import torch
        from transformers import AutoProcessor, Qwen3OmniMoeForConditionalGeneration

        from omnix.engines.vllm_plugin import register

        register()  # the processor's video slot needs torchvision or the shim
        self.folder = Path(folder)
        self.processor = AutoProcessor.from_pretrained(str(self.folder))
        self.model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
            str(self.folder), dtype=torch.float32
        ).eval()
        talker = self.model.talker
        if not hasattr(talker.config, "audio_config"):
            # transformers 5.19's talker rope index reads the audio window
            # from its own config, which has none, when a prompt's audio is
            # not its only media (a video's sound track, audio beside an
            # image): generate fails there.  The thinker's window is the one
            # that cut the audio (omnix's talker does the same).
            talker.config.audio_config = self.model.config.thinker_config.audio_config
        self._codes: Any = None
        decode = self.model.code2wav.chunked_decode

        def keep_codes(codes: Any, **kw: Any) -> Any:
            self._codes = codes.clone()
            return decode(codes, **kw)

        self.model.code2wav.chunked_decode = keep_codes

    def prompt(
        self,
        text: str,
        audio: Sequence[np.ndarray] = (),
        images: Sequence[Any] = (),
        videos: Sequence[np.ndarray] = (),
        use_audio_in_video: bool = False,
    ) -> Any:
        """The processor's inputs for one user turn: one placeholder per
        media item (audio first, then images, then videos), then the text,
        a line each: vLLM's rendering of such a chat for a checkpoint whose
        template takes plain-text content (the tiny one's).  With
        ``use_audio_in_video`` the audio are the videos' sound tracks: they
        have no placeholder of their own (the processor interleaves them
        into the videos')."""
        tok = self.processor.tokenizer
        own_audio = 0 if use_audio_in_video else len(audio)
        parts = (
            [f"{tok.audio_bos_token}{tok.audio_token}{tok.audio_eos_token}"] * own_audio
            + [f"{tok.vision_bos_token}{tok.image_token}{tok.vision_eos_token}"] * len(images)
            + [f"{tok.vision_bos_token}{tok.video_token}{tok.vision_eos_token}"] * len(videos)
            + [text]
        )
        chat = tok.apply_chat_template(
            [{"role": "user", "content": "\n".join(parts)}],
            tokenize=False,
            add_generation_prompt=True,
        )
        # The processor interleaves a video's frames and sound at its own
        # default rate (13 positions a second); the model (and vLLM) place
        # them at the checkpoint's: the tiny one says 25.
        rate = self.model.config.thinker_config.position_id_per_seconds
        return self.processor(
            text=chat,
            audio=list(audio) or None,
            images=list(images) or None,
            videos=list(videos) or None,
            use_audio_in_video=use_audio_in_video,
            position_id_per_seconds=rate,
            return_tensors="pt",
        )

    def speak(
        self,
        text: str,
        *,
        speaker: str,
        audio: Sequence[np.ndarray] = (),
        images: Sequence[Any] = (),
        videos: Sequence[np.ndarray] = (),
        use_audio_in_video: bool = False,
        thinker_max_tokens: int = 32,
        talker_max_tokens: int = 64,
        chunk_frames: int = 25,
        context_frames: int = 25,
    ) -> Spoken:
        """Greedy ``generate`` with audio out; the waveform decoded again
        with ``chunk_frames`` / ``context_frames`` (what a streaming
        Code2Wav stage with those settings produces)."""
        import torch

        inputs = self.prompt(text, audio, images, videos, use_audio_in_video)
        eos = self.model.generation_config.eos_token_id
        start = time.perf_counter()
        with torch.no_grad():
            seq, _ = self.model.generate(
                **inputs,
                speaker=speaker,
                return_audio=True,
                thinker_max_new_tokens=thinker_max_tokens,
                thinker_eos_token_id=eos,
                thinker_do_sample=False,
                talker_do_sample=False,
                talker_max_new_tokens=talker_max_tokens,
                use_audio_in_video=use_audio_in_video,
            )
        seconds = time.perf_counter() - start
        codes = self._codes
        threads = torch.get_num_threads()
        # omnix's workers run torch on one thread: the same reduction order
        # gives the same bits (another thread count moves the last one).
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                wav = self.model.code2wav.chunked_decode(
                    codes, chunk_size=chunk_frames, left_context_size=context_frames
                )
        finally:
            torch.set_num_threads(threads)
        prompt = inputs["input_ids"][0].tolist()
        return Spoken(
            prompt_ids=prompt,
            thinker_ids=seq[0, len(prompt) :].tolist(),
            codes=codes[0].T.numpy().copy(),
            waveform=wav[0, 0].float().numpy().copy(),
            seconds=seconds,
        )
