"""Qwen3-TTS Base: a voice cloned from reference audio.

Owns: ``SpeakerEncoder``, which loads a Base folder's speaker encoder
(every ``speaker_encoder.*`` tensor of ``model.safetensors``, none missing
or left over) and turns 24 kHz audio into its speaker vector, on one
intra-op thread however the process sets torch's (the reference's bits:
more threads sum in another order); ``VoiceCloner``, that and the 12 Hz
tokenizer's encoder (every ``speech_tokenizer/`` ``encoder.*`` tensor),
which turns reference audio into the ``VoiceClone`` a ``SpeechRequest``
carries: the speaker vector always (the one given, when the request
carries it already: what the server computed at admission or upload), and
with the audio's transcript the audio's codes (ICL: both go into the
talker's prompt), as the reference's ``create_voice_clone_prompt`` does;
and ``read_wav`` (``wav_samples``: as numpy), a WAV file's samples as
float32 (16-bit PCM over 32768, as soundfile and librosa read them).

Does not own the modules (``omnix.models.qwen3_tts_speaker``,
``omnix.models.qwen3_tts_encoder``), the prompt (``qwen3_tts_talker``), nor
resampling: audio at another rate is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from omnix.engines.qwen3_tts_talker import VoiceClone

if TYPE_CHECKING:
    import torch

SPEECH_TOKENIZER_DIR = "speech_tokenizer"


def wav_samples(path: str | Path | IO[bytes]) -> tuple[np.ndarray, int]:
    """An audio file's samples (channels averaged) as float32 and its rate
    (``path``: a file's path, or its bytes open; soundfile reads WAV, FLAC
    and Ogg, and raises on what it cannot read)."""
    import soundfile as sf

    source = path if hasattr(path, "read") else str(path)
    data, rate = sf.read(source, dtype="float32", always_2d=True)
    samples = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    return np.ascontiguousarray(samples, dtype=np.float32), int(rate)


def read_wav(path: str | Path | IO[bytes]) -> tuple[torch.Tensor, int]:
    """A WAV file's samples (channels averaged) as float32 and its rate."""
    import torch

    samples, rate = wav_samples(path)
    return torch.from_numpy(samples), rate


class SpeakerEncoder:
    """The speaker encoder (ECAPA-TDNN) of one Base checkpoint."""

    def __init__(self, module: Any, sample_rate: int, dim: int) -> None:
        self.module = module
        self.sample_rate = sample_rate
        #: the speaker vector's length (the talker's width)
        self.dim = dim

    @classmethod
    def load(cls, folder: str | Path) -> SpeakerEncoder:
        from omnix.engines.checkpoint import load_exact
        from omnix.models.qwen3_tts_modules import read_config
        from omnix.models.qwen3_tts_speaker import SpeakerEncoderFields, speaker_encoder

        folder = Path(folder)
        cfg = read_config(folder)
        if cfg.get("tts_model_type") != "base":
            raise ValueError(
                f"{folder} is not a Qwen3-TTS Base checkpoint "
                f"(tts_model_type {cfg.get('tts_model_type')!r}): only Base clones voices"
            )
        fields = SpeakerEncoderFields.of(cfg["speaker_encoder_config"])
        module = load_exact(speaker_encoder(fields), folder, "speaker_encoder.", "speaker encoder")
        return cls(module, fields.sample_rate, fields.enc_dim)

    def vector(self, wav: torch.Tensor) -> torch.Tensor:
        """[samples] -> [dim]: the ECAPA-TDNN of the audio's log mels."""
        import torch

        from omnix.models.qwen3_tts_speaker import speaker_mel

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.inference_mode():
                out: torch.Tensor = self.module(speaker_mel(wav))[0]
        finally:
            torch.set_num_threads(threads)
        return out

    def vector_of(self, samples: np.ndarray, sample_rate: int) -> np.ndarray:
        """``vector`` of float32 samples, as float32 numpy."""
        self.check_rate(sample_rate)
        import torch

        wav = torch.from_numpy(np.array(samples, dtype=np.float32))
        return self.vector(wav).numpy().astype(np.float32, copy=False)

    def check_rate(self, sample_rate: int) -> None:
        if sample_rate != self.sample_rate:
            raise ValueError(
                f"reference audio at {sample_rate} Hz; this checkpoint clones from "
                f"{self.sample_rate} Hz audio (resampling is not done here)"
            )


class VoiceCloner:
    """The speaker encoder and tokenizer encoder of one Base checkpoint."""

    def __init__(self, speaker: SpeakerEncoder, encoder: Any) -> None:
        self.speaker = speaker
        self.encoder = encoder
        self.sample_rate = speaker.sample_rate

    @classmethod
    def load(cls, folder: str | Path) -> VoiceCloner:
        from omnix.engines.checkpoint import load_exact
        from omnix.models.qwen3_tts_encoder import SpeechEncoder
        from omnix.models.qwen3_tts_modules import read_config

        folder = Path(folder)
        speaker = SpeakerEncoder.load(folder)
        speech = folder / SPEECH_TOKENIZER_DIR
        scfg = read_config(speech)
        if int(scfg["input_sample_rate"]) != speaker.sample_rate:
            raise ValueError(f"{speech}: the tokenizer and speaker encoder rates differ")
        encoder = SpeechEncoder(
            scfg["encoder_config"],
            int(scfg["encoder_valid_num_quantizers"]),
            int(scfg["encode_downsample_rate"]),
        )
        encoder = load_exact(encoder, speech, "encoder.", "12 Hz tokenizer encoder")
        return cls(speaker, encoder)

    def speaker_vector(self, wav: torch.Tensor) -> torch.Tensor:
        """[samples] -> [enc_dim]: the ECAPA-TDNN of the audio's log mels."""
        return self.speaker.vector(wav)

    def clone(
        self,
        wav: torch.Tensor | None,
        sample_rate: int,
        text: str | None = None,
        speaker: torch.Tensor | None = None,
    ) -> VoiceClone:
        """The voice of ``wav`` (float32 samples): with its transcript
        ``text``, its codes too (ICL); without, the speaker vector alone.
        ``speaker``: the clip's speaker vector, already made (then ``wav``
        is read only for its codes, and may be None without ``text``)."""
        import torch

        self.speaker.check_rate(sample_rate)
        if speaker is not None:
            dim = self.speaker.dim
            if tuple(speaker.shape) != (dim,) or speaker.dtype != torch.float32:
                raise ValueError(
                    f"the request's speaker vector has shape {tuple(speaker.shape)} and dtype "
                    f"{speaker.dtype}; this checkpoint's are ({dim},) float32"
                )
        if wav is None:
            if text or speaker is None:
                raise ValueError("cloning needs the reference audio: the request carries none")
            return VoiceClone(speaker=speaker)
        codes = self.encoder.codes(wav) if text else None
        vector = speaker if speaker is not None else self.speaker.vector(wav)
        return VoiceClone(speaker=vector, codes=codes, text=text or None)
