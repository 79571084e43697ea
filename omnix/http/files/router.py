"""``GET /v1/files/{digest}``: a generated image file, by its content digest.

Owns the handler: the file a ``response_format: "url"`` image answer
points to, read from the blob store.  Only a well-formed digest reaches
the store (no client path touches the filesystem), and only image files
(PNG, JPEG, WebP, by their magic bytes) are served: other blobs (decoded
inputs, audio) are 404, as is a digest not (or no longer: retention
released it) stored.  The document leaves the route out: a client only
ever follows a URL it was given, and no valid example exists before an
image is generated.
"""

from __future__ import annotations

import asyncio
import re

from aiohttp import web

from omnix.events.blobs import BlobMissing
from omnix.http.core.errors import ApiError
from omnix.http.core.route import Route, Undescribed
from omnix.http.core.server import Server

#: A blob's digest as the route takes it (BlobRef.digest: blake2b-128,
#: lowercase hex); nothing else reaches the blob store.
_DIGEST = re.compile(r"^[0-9a-f]{32}$")


def _image_type(data: bytes) -> str | None:
    """The media type of an image file omnix serves (PNG, JPEG, WebP), by
    its magic bytes; None for any other blob (decoded media, audio...)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


async def file(server: Server, request: web.Request) -> web.Response:
    digest = request.match_info["digest"]
    if not _DIGEST.match(digest):
        raise ApiError(
            400,
            f"{digest[:80]!r} is not a file id: file ids are 32 lowercase hex digits, as "
            "the url of an image response gives them.",
            param="digest",
            code="invalid_value",
        )
    try:
        data = await asyncio.to_thread(server.omni.blobs.get, digest)
    except BlobMissing:
        data = b""
    ctype = _image_type(data)
    if ctype is None:
        raise ApiError(
            404,
            f"No file {digest} on this server: it was never generated here, or its "
            "request's retention has ended and released it.",
            param="digest",
            code="file_not_found",
            type="not_found_error",
        )
    return web.Response(
        body=data,
        headers={
            "Content-Type": ctype,
            "ETag": f'"{digest}"',
            "Cache-Control": "private, max-age=3600, immutable",
        },
    )


FILE = Route(
    "GET",
    "/v1/files/{digest}",
    file,
    Undescribed(
        "content-addressed: a client only follows a url it was given, and no valid example "
        "exists before an image is generated (a schema-driven probe would see only 404s)"
    ),
)
