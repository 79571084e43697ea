"""The cheap checks of media parts, on the event loop: no decoding.

Owns ``Locator``: for one pipeline's ``MediaLimits``, the kinds of part it
takes (audio, image, video) and how many of each, and where each part's bytes are (``Source``): the base64 of a
``data:`` URL or ``input_audio`` (its size checked from its length, before
decoding; a raw ``pcm16`` rate a data URL declares), or an ``http(s)`` URL
of an allowed host (``check_host``: exact host names; never ``file://``, a
local path or another scheme).

Does not own fetching (``fetch.py``) nor decoding (``decoder.py``).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from typing import Final

from omnix.events.types import MediaKind
from omnix.http.common.fields import (
    AudioUrlPart,
    ImageUrlPart,
    InputAudioPart,
    MediaContentPart,
    VideoUrlPart,
)
from omnix.http.media.common import (
    ACCEPTED_AUDIO,
    AUDIO_FORMATS,
    AUDIO_MEDIA_TYPES,
    MEDIA_PIPELINE,
    PCM16_RATE,
    Source,
    a_kind,
    bad,
    shown,
    too_big,
)
from omnix.pipelines.config import MediaLimits

_MAX_URL_CHARS: Final = 8192


class Locator:
    """The checks of one pipeline's media parts that need no decoding.
    ``limits`` None: the pipeline takes text only."""

    def __init__(
        self, limits: MediaLimits | None, allowed_domains: frozenset[str], pipeline: str
    ) -> None:
        self.limits = limits
        self.allowed_domains = frozenset(d.lower().rstrip(".") for d in allowed_domains)
        self.pipeline = pipeline

    def check_kinds(self, parts: Sequence[tuple[str, MediaContentPart]]) -> None:
        counts = {"audio": 0, "image": 0, "video": 0}
        for param, part in parts:
            kind = kind_of(part)
            limits = self.limits
            name = f"pipeline '{self.pipeline}'" if self.pipeline else "this pipeline"
            if limits is None:
                raise bad(
                    param,
                    f"{param} is {a_kind(kind)} part, but {name} takes text input only. Send text "
                    f"parts only, or use a pipeline that takes audio, image and video input (the "
                    f"built-in {MEDIA_PIPELINE} does).",
                    "unsupported_input",
                )
            takes = {"audio": limits.audio, "image": limits.image, "video": limits.video}
            if not takes[kind]:
                ok = [k for k, on in takes.items() if on]
                raise bad(
                    param,
                    f"{param} is {a_kind(kind)} part, but {name} does not take {kind} input "
                    f"(it takes text{''.join(' and ' + k for k in ok)}). Remove the part.",
                    "unsupported_input",
                )
            counts[kind] += 1
            most = {
                "audio": limits.max_audio_parts,
                "image": limits.max_image_parts,
                "video": limits.max_video_parts,
            }[kind]
            if counts[kind] > most:
                raise bad(
                    param,
                    f"{param} is {kind} part {counts[kind]} of this request, but {name} takes "
                    f"at most {most} {kind} part{'s' if most != 1 else ''} per request. Send "
                    "fewer, or split them over several requests.",
                    "too_many_media_parts",
                )

    def locate(self, param: str, part: MediaContentPart) -> Source:
        assert self.limits is not None  # _check_kinds ran
        if isinstance(part, InputAudioPart):
            data = part.input_audio.data
            fmt = part.input_audio.format.lower()
            if data.startswith("data:"):
                return self._data_url(param, "audio", data, declared=AUDIO_FORMATS.get(fmt, ""))
            if fmt not in AUDIO_FORMATS:
                raise bad(
                    param,
                    f"{param}: input_audio.format {part.input_audio.format!r} is not an audio "
                    f"format this server decodes ({ACCEPTED_AUDIO}). Convert the clip to "
                    "wav, mp3 or flac.",
                    "unsupported_media_format",
                )
            self._check_b64_size(param, data, 0)
            return Source(param=param, kind="audio", b64=data, hint=AUDIO_FORMATS[fmt])
        if isinstance(part, ImageUrlPart):
            return self._url(param, "image", part.image_url.url)
        if isinstance(part, VideoUrlPart):
            return self._url(param, "video", part.video_url.url)
        assert isinstance(part, AudioUrlPart)
        return self._url(param, "audio", part.audio_url.url)

    def _url(self, param: str, kind: MediaKind, url: str) -> Source:
        if url[:5].lower() == "data:":
            return self._data_url(param, kind, url)
        example = {
            "image": "data:image/png;base64,...",
            "video": "data:video/mp4;base64,...",
        }.get(kind, "data:audio/wav;base64,...")
        inline = f"send the bytes inline as a data: URL ({example})"
        if len(url) > _MAX_URL_CHARS:
            raise bad(
                param,
                f"{param}: the URL is {len(url)} characters long; URLs of media are at most "
                f"{_MAX_URL_CHARS}. For media inline, {inline}.",
                "invalid_media_url",
            )
        scheme, _, _ = url.partition(":")
        scheme = scheme.lower()
        if scheme == "file" or "://" not in url:
            raise bad(
                param,
                f"{param}: {shown(url)} is not a data: or http(s) URL, and this server never "
                f"reads local files; {inline}.",
                "invalid_media_url",
            )
        if scheme not in ("http", "https"):
            raise bad(
                param,
                f"{param}: {scheme}:// URLs are not fetched; use an http(s) URL of an allowed "
                f"host or {inline}.",
                "invalid_media_url",
            )
        self.check_host(param, url, inline)
        return Source(param=param, kind=kind, url=url)

    def check_host(self, param: str, url: str, inline: str) -> None:
        try:
            split = urllib.parse.urlsplit(url)
            host = (split.hostname or "").rstrip(".")
            split.port  # noqa: B018 (raises on a malformed port)
        except ValueError as exc:
            raise bad(
                param, f"{param}: {shown(url)} is not a valid URL ({exc}).", "invalid_media_url"
            ) from None
        if split.scheme.lower() not in ("http", "https") or not host:
            raise bad(
                param, f"{param}: {shown(url)} is not a valid http(s) URL.", "invalid_media_url"
            )
        if not self.allowed_domains:
            raise bad(
                param,
                f"{param}: this server fetches no remote media (no allowed media domains are "
                f"configured), so {host} is refused; {inline}.",
                "media_domain_not_allowed",
            )
        if host not in self.allowed_domains:
            raise bad(
                param,
                f"{param}: host {host} is not among the domains this server fetches media from "
                f"({', '.join(sorted(self.allowed_domains))}); {inline}.",
                "media_domain_not_allowed",
            )

    def _data_url(self, param: str, kind: MediaKind, url: str, declared: str = "") -> Source:
        # The header is short; never scan a 13 MB payload for the comma.
        comma = url.find(",", 0, 512)
        if comma < 0:
            raise bad(
                param,
                f"{param}: the data: URL has no ',' before its data; write it as "
                f"data:<media type>;base64,<data>.",
                "invalid_media_url",
            )
        tokens = [t.strip() for t in url[5:comma].split(";")]
        media_type = tokens[0].lower()
        if tokens[-1].lower() != "base64":
            raise bad(
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
                raise bad(
                    param,
                    f"{param}: an image_url part holds {media_type} data; send images as "
                    "image/* (PNG, JPEG, WebP, GIF, BMP) and audio as input_audio or audio_url.",
                    "unsupported_media_format",
                )
        elif kind == "video":
            if (
                media_type
                and not media_type.startswith("video/")
                and media_type != "application/octet-stream"
            ):
                raise bad(
                    param,
                    f"{param}: a video_url part holds {media_type} data; send videos as "
                    "video/* (MP4, WebM, QuickTime, Matroska).",
                    "unsupported_media_format",
                )
        elif media_type:
            if media_type not in AUDIO_MEDIA_TYPES and media_type != "application/octet-stream":
                raise bad(
                    param,
                    f"{param}: {media_type} is not an audio type this server decodes "
                    f"({ACCEPTED_AUDIO}; e.g. data:audio/wav;base64,...).",
                    "unsupported_media_format",
                )
            hint = AUDIO_MEDIA_TYPES.get(media_type, declared)
            for token in tokens[1:-1]:
                name, _, value = token.partition("=")
                if name.strip().lower() == "rate" and hint == "pcm16":
                    if not value.strip().isdigit() or not 1000 <= int(value) <= 384_000:
                        raise bad(
                            param,
                            f"{param}: rate={value} in the data: URL is not a sample rate in Hz "
                            "(1000-384000).",
                            "invalid_media_url",
                        )
                    rate = int(value)
        self._check_b64_size(param, url, comma + 1)
        return Source(param=param, kind=kind, b64=url, start=comma + 1, hint=hint, rate=rate)

    def _check_b64_size(self, param: str, text: str, start: int) -> None:
        assert self.limits is not None
        chars = len(text) - start
        pad = 2 if text.endswith("==") else 1 if text.endswith("=") else 0
        size = chars // 4 * 3 + max(0, chars % 4 - 1) - pad
        if size > self.limits.max_part_bytes:
            raise too_big(param, size, self.limits.max_part_bytes)
        if size <= 0:
            raise bad(param, f"{param} holds no data (the base64 text is empty).")


def kind_of(part: MediaContentPart) -> MediaKind:
    """What a content part holds."""
    if isinstance(part, ImageUrlPart):
        return "image"
    if isinstance(part, VideoUrlPart):
        return "video"
    return "audio"
