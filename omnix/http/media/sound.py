"""Decoding an audio part: PyAV (FFmpeg), off the event loop.

Owns ``decode_audio``: telling the container from the bytes' magic number
(``sniff_audio``; a declared format otherwise), decoding and resampling
(libswresample) to the pipeline's rate as float32 mono (the channels'
mean), raw ``pcm16`` at its declared rate, and the length limit, checked
from the container header where it is exact and on the samples as they
come (a 10 MB Opus file can hold hours).
"""

from __future__ import annotations

import io
import urllib.parse
from typing import Final

import av
import numpy as np

from omnix.http.core.errors import ApiError
from omnix.http.media.common import ACCEPTED_AUDIO, AUDIO_FORMATS, bad, why
from omnix.pipelines.config import MediaLimits

# Demuxers whose duration comes from the header exactly (mp3 and ADTS
# durations are estimates from the first frame's bitrate).
_EXACT_DURATION: Final = frozenset({"wav", "flac", "ogg", "mp4", "matroska"})


def decode_audio(
    param: str, data: bytes, hint: str, pcm_rate: int, limits: MediaLimits
) -> np.ndarray:
    """The clip as float32 mono samples at ``limits.sample_rate``: its
    format told from its magic number (else ``hint``), raw ``pcm16`` at
    ``pcm_rate``; its length checked from the header where exact and on
    the samples."""
    demuxer = sniff_audio(data, weak=not hint) or hint
    if not demuxer:
        raise bad(
            param,
            f"{param}: the audio format could not be told from the data or its type; "
            f"send {ACCEPTED_AUDIO} with its media type (e.g. data:audio/wav;base64,...).",
            "unsupported_media_format",
        )
    try:
        if demuxer == "pcm16":
            samples = _decode_pcm16(param, data, pcm_rate, limits)
        else:
            samples = _decode_container(param, data, demuxer, limits)
    except ApiError:
        raise
    except Exception as exc:
        raise bad(
            param,
            f"{param}: the audio could not be decoded as {demuxer} ({why(exc)}); send a "
            f"valid {ACCEPTED_AUDIO} clip.",
        ) from None
    if samples.size == 0:
        raise bad(param, f"{param}: the audio holds no samples; send a non-empty clip.")
    if not np.isfinite(samples).all():
        raise bad(param, f"{param}: the audio holds NaN or infinite samples.")
    _check_seconds(param, samples.size / limits.sample_rate, limits)
    return samples


def _check_seconds(param: str, seconds: float, limits: MediaLimits, about: bool = False) -> None:
    most = limits.max_audio_seconds
    if seconds > most:
        raise bad(
            param,
            f"{param}: the audio is {'about ' if about else ''}{seconds:.1f} s long; this "
            f"pipeline takes at most {most:g} s per clip. Trim it or split it over several "
            "requests.",
            "audio_too_long",
        )


def _decode_container(param: str, data: bytes, demuxer: str, limits: MediaLimits) -> np.ndarray:
    rate = limits.sample_rate
    # Past this many samples the clip is too long: stop decoding (a
    # 10 MB Opus file can hold hours).
    cap = int(limits.max_audio_seconds * rate) + 1
    with av.open(io.BytesIO(data), mode="r", format=demuxer) as container:
        if not container.streams.audio:
            raise bad(param, f"{param}: the {demuxer} data holds no audio stream.")
        stream = container.streams.audio[0]
        if demuxer in _EXACT_DURATION and container.duration:
            _check_seconds(param, container.duration / 1e6, limits)
        # Planar float at the target rate, channels kept: they are
        # averaged below (libswresample's own downmix to mono scales a
        # stereo pair by 1/sqrt(2) each, not 1/2).
        resampler = av.AudioResampler(format="fltp", rate=rate)
        pieces: list[np.ndarray] = []
        n = 0
        for frame in container.decode(stream):
            for out in resampler.resample(frame):
                pieces.append(_mono(out.to_ndarray()))
                n += pieces[-1].size
            if n > cap:
                _check_seconds(param, n / rate, limits, about=True)
        for out in resampler.resample(None):
            pieces.append(_mono(out.to_ndarray()))
    if not pieces:
        return np.zeros(0, np.float32)
    return np.concatenate(pieces).astype(np.float32, copy=False)


def _decode_pcm16(param: str, data: bytes, pcm_rate: int, limits: MediaLimits) -> np.ndarray:
    if len(data) % 2:
        raise bad(
            param,
            f"{param}: pcm16 audio must be whole 16-bit samples, but it has an odd number "
            f"of bytes ({len(data)}).",
        )
    rate = limits.sample_rate
    _check_seconds(param, len(data) / 2 / pcm_rate, limits)
    x = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    if pcm_rate == rate or x.size == 0:
        return x
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    pieces: list[np.ndarray] = []
    step = 1 << 16
    for i in range(0, x.size, step):
        frame = av.AudioFrame.from_ndarray(x[None, i : i + step], format="flt", layout="mono")
        frame.sample_rate = pcm_rate
        frame.pts = i
        for out in resampler.resample(frame):
            pieces.append(out.to_ndarray().reshape(-1))
    for out in resampler.resample(None):
        pieces.append(out.to_ndarray().reshape(-1))
    return np.concatenate(pieces).astype(np.float32, copy=False)


def sniff_audio(data: bytes, weak: bool) -> str:
    """The demuxer the bytes' magic number names ("" if none).  ``weak``
    also trusts frame sync words (MPEG audio, ADTS), which raw PCM can
    imitate, so only when nothing declared the format."""
    head = data[:12]
    if head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:3] == b"ID3":
        return "mp3"
    if head[4:8] == b"ftyp":
        return "mp4"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if weak and len(head) >= 2 and head[0] == 0xFF:
        if head[1] & 0xF6 == 0xF0:
            return "aac"
        if head[1] & 0xE0 == 0xE0 and head[1] & 0x06:
            return "mp3"
    return ""


def from_extension(url: str) -> str:
    path = urllib.parse.urlsplit(url).path.lower()
    ext = path.rpartition(".")[2] if "." in path.rpartition("/")[2] else ""
    return "" if ext == "pcm16" else AUDIO_FORMATS.get(ext, "")


def _mono(planes: np.ndarray) -> np.ndarray:
    """(channels, n) planar samples -> (n,), the channels' mean."""
    return planes[0] if planes.shape[0] == 1 else planes.mean(axis=0, dtype=np.float32)
