"""Qwen3-TTS Base: a voice cloned from reference audio.

Owns: ``VoiceCloner``, which loads a Base folder's speaker encoder (every
``speaker_encoder.*`` tensor of ``model.safetensors``) and its 12 Hz
tokenizer's encoder (every ``speech_tokenizer/`` ``encoder.*`` tensor), each
with none missing or left over, and turns 24 kHz reference audio into the
``VoiceClone`` a ``SpeechRequest`` carries: the speaker vector always, and
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


class VoiceCloner:
    """The speaker encoder and tokenizer encoder of one Base checkpoint."""

    def __init__(self, speaker: Any, encoder: Any, sample_rate: int) -> None:
        self.speaker = speaker
        self.encoder = encoder
        self.sample_rate = sample_rate

    @classmethod
    def load(cls, folder: str | Path) -> VoiceCloner:
        from omnix.engines.checkpoint import load_exact
        from omnix.models.qwen3_tts_encoder import SpeechEncoder
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
        speaker = load_exact(speaker_encoder(fields), folder, "speaker_encoder.", "speaker encoder")
        speech = folder / SPEECH_TOKENIZER_DIR
        scfg = read_config(speech)
        if int(scfg["input_sample_rate"]) != fields.sample_rate:
            raise ValueError(f"{speech}: the tokenizer and speaker encoder rates differ")
        encoder = SpeechEncoder(
            scfg["encoder_config"],
            int(scfg["encoder_valid_num_quantizers"]),
            int(scfg["encode_downsample_rate"]),
        )
        encoder = load_exact(encoder, speech, "encoder.", "12 Hz tokenizer encoder")
        return cls(speaker, encoder, fields.sample_rate)

    def speaker_vector(self, wav: torch.Tensor) -> torch.Tensor:
        """[samples] -> [enc_dim]: the ECAPA-TDNN of the audio's log mels."""
        import torch

        from omnix.models.qwen3_tts_speaker import speaker_mel

        with torch.inference_mode():
            out: torch.Tensor = self.speaker(speaker_mel(wav))[0]
        return out

    def clone(self, wav: torch.Tensor, sample_rate: int, text: str | None = None) -> VoiceClone:
        """The voice of ``wav`` (float32 samples): with its transcript
        ``text``, its codes too (ICL); without, the speaker vector alone."""
        if sample_rate != self.sample_rate:
            raise ValueError(
                f"reference audio at {sample_rate} Hz; this checkpoint clones from "
                f"{self.sample_rate} Hz audio (resampling is not done here)"
            )
        codes = self.encoder.codes(wav) if text else None
        return VoiceClone(speaker=self.speaker_vector(wav), codes=codes, text=text or None)
