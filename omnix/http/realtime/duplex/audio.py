"""A duplex session's audio on the wire: appends in, frames out.

Owns ``decode`` (an append's base64 PCM, 16-bit or 32-bit float, to float32
samples, a bad payload a ``DuplexError`` naming ``audio``), ``Framer``
(the samples cut into the model's 1,920-sample frames as they come, a tail
shorter than a frame kept for the next append) and ``encode`` (a frame of
float samples as the client asked to hear it, base64).

Does not own the rate (``config.py`` refuses any but 24 kHz) nor where
frames go (``session.py``).
"""

from __future__ import annotations

import base64
import binascii

import numpy as np

from omnix.events.options import DuplexFormat
from omnix.http.common.audio import to_pcm16
from omnix.http.realtime.duplex.config import FRAME_SAMPLES
from omnix.http.realtime.duplex.protocol import DuplexError

_DTYPES: dict[DuplexFormat, np.dtype] = {
    "pcm16": np.dtype("<i2"),
    "pcm_f32le": np.dtype("<f4"),
}


def decode(audio: str, fmt: DuplexFormat) -> np.ndarray:
    """An append's samples as float32 in [-1, 1] (16-bit: / 32768)."""
    try:
        raw = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise DuplexError("bad_audio", "audio is not base64.", "audio") from None
    dtype = _DTYPES[fmt]
    if len(raw) % dtype.itemsize:
        raise DuplexError(
            "bad_audio",
            f"audio holds {len(raw)} bytes, not whole {fmt} samples ({dtype.itemsize} bytes each).",
            "audio",
        )
    pcm = np.frombuffer(raw, dtype=dtype)
    if fmt == "pcm16":
        return pcm.astype(np.float32) / 32768.0
    if not np.isfinite(pcm).all():
        raise DuplexError("bad_audio", "audio holds samples that are not finite.", "audio")
    return pcm.astype(np.float32)


class Framer:
    """Samples in, whole frames out; the tail waits for more."""

    def __init__(self) -> None:
        self._tail = np.zeros(0, dtype=np.float32)

    @property
    def tail(self) -> int:
        """Samples waiting for a whole frame."""
        return int(self._tail.shape[0])

    def frames_after(self, samples: int) -> int:
        """Whole frames ``samples`` more would make."""
        return (self.tail + samples) // FRAME_SAMPLES

    def push(self, pcm: np.ndarray) -> list[np.ndarray]:
        joined = np.concatenate([self._tail, pcm]) if self._tail.shape[0] else pcm
        n = joined.shape[0] // FRAME_SAMPLES
        out = [
            np.ascontiguousarray(joined[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES])
            for i in range(n)
        ]
        self._tail = np.array(joined[n * FRAME_SAMPLES :], dtype=np.float32)
        return out

    def clear(self) -> None:
        self._tail = np.zeros(0, dtype=np.float32)


def encode(pcm: np.ndarray, fmt: DuplexFormat) -> str:
    """Float samples as ``fmt``, base64 (16-bit as every omnix route
    writes it: ``to_pcm16``)."""
    if fmt == "pcm16":
        data = to_pcm16(pcm)
    else:
        data = np.asarray(pcm, dtype="<f4").tobytes()
    return base64.b64encode(data).decode("ascii")
