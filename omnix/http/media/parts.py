"""A request's media parts, decoded and referenced for its plan.

Owns ``decode_parts``: every media part of a body decoded
(``MediaDecoder``), each array referenced by its content digest (off the
event loop) as the ``MediaPart`` the request's messages hold, and the
arrays kept for admission to store (a refused request stores nothing).
"""

from __future__ import annotations

import asyncio
from typing import Final

from omnix.events.blobs import array_ref
from omnix.events.types import MediaKind, MediaPart
from omnix.http.common.fields import MediaContentPart
from omnix.http.common.plan import DecodedBlob, Media
from omnix.http.media.common import DecodedMedia, FilePart
from omnix.http.media.decoder import MediaDecoder

#: How a decoded media array is tagged in the blob store.
MEDIA_TYPES: Final[dict[MediaKind, str]] = {
    "audio": "audio/pcm-f32",
    "image": "image/rgb8",
    "mask": "image/mask8",
    "video": "video/file",
    "speaker": "audio/speaker-f32",
}


async def decode_parts(
    decoder: MediaDecoder, parts: list[tuple[str, MediaContentPart]]
) -> tuple[Media, tuple[DecodedBlob, ...]]:
    """The decoded parts by JSON path, and their arrays with references."""
    return await referenced(await decoder.decode(parts))


async def decode_files(
    decoder: MediaDecoder, files: list[FilePart]
) -> tuple[Media, tuple[DecodedBlob, ...]]:
    """A form's uploaded files decoded, by field name (``image[1]``)."""
    return await referenced(await decoder.decode_files(files))


async def referenced(decoded: list[DecodedMedia]) -> tuple[Media, tuple[DecodedBlob, ...]]:
    """Each decoded array referenced by its content digest (off the loop)."""
    refs = await asyncio.to_thread(
        lambda: [array_ref(d.array, MEDIA_TYPES[d.kind]) for d in decoded]
    )
    media = {
        d.param: MediaPart(
            kind=d.kind, blob=ref, rate=d.rate, fps=d.fps, frames=d.frames, in_video=d.in_video
        )
        for d, ref in zip(decoded, refs, strict=True)
    }
    blobs = tuple(DecodedBlob(ref=ref, array=d.array) for d, ref in zip(decoded, refs, strict=True))
    return media, blobs
