"""Decoding the media parts of chat input, once, at admission.

Owns: turning a chat request's ``image_url`` / ``input_audio`` /
``audio_url`` / ``video_url`` parts (``schemas.MediaContentPart``) into
arrays a model's processor takes: audio as float32 mono samples resampled
(by omnix, with PyAV's libswresample) to the pipeline's
``MediaLimits.sample_rate``; images as uint8 RGB arrays of shape
``(height, width, 3)`` (PIL; turned upright by its EXIF orientation,
transparency shown over white, an animation's first frame).  Every check a part must pass happens here,
before anything is admitted, and each failure is an ``ApiError`` 400 whose
``param`` is the part's JSON path (``messages[0].content[1]``): the kind
the pipeline takes, parts per kind, bytes per part (from the base64 length,
before decoding), pixels (from the image header, before decoding pixels),
seconds of audio (from the container header where it is exact, and on the
decoded samples), bad data of every sort, and where a URL may point.

Where media may come from: ``data:`` URLs and ``input_audio`` base64;
``http(s)`` URLs only of hosts in ``allowed_domains`` (exact host names,
like vLLM's ``--allowed-media-domains``), fetched with aiohttp under a
timeout and the part's byte limit, redirects followed only to allowed
hosts.  Never ``file://``, a local path or any other scheme.

Raw ``pcm16`` audio (``input_audio.format == "pcm16"`` or a
``data:audio/pcm`` URL) is signed 16-bit little-endian mono at 24 kHz
(``PCM16_RATE``: OpenAI's pcm16 rate, and what omnix's own pcm16 output
uses), unless a data URL says otherwise (``data:audio/pcm;rate=16000;...``).

The CPU work (base64, demuxing, decoding, resampling, pixel copies) runs
in a thread pool, off the event loop, and is arranged so that no step
holds the GIL for long: PIL and FFmpeg release it while they decode,
large base64 is decoded with numpy (binascii would hold it throughout) and
an RGB image is decoded into numpy memory (Pillow's own allocation zeroes
it holding the GIL), other images' pixels are copied out in bands of rows.

Does not own where the decoded arrays go (the adapter stores them as
blobs and records ``MediaPart``s) nor the text of the message.
"""

from __future__ import annotations

import asyncio
import binascii
import io
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final

import aiohttp
import av
import msgspec
import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from omnix.events.types import MediaKind
from omnix.http.errors import ApiError
from omnix.http.schemas import (
    AudioUrlPart,
    ImageUrlPart,
    InputAudioPart,
    MediaContentPart,
    VideoUrlPart,
)
from omnix.pipelines.config import MediaLimits

#: The rate raw pcm16 input is taken to have when nothing says otherwise.
PCM16_RATE: Final = 24_000
#: The built-in pipeline that takes audio and image input (named in errors).
MEDIA_PIPELINE: Final = "tiny-omni"

# input_audio.format -> FFmpeg demuxer ("pcm16" is raw, no demuxer).
_AUDIO_FORMATS: Final[dict[str, str]] = {
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
_ACCEPTED_AUDIO = "wav, mp3, flac, ogg/opus, aac (ADTS), m4a, webm, pcm16"
# Demuxers whose duration comes from the header exactly (mp3 and ADTS
# durations are estimates from the first frame's bitrate).
_EXACT_DURATION: Final = frozenset({"wav", "flac", "ogg", "mp4", "matroska"})
_IMAGE_FORMATS: Final = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
_ACCEPTED_IMAGES = "PNG, JPEG, WebP, GIF or BMP"

# Base64 longer than this is decoded with numpy (see _b64_strict); shorter
# takes binascii under 2 ms.
_B64_NUMPY_FROM: Final = 1 << 19
_MAX_URL_CHARS: Final = 8192
_MAX_REDIRECTS: Final = 3
_FETCH_CHUNK: Final = 1 << 16


class DecodedMedia(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """One media part, decoded and within the pipeline's limits.

    ``array`` is read-only: float32 mono samples of shape ``(n,)`` at
    ``rate`` Hz for audio, uint8 RGB of shape ``(height, width, 3)`` for an
    image (``rate == 0``).  ``source_bytes`` is the encoded size (after
    base64), for admission cost metrics.
    """

    param: str
    kind: MediaKind
    array: np.ndarray
    rate: int = 0
    source_bytes: int


class _Source(msgspec.Struct, frozen=True, kw_only=True):
    """Where a part's bytes are, found by the cheap checks on the loop:
    base64 text at ``b64[start:]``, or a remote ``url``.  ``hint`` is the
    declared format (an ``_AUDIO_FORMATS`` value, or "" when unknown);
    ``rate`` the raw pcm16 rate a data URL declared."""

    param: str
    kind: MediaKind
    b64: str = ""
    start: int = 0
    url: str = ""
    hint: str = ""
    rate: int = PCM16_RATE


def _bad(param: str, message: str, code: str = "invalid_media") -> ApiError:
    return ApiError(400, message, param=param, code=code)


class MediaDecoder:
    """Validates and decodes a request's media parts for one pipeline.

    ``limits`` is the pipeline's ``media`` (None: the pipeline takes text
    only); ``allowed_domains`` the hosts whose http(s) URLs may be fetched
    (empty: none); ``workers`` the decoding threads; ``pipeline`` the
    pipeline's name, for messages.
    """

    def __init__(
        self,
        limits: MediaLimits | None,
        *,
        allowed_domains: frozenset[str] = frozenset(),
        workers: int = 2,
        pipeline: str = "",
        fetch_timeout_s: float = 10.0,
    ) -> None:
        self.limits = limits
        self.allowed_domains = frozenset(d.lower().rstrip(".") for d in allowed_domains)
        self.pipeline = pipeline
        self.fetch_timeout_s = fetch_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="media")

    # -- public -------------------------------------------------------------

    async def decode(self, parts: Sequence[tuple[str, MediaContentPart]]) -> list[DecodedMedia]:
        """Check, fetch and decode ``parts`` (``(json path, part)`` in
        request order); the decoded parts in the same order.  Raises
        ``ApiError`` (400) for the first part, in order, that fails."""
        if not parts:
            return []
        self._check_kinds(parts)
        sources = [self._locate(param, part) for param, part in parts]
        remote = [s for s in sources if s.url]
        fetched: dict[str, tuple[bytes, str]] = {}
        if remote:
            got = await self._fetch_all(remote)
            fetched = {s.param: g for s, g in zip(remote, got, strict=True)}
        loop = asyncio.get_running_loop()
        futures = [
            loop.run_in_executor(self._pool, self._decode_source, s, fetched.get(s.param))
            for s in sources
        ]
        results = await asyncio.gather(*futures, return_exceptions=True)
        out: list[DecodedMedia] = []
        for r in results:
            if isinstance(r, BaseException):
                raise r
            out.append(r)
        return out

    def decode_sync(self, param: str, part: MediaContentPart) -> DecodedMedia:
        """One inline part (``data:`` URL or ``input_audio``), checked and
        decoded on the calling thread.  Remote parts need ``decode``."""
        self._check_kinds([(param, part)])
        source = self._locate(param, part)
        if source.url:
            raise ValueError(f"{param} is a remote URL: decode() fetches it")
        return self._decode_source(source, None)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- checks on the loop (cheap: no decoding) -----------------------------

    def _check_kinds(self, parts: Sequence[tuple[str, MediaContentPart]]) -> None:
        counts = {"audio": 0, "image": 0}
        for param, part in parts:
            if isinstance(part, VideoUrlPart):
                raise _bad(
                    param,
                    f"{param} is a video_url part: video input is not supported on this "
                    "server (the Qwen3-Omni thinker's video processor needs torchvision, "
                    "which this server does not have). Send the audio track as input_audio "
                    "and key frames as image_url parts instead.",
                    "unsupported_input",
                )
            kind: MediaKind = "image" if isinstance(part, ImageUrlPart) else "audio"
            limits = self.limits
            name = f"pipeline '{self.pipeline}'" if self.pipeline else "this pipeline"
            if limits is None:
                raise _bad(
                    param,
                    f"{param} is {_a(kind)} part, but {name} takes text input only. Send text "
                    f"parts only, or use a pipeline that takes audio and image input (the "
                    f"built-in {MEDIA_PIPELINE} does).",
                    "unsupported_input",
                )
            accepted = limits.audio if kind == "audio" else limits.image
            if not accepted:
                takes = [k for k, ok in (("audio", limits.audio), ("image", limits.image)) if ok]
                raise _bad(
                    param,
                    f"{param} is {_a(kind)} part, but {name} does not take {kind} input "
                    f"(it takes text{''.join(' and ' + k for k in takes)}). Remove the part.",
                    "unsupported_input",
                )
            counts[kind] += 1
            most = limits.max_audio_parts if kind == "audio" else limits.max_image_parts
            if counts[kind] > most:
                raise _bad(
                    param,
                    f"{param} is {kind} part {counts[kind]} of this request, but {name} takes "
                    f"at most {most} {kind} part{'s' if most != 1 else ''} per request. Send "
                    "fewer, or split them over several requests.",
                    "too_many_media_parts",
                )

    def _locate(self, param: str, part: MediaContentPart) -> _Source:
        assert self.limits is not None  # _check_kinds ran
        if isinstance(part, InputAudioPart):
            data = part.input_audio.data
            fmt = part.input_audio.format.lower()
            if data.startswith("data:"):
                return self._data_url(param, "audio", data, declared=_AUDIO_FORMATS.get(fmt, ""))
            if fmt not in _AUDIO_FORMATS:
                raise _bad(
                    param,
                    f"{param}: input_audio.format {part.input_audio.format!r} is not an audio "
                    f"format this server decodes ({_ACCEPTED_AUDIO}). Convert the clip to "
                    "wav, mp3 or flac.",
                    "unsupported_media_format",
                )
            self._check_b64_size(param, data, 0)
            return _Source(param=param, kind="audio", b64=data, hint=_AUDIO_FORMATS[fmt])
        if isinstance(part, ImageUrlPart):
            return self._url(param, "image", part.image_url.url)
        assert isinstance(part, AudioUrlPart)
        return self._url(param, "audio", part.audio_url.url)

    def _url(self, param: str, kind: MediaKind, url: str) -> _Source:
        if url[:5].lower() == "data:":
            return self._data_url(param, kind, url)
        example = "data:image/png;base64,..." if kind == "image" else "data:audio/wav;base64,..."
        inline = f"send the bytes inline as a data: URL ({example})"
        if len(url) > _MAX_URL_CHARS:
            raise _bad(
                param,
                f"{param}: the URL is {len(url)} characters long; URLs of media are at most "
                f"{_MAX_URL_CHARS}. For media inline, {inline}.",
                "invalid_media_url",
            )
        scheme, _, _ = url.partition(":")
        scheme = scheme.lower()
        if scheme == "file" or "://" not in url:
            raise _bad(
                param,
                f"{param}: {_shown(url)} is not a data: or http(s) URL, and this server never "
                f"reads local files; {inline}.",
                "invalid_media_url",
            )
        if scheme not in ("http", "https"):
            raise _bad(
                param,
                f"{param}: {scheme}:// URLs are not fetched; use an http(s) URL of an allowed "
                f"host or {inline}.",
                "invalid_media_url",
            )
        self._check_host(param, url, inline)
        return _Source(param=param, kind=kind, url=url)

    def _check_host(self, param: str, url: str, inline: str) -> None:
        try:
            split = urllib.parse.urlsplit(url)
            host = (split.hostname or "").rstrip(".")
            split.port  # noqa: B018 (raises on a malformed port)
        except ValueError as exc:
            raise _bad(
                param, f"{param}: {_shown(url)} is not a valid URL ({exc}).", "invalid_media_url"
            ) from None
        if split.scheme.lower() not in ("http", "https") or not host:
            raise _bad(
                param, f"{param}: {_shown(url)} is not a valid http(s) URL.", "invalid_media_url"
            )
        if not self.allowed_domains:
            raise _bad(
                param,
                f"{param}: this server fetches no remote media (no allowed media domains are "
                f"configured), so {host} is refused; {inline}.",
                "media_domain_not_allowed",
            )
        if host not in self.allowed_domains:
            raise _bad(
                param,
                f"{param}: host {host} is not among the domains this server fetches media from "
                f"({', '.join(sorted(self.allowed_domains))}); {inline}.",
                "media_domain_not_allowed",
            )

    def _data_url(self, param: str, kind: MediaKind, url: str, declared: str = "") -> _Source:
        # The header is short; never scan a 13 MB payload for the comma.
        comma = url.find(",", 0, 512)
        if comma < 0:
            raise _bad(
                param,
                f"{param}: the data: URL has no ',' before its data; write it as "
                f"data:<media type>;base64,<data>.",
                "invalid_media_url",
            )
        tokens = [t.strip() for t in url[5:comma].split(";")]
        media_type = tokens[0].lower()
        if tokens[-1].lower() != "base64":
            raise _bad(
                param,
                f"{param}: the data: URL is not base64; write it as "
                f"data:{media_type or '<media type>'};base64,<data>.",
                "invalid_media_url",
            )
        hint = declared
        rate = PCM16_RATE
        if kind == "image":
            if (
                media_type
                and not media_type.startswith("image/")
                and media_type != "application/octet-stream"
            ):
                raise _bad(
                    param,
                    f"{param}: an image_url part holds {media_type} data; send images as "
                    "image/* (PNG, JPEG, WebP, GIF, BMP) and audio as input_audio or audio_url.",
                    "unsupported_media_format",
                )
        elif media_type:
            if media_type not in AUDIO_MEDIA_TYPES and media_type != "application/octet-stream":
                raise _bad(
                    param,
                    f"{param}: {media_type} is not an audio type this server decodes "
                    f"({_ACCEPTED_AUDIO}; e.g. data:audio/wav;base64,...).",
                    "unsupported_media_format",
                )
            hint = AUDIO_MEDIA_TYPES.get(media_type, declared)
            for token in tokens[1:-1]:
                name, _, value = token.partition("=")
                if name.strip().lower() == "rate" and hint == "pcm16":
                    if not value.strip().isdigit() or not 1000 <= int(value) <= 384_000:
                        raise _bad(
                            param,
                            f"{param}: rate={value} in the data: URL is not a sample rate in Hz "
                            "(1000-384000).",
                            "invalid_media_url",
                        )
                    rate = int(value)
        self._check_b64_size(param, url, comma + 1)
        return _Source(param=param, kind=kind, b64=url, start=comma + 1, hint=hint, rate=rate)

    def _check_b64_size(self, param: str, text: str, start: int) -> None:
        assert self.limits is not None
        chars = len(text) - start
        pad = 2 if text.endswith("==") else 1 if text.endswith("=") else 0
        size = chars // 4 * 3 + max(0, chars % 4 - 1) - pad
        if size > self.limits.max_part_bytes:
            raise _too_big(param, size, self.limits.max_part_bytes)
        if size <= 0:
            raise _bad(param, f"{param} holds no data (the base64 text is empty).")

    # -- fetching (async, on the loop) ---------------------------------------

    async def _fetch_all(self, sources: list[_Source]) -> list[tuple[bytes, str]]:
        timeout = aiohttp.ClientTimeout(total=self.fetch_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
            got = await asyncio.gather(
                *(self._fetch(session, s) for s in sources), return_exceptions=True
            )
        out: list[tuple[bytes, str]] = []
        for g in got:
            if isinstance(g, BaseException):
                raise g
            out.append(g)
        return out

    async def _fetch(self, session: aiohttp.ClientSession, source: _Source) -> tuple[bytes, str]:
        assert self.limits is not None
        cap = self.limits.max_part_bytes
        param, url = source.param, source.url
        inline = "send the bytes inline as a data: URL instead"
        try:
            for _ in range(_MAX_REDIRECTS + 1):
                async with session.get(
                    url, allow_redirects=False, headers={"Accept-Encoding": "identity"}
                ) as resp:
                    if resp.status in (301, 302, 303, 307, 308):
                        location = resp.headers.get("Location", "")
                        url = urllib.parse.urljoin(url, location)
                        # A redirect may not lead off the allowed hosts.
                        self._check_host(param, url, inline)
                        continue
                    if resp.status != 200:
                        raise _bad(
                            param,
                            f"{param}: fetching {_shown(source.url)} answered HTTP "
                            f"{resp.status} {resp.reason or ''}".rstrip()
                            + "; check the URL, or send the bytes inline as a data: URL.",
                            "media_fetch_failed",
                        )
                    if resp.content_length is not None and resp.content_length > cap:
                        raise _too_big(param, resp.content_length, cap)
                    buf = bytearray()
                    async for chunk in resp.content.iter_chunked(_FETCH_CHUNK):
                        buf += chunk
                        if len(buf) > cap:
                            raise _too_big(param, len(buf), cap, at_least=True)
                    if not buf:
                        raise _bad(param, f"{param}: {_shown(source.url)} answered no data.")
                    return bytes(buf), resp.headers.get("Content-Type", "")
        except (aiohttp.ClientError, TimeoutError) as exc:
            what = (
                f"took longer than {self.fetch_timeout_s:g} s"
                if isinstance(exc, TimeoutError)
                else f"failed ({type(exc).__name__}: {exc})"
            )
            raise _bad(
                param,
                f"{param}: fetching {_shown(source.url)} {what}; check the URL, or {inline}.",
                "media_fetch_failed",
            ) from None
        raise _bad(
            param,
            f"{param}: {_shown(source.url)} redirected more than {_MAX_REDIRECTS} times; "
            "send the final URL.",
            "media_fetch_failed",
        )

    # -- decoding (in the pool) ------------------------------------------------

    def _decode_source(self, source: _Source, fetched: tuple[bytes, str] | None) -> DecodedMedia:
        param = source.param
        hint = source.hint
        if fetched is not None:
            data, content_type = fetched
            media_type = content_type.partition(";")[0].strip().lower()
            if source.kind == "audio":
                hint = AUDIO_MEDIA_TYPES.get(media_type, "") or _from_extension(source.url)
        else:
            data = _b64decode(param, source.b64, source.start)
        assert self.limits is not None
        if len(data) > self.limits.max_part_bytes:
            raise _too_big(param, len(data), self.limits.max_part_bytes)
        if not data:
            raise _bad(param, f"{param} holds no data.")
        if source.kind == "image":
            array = self._decode_image(param, data)
            rate = 0
        else:
            array = self._decode_audio(param, data, hint, source.rate)
            rate = self.limits.sample_rate
        array.flags.writeable = False
        return DecodedMedia(
            param=param, kind=source.kind, array=array, rate=rate, source_bytes=len(data)
        )

    def _decode_image(self, param: str, data: bytes) -> np.ndarray:
        assert self.limits is not None
        most = self.limits.max_pixels
        try:
            # open() reads the header only: the size is known before any pixel is.
            img = Image.open(io.BytesIO(data), formats=_IMAGE_FORMATS)
        except Image.DecompressionBombError:
            raise _too_many_pixels(param, None, most) from None
        except UnidentifiedImageError:
            raise _bad(
                param,
                f"{param} is not a {_ACCEPTED_IMAGES} image this server can read; send one of "
                "those formats.",
            ) from None
        except Exception as exc:
            raise _bad(param, f"{param}: the image could not be read ({_why(exc)}).") from None
        with img:
            width, height = img.size
            if width <= 0 or height <= 0:
                raise _bad(param, f"{param}: the image is {width}x{height}: it has no pixels.")
            if width * height > most:
                raise _too_many_pixels(param, (width, height), most)
            try:
                backing = _decode_into_numpy(img)
                if img.getexif().get(0x0112, 1) != 1:  # EXIF orientation: as a viewer shows it
                    array = _pixels(_to_rgb(ImageOps.exif_transpose(img)))
                elif backing is not None:
                    array = np.empty((height, width, 3), np.uint8)
                    # A channel at a time: 3x faster than one (h, w, 3) copy.
                    for c in range(3):
                        array[..., c] = backing[..., c]
                else:
                    array = _pixels(_to_rgb(img))
            except Exception as exc:
                raise _bad(
                    param, f"{param}: the image could not be decoded ({_why(exc)})."
                ) from None
        if array.ndim != 3 or array.shape[2] != 3:  # pragma: no cover - convert("RGB") ensures it
            raise _bad(param, f"{param}: the image decoded to shape {array.shape}, not RGB.")
        return array

    def _decode_audio(self, param: str, data: bytes, hint: str, pcm_rate: int) -> np.ndarray:
        assert self.limits is not None
        demuxer = _sniff_audio(data, weak=not hint) or hint
        if not demuxer:
            raise _bad(
                param,
                f"{param}: the audio format could not be told from the data or its type; "
                f"send {_ACCEPTED_AUDIO} with its media type (e.g. data:audio/wav;base64,...).",
                "unsupported_media_format",
            )
        try:
            if demuxer == "pcm16":
                samples = self._decode_pcm16(param, data, pcm_rate)
            else:
                samples = self._decode_container(param, data, demuxer)
        except ApiError:
            raise
        except Exception as exc:
            raise _bad(
                param,
                f"{param}: the audio could not be decoded as {demuxer} ({_why(exc)}); send a "
                f"valid {_ACCEPTED_AUDIO} clip.",
            ) from None
        if samples.size == 0:
            raise _bad(param, f"{param}: the audio holds no samples; send a non-empty clip.")
        if not np.isfinite(samples).all():
            raise _bad(param, f"{param}: the audio holds NaN or infinite samples.")
        self._check_seconds(param, samples.size / self.limits.sample_rate)
        return samples

    def _check_seconds(self, param: str, seconds: float, about: bool = False) -> None:
        assert self.limits is not None
        most = self.limits.max_audio_seconds
        if seconds > most:
            raise _bad(
                param,
                f"{param}: the audio is {'about ' if about else ''}{seconds:.1f} s long; this "
                f"pipeline takes at most {most:g} s per clip. Trim it or split it over several "
                "requests.",
                "audio_too_long",
            )

    def _decode_container(self, param: str, data: bytes, demuxer: str) -> np.ndarray:
        assert self.limits is not None
        rate = self.limits.sample_rate
        # Past this many samples the clip is too long: stop decoding (a
        # 10 MB Opus file can hold hours).
        cap = int(self.limits.max_audio_seconds * rate) + 1
        with av.open(io.BytesIO(data), mode="r", format=demuxer) as container:
            if not container.streams.audio:
                raise _bad(param, f"{param}: the {demuxer} data holds no audio stream.")
            stream = container.streams.audio[0]
            if demuxer in _EXACT_DURATION and container.duration:
                self._check_seconds(param, container.duration / 1e6)
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
                    self._check_seconds(param, n / rate, about=True)
            for out in resampler.resample(None):
                pieces.append(_mono(out.to_ndarray()))
        if not pieces:
            return np.zeros(0, np.float32)
        return np.concatenate(pieces).astype(np.float32, copy=False)

    def _decode_pcm16(self, param: str, data: bytes, pcm_rate: int) -> np.ndarray:
        assert self.limits is not None
        if len(data) % 2:
            raise _bad(
                param,
                f"{param}: pcm16 audio must be whole 16-bit samples, but it has an odd number "
                f"of bytes ({len(data)}).",
            )
        rate = self.limits.sample_rate
        self._check_seconds(param, len(data) / 2 / pcm_rate)
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


# -- helpers ----------------------------------------------------------------------


def _a(kind: MediaKind) -> str:
    return "an image" if kind == "image" else "an audio"


def _shown(url: str) -> str:
    return repr(url if len(url) <= 120 else url[:117] + "...")


def _why(exc: BaseException) -> str:
    # FFmpeg's errors read "[Errno N] Invalid data...: '<none>'"; its text suffices.
    text = (exc.strerror if isinstance(exc, av.FFmpegError) else None) or str(exc).strip()
    text = text or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _too_big(param: str, size: int, most: int, at_least: bool = False) -> ApiError:
    return _bad(
        param,
        f"{param} is {'more than ' if at_least else ''}{_mb(size)} ({size} bytes); this server "
        f"takes at most {_mb(most)} ({most} bytes) per media part, after base64 decoding. Send a "
        "smaller or more compressed file.",
        "media_too_large",
    )


def _too_many_pixels(param: str, size: tuple[int, int] | None, most: int) -> ApiError:
    what = f"is {size[0]}x{size[1]} = {size[0] * size[1]} pixels" if size else "is too large"
    return _bad(
        param,
        f"{param}: the image {what}; this pipeline takes at most {most} pixels per image. "
        "Scale it down and send it again.",
        "image_too_large",
    )


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _b64decode(param: str, text: str, start: int) -> bytes:
    """``text[start:]`` as strict (padded, standard alphabet) base64."""
    try:
        return _b64_strict(text, start)
    except ValueError:
        pass
    # Line-wrapped base64 (MIME style) is still base64.
    if any(c in text for c in " \t\r\n"):
        try:
            return _b64_strict("".join(text[start:].split()), 0)
        except ValueError:
            pass
    raise _bad(
        param,
        f"{param}: the data is not valid base64 (truncated, or characters outside "
        "A-Z a-z 0-9 + / =); send the file's bytes as standard padded base64.",
    )


_B64_VALUES = np.full(256, 255, np.uint8)
_B64_VALUES[
    np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", np.uint8)
] = np.arange(64, dtype=np.uint8)


def _b64_strict(text: str, start: int) -> bytes:
    """Raises ValueError (binascii.Error, UnicodeEncodeError) on bad input.

    binascii holds the GIL for a whole call: 40 ms for 13 MB of text, all
    of it lost to the event loop however the text is sliced (the loop then
    waits a switch interval, 5 ms, for every turn).  numpy's element-wise
    loops release the GIL, so large payloads are decoded with them.
    """
    if len(text) - start <= _B64_NUMPY_FROM:
        return binascii.a2b_base64(text[start:], strict_mode=True)
    raw = np.frombuffer(text.encode("ascii"), np.uint8)[start:]
    if raw.size % 4:
        raise ValueError("base64 length is not a multiple of 4")
    pad = 2 if text.endswith("==") else 1 if text.endswith("=") else 0
    full = raw.size // 4 - (1 if pad else 0)
    values = _B64_VALUES[raw[: full * 4]]
    if (values == 255).any():  # also "=" before the end
        raise ValueError("characters outside the base64 alphabet")
    tail = binascii.a2b_base64(text[len(text) - 4 :], strict_mode=True) if pad else b""
    out = np.empty(full * 3 + len(tail), np.uint8)
    groups = out[: full * 3].reshape(full, 3)
    a, b, c, d = (values[k::4] for k in range(4))
    np.bitwise_or(a << 2, b >> 4, out=groups[:, 0])
    np.bitwise_or(b << 4, c >> 2, out=groups[:, 1])
    np.bitwise_or(c << 6, d, out=groups[:, 2])
    out[full * 3 :] = np.frombuffer(tail, np.uint8)
    return out.tobytes()


def _sniff_audio(data: bytes, weak: bool) -> str:
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


def _from_extension(url: str) -> str:
    path = urllib.parse.urlsplit(url).path.lower()
    ext = path.rpartition(".")[2] if "." in path.rpartition("/")[2] else ""
    return "" if ext == "pcm16" else _AUDIO_FORMATS.get(ext, "")


def _mono(planes: np.ndarray) -> np.ndarray:
    """(channels, n) planar samples -> (n,), the channels' mean."""
    return planes[0] if planes.shape[0] == 1 else planes.mean(axis=0, dtype=np.float32)


def _decode_into_numpy(img: ImageFile.ImageFile) -> np.ndarray | None:
    """Decode an RGB image's pixels into a numpy buffer of shape (height,
    width, 4) (Pillow keeps RGB as four bytes a pixel), returned; None when
    the image is not RGB or Pillow would not decode into it, and then the
    image is decoded (or left to decode) as Pillow does.

    Why: Pillow allocates an image's memory zeroed and holding the GIL
    (10 ms and more for 16 megapixels, all of it lost to the event loop);
    numpy's is neither zeroed nor touched until the decoder, which runs
    without the GIL, writes it.  Pillow maps file memory the same way
    (``ImageFile.load``'s mmap path: ``Image.core.map_buffer``).
    """
    if img.mode != "RGB":
        return None
    width, height = img.size
    buf = np.empty((height, width, 4), np.uint8)
    try:
        core = Image.core.map_buffer(buf, img.size, "raw", 0, ("RGB", 0, 1))
        img.im = core
    except Exception:  # a Pillow without it: its own allocation
        return None
    img.load()
    return buf if img.im is core else None


def _pixels(img: Image.Image) -> np.ndarray:
    """An RGB image's pixels as a (height, width, 3) uint8 array.

    Copied a band of rows (about 1 MiB) at a time: ``np.asarray`` of the
    whole image goes through ``tobytes``, which holds the GIL for the whole
    copy (10 ms and more for a large image, all of it lost to the event
    loop); a band's copy is short, and the bands together are faster.
    """
    width, height = img.size
    out = np.empty((height, width, 3), np.uint8)
    rows = max(1, 2**20 // (3 * width))
    for top in range(0, height, rows):
        bottom = min(height, top + rows)
        out[top:bottom] = np.asarray(img.crop((0, top, width, bottom)))
    return out


def _to_rgb(img: Image.Image) -> Image.Image:
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        # Transparent pixels show white, as a viewer shows them (a plain
        # convert would make them whatever colour they hide, often black).
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if img.mode != "RGB":
        return img.convert("RGB")
    img.load()
    return img


__all__ = ["MEDIA_PIPELINE", "PCM16_RATE", "DecodedMedia", "MediaDecoder"]
