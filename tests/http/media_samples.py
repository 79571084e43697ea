"""Media made in code for the media decoding tests: clips, images, URLs."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import av
import numpy as np
import soundfile as sf
from PIL import Image

from omnix.http.common.fields import (
    AudioUrl,
    AudioUrlPart,
    ImageUrl,
    ImageUrlPart,
    InputAudio,
    InputAudioPart,
    VideoUrl,
    VideoUrlPart,
)


def wav(x: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, rate, format="WAV", subtype=subtype)
    return buf.getvalue()


def flac(x: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, rate, format="FLAC", subtype="PCM_16")
    return buf.getvalue()


def pcm16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def encoded(x: np.ndarray, rate: int, container: str, codec: str) -> bytes:
    """Mono ``x`` encoded with FFmpeg (mp3: ("mp3", "libmp3lame"), ...)."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        assert isinstance(stream, av.audio.stream.AudioStream)
        frame = av.AudioFrame.from_ndarray(x.reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = rate
        frame.pts = 0
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def mp3(x: np.ndarray, rate: int) -> bytes:
    return encoded(x, rate, "mp3", "libmp3lame")


def gradient(height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack(
        [x * 255 // max(1, width - 1), y * 255 // max(1, height - 1), (x + y) % 256], -1
    ).astype(np.uint8)


def image(array: np.ndarray, fmt: str = "PNG", **options: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, fmt, **options)
    return buf.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` and whose data is a
    few bytes: decoding its pixels would fail, reading its size does not."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 16))
        + chunk(b"IEND", b"")
    )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{b64(data)}"


def audio_part(data: bytes, fmt: str) -> InputAudioPart:
    return InputAudioPart(input_audio=InputAudio(data=b64(data), format=fmt))


def audio_url(url: str) -> AudioUrlPart:
    return AudioUrlPart(audio_url=AudioUrl(url=url))


def image_url(url: str) -> ImageUrlPart:
    return ImageUrlPart(image_url=ImageUrl(url=url))


def png_part(array: np.ndarray) -> ImageUrlPart:
    return image_url(data_url("image/png", image(array)))


def video_url(url: str) -> VideoUrlPart:
    return VideoUrlPart(video_url=VideoUrl(url=url))
