"""Checking a video part: PyAV (FFmpeg), off the event loop.

Owns ``check_video``: a ``video_url`` part's file opened (any container
FFmpeg demuxes with a video stream: MP4, WebM, QuickTime, Matroska...),
its length and frame size checked against the pipeline's limits from the
header (``max_video_seconds``, ``max_pixels``), its first frame decoded
(a file that does not decode is refused here, not in the engine), and its
sound track decoded and resampled as an audio part is (``sound.py``) when
the pipeline hears videos' sound (``MediaLimits.video_audio`` and
``audio``).  The file itself is kept as it came: the engine decodes it
(vLLM's own video loader, which samples ``video_fps`` frames a second, at
most ``max_video_frames``), so the log holds the exact bytes.

Does not own where the parts go (``parts.py``) nor the frames the model
sees (the engine).
"""

from __future__ import annotations

import io

import av
import msgspec
import numpy as np

from omnix.http.media.common import bad, too_many_pixels, why
from omnix.http.media.sound import decode_audio
from omnix.pipelines.config import MediaLimits

_ACCEPTED = "MP4, WebM, QuickTime or Matroska video"


class CheckedVideo(msgspec.Struct, frozen=True, eq=False):
    """A video part within limits: its file (uint8 bytes), its sound track
    (float32 mono at the pipeline's rate, or None), its length and size."""

    file: np.ndarray
    track: np.ndarray | None
    seconds: float
    width: int
    height: int


def _seconds(container: av.container.InputContainer, stream: av.video.stream.VideoStream) -> float:
    if container.duration:
        return container.duration / av.time_base
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    rate = float(stream.average_rate or 0)
    return stream.frames / rate if stream.frames and rate else 0.0


def check_video(param: str, data: bytes, limits: MediaLimits) -> CheckedVideo:
    """The video part of ``data``, checked (see the module doc)."""
    try:
        container = av.open(io.BytesIO(data), "r")
    except Exception as exc:
        raise bad(
            param,
            f"{param} is not a video this server can read ({why(exc)}); send an {_ACCEPTED}.",
            "unsupported_media_format",
        ) from None
    with container:
        if not container.streams.video:
            raise bad(param, f"{param} has no video stream: send a video ({_ACCEPTED}).")
        stream = container.streams.video[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        if width * height > limits.max_pixels:
            raise too_many_pixels(param, (width, height), limits.max_pixels)
        seconds = _seconds(container, stream)
        most = limits.max_video_seconds
        if seconds > most:
            raise bad(
                param,
                f"{param}: the video is {seconds:.1f} s long; this pipeline takes at most "
                f"{most:g} s per video. Cut it and send it again.",
                "video_too_long",
            )
        try:
            first = next(container.decode(video=0), None)
        except Exception as exc:
            raise bad(param, f"{param}: the video could not be decoded ({why(exc)}).") from None
        if first is None:
            raise bad(param, f"{param}: the video holds no frames.")
        has_sound = bool(container.streams.audio)
        demuxer = container.format.name.split(",")[0]
    track = None
    if has_sound and limits.audio and limits.video_audio:
        track = decode_audio(param, data, demuxer, 0, limits)
    return CheckedVideo(
        file=np.frombuffer(data, dtype=np.uint8).copy(),
        track=track,
        seconds=seconds,
        width=width,
        height=height,
    )
