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
        self._codes: Any = None
        decode = self.model.code2wav.chunked_decode

        def keep_codes(codes: Any, **kw: Any) -> Any:
            self._codes = codes.clone()
            return decode(codes, **kw)

        self.model.code2wav.chunked_decode = keep_codes

    def prompt(
        self, text: str, audio: Sequence[np.ndarray] = (), images: Sequence[Any] = ()
    ) -> Any:
        """The processor's inputs for one user turn: one placeholder per
        media item (audio first, then images), then the text, a line each:
        vLLM's rendering of such a chat for a checkpoint whose template
        takes plain-text content (the tiny one's)."""
        tok = self.processor.tokenizer
        parts = (
            [f"{tok.audio_bos_token}{tok.audio_token}{tok.audio_eos_token}"] * len(audio)
            + [f"{tok.vision_bos_token}{tok.image_token}{tok.vision_eos_token}"] * len(images)
            + [text]
        )
        chat = tok.apply_chat_template(
            [{"role": "user", "content": "\n".join(parts)}],
            tokenize=False,
            add_generation_prompt=True,
        )
        return self.processor(
            text=chat,
            audio=list(audio) or None,
            images=list(images) or None,
            return_tensors="pt",
        )

    def speak(
        self,
        text: str,
        *,
        speaker: str,
        audio: Sequence[np.ndarray] = (),
        images: Sequence[Any] = (),
        thinker_max_tokens: int = 32,
        talker_max_tokens: int = 64,
        chunk_frames: int = 25,
        context_frames: int = 25,
    ) -> Spoken:
        """Greedy ``generate`` with audio out; the waveform decoded again
        with ``chunk_frames`` / ``context_frames`` (what a streaming
        Code2Wav stage with those settings produces)."""
        import torch

        inputs = self.prompt(text, audio, images)
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
