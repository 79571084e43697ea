"""Image generation's and image edits' bytes, as a pure function of their
requests' events.

Owns ``whole``: the images of every member of the call (``n`` > 1 is a
group), as base64 files or, for ``response_format: "url"``, as URLs of
``GET /v1/files/{digest}`` (the chunks' blobs; the base URL recorded at
admission); and ``ImageStream``, a request streamed as OpenAI streams
images: one ``image_generation.partial_image`` (``image_edit.partial_image``
for an edit) per ``Progress`` event that carries a partial image, then
``image_generation.completed`` (``image_edit.completed``) with the final
image once the request finished; a request that fails or is cancelled
mid-stream ends with a ``{"type": "error"}`` event.  No ``[DONE]``, as
OpenAI's image streams; every SSE event has an ``id:``.

Does not own the dispatch over APIs nor the entry points
(``omnix.http.render``).
"""

from __future__ import annotations

from msgspec import UNSET

from omnix.events.blobs import BlobStore
from omnix.events.options import ImageOptions
from omnix.events.types import Admitted, Cancelled, Chunk, Failed, Finished, Progress
from omnix.http.common.rendering import Rendered, b64, encode, json_head, sse, typed_sse_error
from omnix.http.common.summary import RequestSummary
from omnix.http.images.protocol import (
    ImageData,
    ImagesResponse,
    ImageStreamEvent,
    ImageStreamUsage,
)


def whole(members: list[RequestSummary], opts: ImageOptions) -> Rendered:
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
        size=(opts.size or UNSET) if opts.edit else UNSET,
    )
    return Rendered(json_head(200, rids), encode(body))


def stream_ids(opts: ImageOptions) -> bool:
    return True


class ImageStream:
    """One request's image stream (partial images, then the image)."""

    aborted = False

    def __init__(self, s: RequestSummary, opts: ImageOptions, blobs: BlobStore) -> None:
        self.s = s
        self.opts = opts
        self.blobs = blobs
        self.kind = "image_edit" if opts.edit else "image_generation"
        self.partials = 0
        self.image: bytes | None = None

    def _event(
        self,
        kind: str,
        data: bytes,
        index: int | None = None,
        usage: ImageStreamUsage | None = None,
    ) -> bytes:
        opts = self.opts
        return sse(
            ImageStreamEvent(
                type=f"{self.kind}.{kind}",
                b64_json=b64(data),
                created_at=self.s.created,
                size=opts.size or "auto",
                quality="auto",
                background="opaque",
                output_format=opts.output_format or "png",
                partial_image_index=index,
                usage=usage,
            )
        )

    def admitted(self, ev: Admitted) -> list[bytes]:
        return []

    def progress(self, ev: Progress) -> list[bytes]:
        if ev.blob is None or ev.stage != self.opts.image_stage:
            return []
        index = self.partials
        self.partials += 1
        return [self._event("partial_image", self.blobs.get(ev.blob), index=index)]

    def chunk(self, ev: Chunk) -> list[bytes]:
        if ev.stage == self.opts.image_stage and ev.modality == "image":
            self.image = self.s.chunk_image(ev)
        return []

    def finished(self, ev: Finished) -> list[bytes]:
        if self.image is None:
            return []
        return [self._event("completed", self.image, usage=ImageStreamUsage())]

    def ended(self, ev: Failed | Cancelled) -> list[bytes]:
        return [typed_sse_error(ev)]
