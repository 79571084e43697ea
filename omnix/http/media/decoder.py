"""Decoding a request's media parts, once, at admission.

Owns ``MediaDecoder``: for one pipeline, every part of a request checked
on the event loop (``locate.Locator``), the remote ones fetched
(``fetch.py``), then each decoded in a thread pool (``image.py``,
``sound.py``, after ``b64.py``), the parts in request order; each failure
the 400 naming the first part that fails, before anything is admitted.

Does not own where the decoded arrays go (``parts.py`` references them
for the request's ``MediaPart``s; ``Omni.submit_group`` stores them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from omnix.http.common.fields import MediaContentPart
from omnix.http.media.b64 import b64decode
from omnix.http.media.common import (
    AUDIO_MEDIA_TYPES,
    DecodedMedia,
    FilePart,
    Source,
    bad,
    too_big,
)
from omnix.http.media.fetch import fetch_all
from omnix.http.media.image import decode_image, decode_mask
from omnix.http.media.locate import Locator
from omnix.http.media.sound import decode_audio, from_extension
from omnix.http.media.video import check_video
from omnix.pipelines.config import MediaLimits


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
        self.locator = Locator(limits, allowed_domains, pipeline)
        self.fetch_timeout_s = fetch_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="media")

    @property
    def allowed_domains(self) -> frozenset[str]:
        return self.locator.allowed_domains

    async def decode(self, parts: Sequence[tuple[str, MediaContentPart]]) -> list[DecodedMedia]:
        """Check, fetch and decode ``parts`` (``(json path, part)`` in
        request order); the decoded parts in the same order.  Raises
        ``ApiError`` (400) for the first part, in order, that fails."""
        if not parts:
            return []
        self.locator.check_kinds(parts)
        sources = [self.locator.locate(param, part) for param, part in parts]
        remote = [s for s in sources if s.url]
        fetched: dict[str, tuple[bytes, str]] = {}
        if remote:
            got = await fetch_all(self.locator, remote, self.fetch_timeout_s)
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
            out.extend(r)
        return out

    def decode_sync(self, param: str, part: MediaContentPart) -> DecodedMedia:
        """One inline part (``data:`` URL or ``input_audio``), checked and
        decoded on the calling thread.  Remote parts need ``decode``."""
        self.locator.check_kinds([(param, part)])
        source = self.locator.locate(param, part)
        if source.url:
            raise ValueError(f"{param} is a remote URL: decode() fetches it")
        return self._decode_source(source, None)[0]

    async def decode_files(self, files: Sequence[FilePart]) -> list[DecodedMedia]:
        """Uploaded files (a form's, ``(param, kind, bytes)``), checked
        against the limits and decoded in the pool, in order: ``image``
        as RGB, ``mask`` as repaint weights.  The kinds the pipeline takes
        and how many are the route's to check."""
        loop = asyncio.get_running_loop()
        futures = [loop.run_in_executor(self._pool, self._decode_file, f) for f in files]
        results = await asyncio.gather(*futures, return_exceptions=True)
        out: list[DecodedMedia] = []
        for r in results:
            if isinstance(r, BaseException):
                raise r
            out.append(r)
        return out

    def _decode_file(self, part: FilePart) -> DecodedMedia:
        limits = self.limits
        param, data = part.param, part.data
        if limits is None:  # pragma: no cover - the route checks it first
            raise bad(param, f"{param}: this pipeline takes no media.", "unsupported_input")
        if len(data) > limits.max_part_bytes:
            raise too_big(param, len(data), limits.max_part_bytes)
        if not data:
            raise bad(param, f"{param} is empty: send an image file.")
        if part.kind == "mask":
            array = decode_mask(param, data, limits)
        else:
            array = decode_image(param, data, limits)
        array.flags.writeable = False
        return DecodedMedia(param=param, kind=part.kind, array=array, source_bytes=len(data))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _decode_source(
        self, source: Source, fetched: tuple[bytes, str] | None
    ) -> list[DecodedMedia]:
        """The part decoded: one array, or for a video with a sound track
        two (the file, then the track as ``param + TRACK``)."""
        param = source.param
        hint = source.hint
        if fetched is not None:
            data, content_type = fetched
            media_type = content_type.partition(";")[0].strip().lower()
            if source.kind == "audio":
                hint = AUDIO_MEDIA_TYPES.get(media_type, "") or from_extension(source.url)
        else:
            data = b64decode(param, source.b64, source.start)
        limits = self.limits
        assert limits is not None  # check_kinds refused every part otherwise
        if len(data) > limits.max_part_bytes:
            raise too_big(param, len(data), limits.max_part_bytes)
        if not data:
            raise bad(param, f"{param} holds no data.")
        if source.kind == "video":
            return _video(param, data, limits)
        if source.kind == "image":
            array = decode_image(param, data, limits)
            rate = 0
        else:
            array = decode_audio(param, data, hint, source.rate, limits)
            rate = limits.sample_rate
        array.flags.writeable = False
        return [
            DecodedMedia(
                param=param, kind=source.kind, array=array, rate=rate, source_bytes=len(data)
            )
        ]


#: A video's sound track is decoded under its part's name and this suffix.
TRACK = "#audio"


def _video(param: str, data: bytes, limits: MediaLimits) -> list[DecodedMedia]:
    checked = check_video(param, data, limits)
    checked.file.flags.writeable = False
    out = [
        DecodedMedia(
            param=param,
            kind="video",
            array=checked.file,
            fps=limits.video_fps,
            frames=limits.max_video_frames,
            source_bytes=len(data),
        )
    ]
    if checked.track is not None:
        checked.track.flags.writeable = False
        out.append(
            DecodedMedia(
                param=param + TRACK,
                kind="audio",
                array=checked.track,
                rate=limits.sample_rate,
                in_video=True,
                source_bytes=0,
            )
        )
    return out
