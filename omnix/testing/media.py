"""Deterministic media for tests, the replay corpus and benchmarks.

Owns: small generators of the audio clips and images a client would send
(a sine tone as a WAV file, a gradient as a PNG data URL, and the chat
content parts that carry them).  Does not own decoding them (that is
``omnix.http.media``).
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np


def tone(seconds: float, rate: int = 22_050, hz: float = 440.0, amp: float = 0.3) -> np.ndarray:
    """A float32 sine tone at ``amp`` of full scale."""
    t = np.arange(int(seconds * rate)) / rate
    return (amp * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def wav_bytes(seconds: float, rate: int = 22_050) -> bytes:
    """A mono 16-bit WAV file of ``tone(seconds, rate)``."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, tone(seconds, rate), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def gradient(width: int = 320, height: int = 224) -> np.ndarray:
    """An RGB image: red rising left to right, green top to bottom."""
    rgb = np.zeros((height, width, 3), np.uint8)
    rgb[..., 0] = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
    rgb[..., 1] = np.linspace(0, 255, height, dtype=np.uint8)[:, None]
    return rgb


def png_bytes(width: int = 320, height: int = 224) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(gradient(width, height)).save(buf, format="PNG")
    return buf.getvalue()


def audio_part(seconds: float = 2.0, rate: int = 22_050) -> dict[str, Any]:
    """An OpenAI ``input_audio`` content part holding a WAV clip."""
    data = base64.b64encode(wav_bytes(seconds, rate)).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


def image_part(width: int = 320, height: int = 224) -> dict[str, Any]:
    """An OpenAI ``image_url`` content part holding a PNG data URL."""
    url = "data:image/png;base64," + base64.b64encode(png_bytes(width, height)).decode()
    return {"type": "image_url", "image_url": {"url": url}}
