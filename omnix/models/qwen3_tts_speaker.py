"""Qwen3-TTS Base's speaker encoder: reference audio -> speaker vector.

Owns: ``speaker_mel`` (the 128-bin log-mel spectrogram the reference
computes of 24 kHz audio: a Slaney-scale, Slaney-normalised filterbank
rounded to float32 as librosa rounds it, a Hann-windowed STFT of 1,024
samples every 256, reflect-padded, magnitudes, natural-log compressed),
``SpeakerEncoderFields`` (``config.json``'s ``speaker_encoder_config`` with
the reference's defaults) and ``speaker_encoder`` (the ECAPA-TDNN, which is
transformers' Qwen2.5-Omni ``ECAPA_TimeDelayNet``: the same blocks and
tensor names as the checkpoint's ``speaker_encoder.*``).

Does not own loading the tensors or cloning a voice
(``omnix.engines.qwen3_tts_clone``) nor the prompt the vector goes into
(``omnix.engines.qwen3_tts_talker``).  Torch at import: import it where used.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import torch
from torch import nn

N_FFT = 1024
HOP = 256
N_MELS = 128
F_MAX = 12000.0
SAMPLE_RATE = 24000


class SpeakerEncoderFields(msgspec.Struct, frozen=True, kw_only=True):
    """``speaker_encoder_config`` (absent fields take the reference's
    defaults; ``enc_dim`` must be the talker's width)."""

    mel_dim: int = N_MELS
    enc_dim: int = 1024
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = SAMPLE_RATE

    @classmethod
    def of(cls, config: dict[str, Any]) -> SpeakerEncoderFields:
        """From ``config.json``'s ``speaker_encoder_config``."""
        return msgspec.convert(config, cls)


def speaker_encoder(fields: SpeakerEncoderFields) -> nn.Module:
    """The ECAPA-TDNN of ``fields``: [B, frames, mel_dim] -> [B, enc_dim]."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import ECAPA_TimeDelayNet

    if fields.mel_dim != N_MELS or fields.sample_rate != SAMPLE_RATE:
        raise ValueError(
            f"the speaker encoder reads {N_MELS}-bin mels of {SAMPLE_RATE} Hz audio, "
            f"not {fields.mel_dim} of {fields.sample_rate} Hz"
        )
    # ECAPA_TimeDelayNet reads these attributes of the config it is given.
    return ECAPA_TimeDelayNet(fields)  # type: ignore[arg-type]


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    mel = hz / (200.0 / 3)
    log = hz >= 1000.0
    step = np.log(6.4) / 27.0
    mel[log] = 15.0 + np.log(hz[log] / 1000.0) / step
    return mel


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    hz = (200.0 / 3) * mel
    log = mel >= 15.0
    step = np.log(6.4) / 27.0
    hz[log] = 1000.0 * np.exp(step * (mel[log] - 15.0))
    return hz


def mel_filterbank(
    sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS, f_max: float = F_MAX
) -> np.ndarray:
    """[n_mels, n_fft / 2 + 1] float32 triangles between Slaney-scale edge
    frequencies, each scaled to unit area (Slaney's norm).  The triangles
    are rounded to float32 before the norm multiplies them, and the product
    again: librosa's order, so the weights are its to the bit."""
    freqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sample_rate)
    edges = _mel_to_hz(
        np.linspace(_hz_to_mel(np.array([0.0]))[0], _hz_to_mel(np.array([f_max]))[0], n_mels + 2)
    )
    widths = np.diff(edges)
    ramps = np.subtract.outer(edges, freqs)
    weights = np.zeros((n_mels, len(freqs)), dtype=np.float32)
    for i in range(n_mels):
        rising = -ramps[i] / widths[i]
        falling = ramps[i + 2] / widths[i + 1]
        weights[i] = np.maximum(0, np.minimum(rising, falling))
    weights *= (2.0 / (edges[2 : n_mels + 2] - edges[:n_mels]))[:, None]
    return weights


def speaker_mel(wav: torch.Tensor) -> torch.Tensor:
    """[samples] float32 audio at 24 kHz -> [1, frames, 128] log mels."""
    basis = torch.from_numpy(mel_filterbank()).to(wav.device)
    window = torch.hann_window(N_FFT, device=wav.device)
    pad = (N_FFT - HOP) // 2
    y = nn.functional.pad(wav[None, None], (pad, pad), mode="reflect")[:, 0]
    spec = torch.stft(
        y,
        N_FFT,
        hop_length=HOP,
        win_length=N_FFT,
        window=window,
        center=False,
        normalized=False,
        onesided=True,
        return_complex=True,
    )
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    mel = torch.log(torch.clamp(torch.matmul(basis, magnitude), min=1e-5))
    return mel.transpose(1, 2)
