"""Image generation's bytes, as a pure function of its requests' events.

Owns ``whole``: the images of every member of the call (``n`` > 1 is a
group), as base64 files or, for ``response_format: "url"``, as URLs of
``GET /v1/files/{digest}`` (the chunks' blobs; the base URL recorded at
admission).  Images are never streamed.

Does not own the dispatch over APIs nor the entry points
(``omnix.http.render``).
"""

from __future__ import annotations

from msgspec import UNSET

from omnix.events.options import ImageOptions
from omnix.http.common.rendering import Rendered, b64, encode, json_head
from omnix.http.common.summary import Summary
from omnix.http.images.protocol import ImageData, ImagesResponse


def whole(members: list[Summary], opts: ImageOptions) -> Rendered:
    """The images of finished members (``opts``: the first's)."""
    if opts.response_format == "url":
        # The files are the chunks' blobs, served by GET /v1/files/{digest};
        # the base URL was recorded at admission (from the request's Host).
        data = [ImageData(url=opts.files_url + d) for s in members for d in s.image_digests]
    else:
        data = [ImageData(b64_json=b64(img)) for s in members for img in s.images]
    rids = [s.request_id for s in members]
    body = ImagesResponse(
        created=members[0].created,
        data=data,
        request_ids=rids,
        output_format=opts.output_format or UNSET,
    )
    return Rendered(json_head(200, rids), encode(body))
