"""What every step of media decoding shares: formats, limits' messages, refusals.

Owns: the formats omnix decodes (``AUDIO_FORMATS``: ``input_audio.format``
-> FFmpeg demuxer; ``AUDIO_MEDIA_TYPES``: a ``data:`` URL's or a fetched
file's media type -> the same), the rate raw ``pcm16`` input is taken to
have (``PCM16_RATE``), ``DecodedMedia`` (a part decoded and within limits),
``Source`` (where a part's bytes are, found by the cheap checks), and the
400s a part is refused with, each naming the part's JSON path.
"""

from __future__ import annotations

from typing import Final

import av
import msgspec
import numpy as np

from omnix.events.types import MediaKind
from omnix.http.core.errors import ApiError

#: The rate raw pcm16 input is taken to have when nothing says otherwise.
PCM16_RATE: Final = 24_000
#: The built-in pipeline that takes audio and image input (named in errors).
MEDIA_PIPELINE: Final = "tiny-omni"

# input_audio.format -> FFmpeg demuxer ("pcm16" is raw, no demuxer).
AUDIO_FORMATS: Final[dict[str, str]] = {
    "wav": "wav",
    "mp3": "mp3",
    "flac": "flac",
    "ogg": "ogg",
    "opus": "ogg",
    "aac": "aac",
    "m4a": "mp4",
    "mp4": "mp4",
    "webm": "matroska",
    "pcm16": "pcm16",
}
#: data:/Content-Type media type -> the same names.
AUDIO_MEDIA_TYPES: Final[dict[str, str]] = {
    "audio/wav": "wav",
    "audio/wave": "wav",
    "audio/x-wav": "wav",
    "audio/vnd.wave": "wav",
    "audio/mpeg": "mp3",
    "audio/mp3": "mp3",
    "audio/flac": "flac",
    "audio/x-flac": "flac",
    "audio/ogg": "ogg",
    "audio/opus": "ogg",
    "audio/aac": "aac",
    "audio/x-aac": "aac",
    "audio/mp4": "mp4",
    "audio/m4a": "mp4",
    "audio/x-m4a": "mp4",
    "audio/webm": "matroska",
    "audio/pcm": "pcm16",
}
ACCEPTED_AUDIO = "wav, mp3, flac, ogg/opus, aac (ADTS), m4a, webm, pcm16"


class DecodedMedia(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """One media part, decoded and within the pipeline's limits.

    ``array`` is read-only: float32 mono samples of shape ``(n,)`` at
    ``rate`` Hz for audio (``in_video``: a video's sound track), uint8 RGB
    of shape ``(height, width, 3)`` for an image (``rate == 0``), uint8
    repaint weights for a mask, the encoded file's bytes for a video (the
    engine samples ``fps`` frames a second of it, at most ``frames``).  ``source_bytes`` is the encoded size (after
    base64), for admission cost metrics.
    """

    param: str
    kind: MediaKind
    array: np.ndarray
    rate: int = 0
    fps: float = 0.0
    frames: int = 0
    in_video: bool = False
    source_bytes: int


class FilePart(msgspec.Struct, frozen=True):
    """An uploaded file to decode as ``kind``, named ``param`` in errors."""

    param: str
    kind: MediaKind
    data: bytes


class Source(msgspec.Struct, frozen=True, kw_only=True):
    """Where a part's bytes are, found by the cheap checks on the loop:
    base64 text at ``b64[start:]``, or a remote ``url``.  ``hint`` is the
    declared format (an ``AUDIO_FORMATS`` value, or "" when unknown);
    ``rate`` the raw pcm16 rate a data URL declared."""

    param: str
    kind: MediaKind
    b64: str = ""
    start: int = 0
    url: str = ""
    hint: str = ""
    rate: int = PCM16_RATE


def bad(param: str, message: str, code: str = "invalid_media") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def a_kind(kind: MediaKind) -> str:
    return {"image": "an image", "video": "a video", "mask": "a mask"}.get(kind, "an audio")


def shown(url: str) -> str:
    return repr(url if len(url) <= 120 else url[:117] + "...")


def why(exc: BaseException) -> str:
    # FFmpeg's errors read "[Errno N] Invalid data...: '<none>'"; its text suffices.
    text = (exc.strerror if isinstance(exc, av.FFmpegError) else None) or str(exc).strip()
    text = text or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def too_big(param: str, size: int, most: int, at_least: bool = False) -> ApiError:
    return bad(
        param,
        f"{param} is {'more than ' if at_least else ''}{mb(size)} ({size} bytes); this server "
        f"takes at most {mb(most)} ({most} bytes) per media part, after base64 decoding. Send a "
        "smaller or more compressed file.",
        "media_too_large",
    )


def too_many_pixels(param: str, size: tuple[int, int] | None, most: int) -> ApiError:
    what = f"is {size[0]}x{size[1]} = {size[0] * size[1]} pixels" if size else "is too large"
    return bad(
        param,
        f"{param}: the image {what}; this pipeline takes at most {most} pixels per image. "
        "Scale it down and send it again.",
        "image_too_large",
    )


def mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
