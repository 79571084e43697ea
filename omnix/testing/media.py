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


def mp4_bytes(
    seconds: float = 2.0,
    fps: int = 8,
    width: int = 64,
    height: int = 48,
    audio: bool = True,
    rate: int = 22_050,
) -> bytes:
    """An H.264 MP4 of a gradient moving a pixel a frame, with a sine tone
    as its AAC sound track (``audio``), encoded with PyAV."""
    from fractions import Fraction

    import av

    frames = max(1, round(seconds * fps))
    base = gradient(width + frames, height)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        video = out.add_stream("libx264", rate=Fraction(fps, 1))
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.codec_context.thread_count = 1
        sound = None
        if audio:
            sound = out.add_stream("aac", rate=rate)
            sound.layout = "mono"
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(
                np.ascontiguousarray(base[:, i : i + width]), format="rgb24"
            )
            for packet in video.encode(frame):
                out.mux(packet)
        for packet in video.encode():
            out.mux(packet)
        if sound is not None:
            samples = tone(frames / fps, rate)
            step = 1024
            for i in range(0, samples.size, step):
                chunk = av.AudioFrame.from_ndarray(
                    samples[None, i : i + step], format="flt", layout="mono"
                )
                chunk.sample_rate = rate
                chunk.pts = i
                for packet in sound.encode(chunk):
                    out.mux(packet)
            for packet in sound.encode():
                out.mux(packet)
    return buf.getvalue()


def video_part(seconds: float = 2.0, audio: bool = True, **kwargs: Any) -> dict[str, Any]:
    """A ``video_url`` content part carrying ``mp4_bytes`` as a data URL."""
    data = base64.b64encode(mp4_bytes(seconds, audio=audio, **kwargs)).decode()
    return {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{data}"}}
