"""``/v1/videos``: video generation as jobs, as OpenAI's and vLLM-Omni's
routes answer it.  The handlers, their table rows, their descriptions.

Owns: ``POST /v1/videos`` (the multipart form read, the served pipeline
checked to make video, the ``input_reference`` image decoded as the first
frame, planned by ``plan.video_plan``, admitted, and answered at once
with the queued ``Video``), ``GET /v1/videos`` (the jobs this server
holds, newest first: ``limit``, ``after``, ``order``), ``GET
/v1/videos/{id}`` (the job as its events show it), ``DELETE
/v1/videos/{id}`` (cancelled when in flight, then released: its events,
blobs and file go, ``Released(reason="deleted")``), ``GET
/v1/videos/{id}/content`` (the MP4 the engine wrote, its blob; with
``variant=thumbnail`` its first frame as a PNG).  Each answer about a job
in flight carries ``openai-poll-after-ms``, which the openai client's
``create_and_poll`` waits between polls.  A job *is* a request: its id is
the request id, its progress the video stage's ``Progress`` events.

Does not own the plan (``plan.py``) nor the ``Video`` object (``render.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import msgspec
from aiohttp import web

from omnix.engines.media_files import mp4_thumbnail
from omnix.events.options import API_VIDEOS, VideoOptions
from omnix.events.types import Admitted, Event, Rejected
from omnix.http.common import doc
from omnix.http.common import form as common_form
from omnix.http.common.plan import PlanContext
from omnix.http.common.summary import RequestSummary
from omnix.http.core.body import traceparent
from omnix.http.core.errors import ApiError, ErrorBody
from omnix.http.core.respond import whole_response
from omnix.http.core.route import DocContext, Route, Undescribed
from omnix.http.core.server import Server
from omnix.http.core.submit import admit
from omnix.http.media.common import FilePart
from omnix.http.media.parts import decode_files
from omnix.http.render import render_response
from omnix.http.videos import render
from omnix.http.videos.plan import video_plan
from omnix.http.videos.protocol import Video, VideoDeleted, VideoForm, VideoList
from omnix.pipelines.config import DiffusersArgs

REFERENCE: Final = "input_reference"
#: How long a client waits between polls of a job in flight.
POLL_AFTER_MS: Final = "250"
DEFAULT_LIMIT: Final = 20
MAX_LIMIT: Final = 100
_HINT = (
    "send multipart/form-data with a prompt field (curl -F prompt=... [-F "
    "input_reference=@first.png]; the openai client's videos.create does this)"
)
_SPEC: Final = common_form.FormSpec(
    route="POST /v1/videos",
    hint=_HINT,
    texts=frozenset(VideoForm.__struct_fields__),
    files=frozenset({REFERENCE}),
    unsupported={
        "remix_video_id": "omnix does not remix videos; send a new prompt.",
        "character_id": "omit it.",
    },
)


def _json(body: msgspec.Struct, status: int = 200, poll: bool = False) -> web.Response:
    headers = {"openai-poll-after-ms": POLL_AFTER_MS} if poll else None
    return web.Response(
        body=msgspec.json.encode(body),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def check_pipeline(served: PlanContext) -> DiffusersArgs:
    p = served.pipeline
    stage = served.output_stage("video")
    args = p.stage(stage).engine if stage else None
    if not isinstance(args, DiffusersArgs):
        raise ApiError(
            400,
            f"pipeline {p.name!r} makes no video ({', '.join(p.outputs) or 'nothing'}): serve "
            "one that does (omnix serve --pipeline tiny-video).",
            param="model",
            code="unsupported_modality",
        )
    return args


async def create(server: Server, request: web.Request) -> web.StreamResponse:
    form = await common_form.read_form(request, _SPEC)
    body = common_form.form_struct(form.texts, VideoForm)
    served = server.served
    served.check_model(body.model)
    check_pipeline(served)
    reference = None
    uploads = form.files.get(REFERENCE, [])
    if uploads:
        media = served.pipeline.input_media
        model = served.diffusion_model(served.output_stage("video"))
        if media is None or not media.image or (model is not None and not model.image_to_video):
            raise ApiError(
                400,
                f"pipeline {served.model!r} makes video from text only: it takes no "
                "input_reference image. Omit it.",
                param=REFERENCE,
                code="unsupported_input",
            )
        parts, decoded = await decode_files(
            server.media, [FilePart(REFERENCE, "image", uploads[0].data)]
        )
        reference = (parts[REFERENCE], decoded[0])
    plan = video_plan(body, served, reference=reference, traceparent=traceparent(request))
    rejected = await admit(server, plan)
    blobs = server.omni.blobs
    if rejected is not None:
        return whole_response(render_response(rejected, blobs))
    (adm,) = server.omni.log.events_for(plan.request_ids[0])[:1]
    assert isinstance(adm, Admitted)
    s = RequestSummary(blobs)
    s.admitted(adm)
    opts = adm.spec.response
    assert isinstance(opts, VideoOptions)
    # The bytes a replay renders for the request (render.whole).
    resp = whole_response(render.whole(s, opts))
    resp.headers["openai-poll-after-ms"] = POLL_AFTER_MS
    return resp


def _job(server: Server, vid: str) -> tuple[list[Event], VideoOptions]:
    """The job's events and options; 404 when the server holds no such job."""
    events = server.omni.log.events_for(vid) if server.omni.state(vid) is not None else []
    first = events[0] if events else None
    if isinstance(first, Admitted | Rejected) and isinstance(first.spec.response, VideoOptions):
        return events, first.spec.response
    gone = server.omni.request_status(vid) == "released"
    raise ApiError(
        404,
        f"No video {vid!r} on this server"
        + (": it was deleted, or its retention window passed." if gone else "."),
        param="video_id",
        code="video_not_found",
    )


def _retain_s(server: Server) -> float | None:
    retention = server.omni.retention
    return retention.policy.window_s if retention is not None else None


def _video(server: Server, vid: str) -> tuple[Video, list[Event]]:
    events, opts = _job(server, vid)
    f = render.fold(events, server.omni.blobs)
    return render.video(f, opts, retain_s=_retain_s(server)), events


async def retrieve(server: Server, request: web.Request) -> web.StreamResponse:
    video, _ = _video(server, request.match_info["video_id"])
    return _json(video, poll=video.status in ("queued", "in_progress"))


async def list_videos(server: Server, request: web.Request) -> web.StreamResponse:
    q = request.query
    raw = q.get("limit", str(DEFAULT_LIMIT))
    if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_LIMIT):
        raise ApiError(400, f"limit {raw[:64]!r} is not a number from 1 to {MAX_LIMIT}.",
                       param="limit", code="invalid_value")  # fmt: skip
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, f"order {order[:64]!r} is not asc or desc.", param="order",
                       code="invalid_value")  # fmt: skip
    omni = server.omni
    held = omni.log.state.requests.values()
    ranked = sorted(held, key=lambda rs: rs.admitted_pos, reverse=order == "desc")
    after = q.get("after")
    if after is not None:
        ids = [rs.request_id for rs in ranked]
        if after not in ids:
            raise ApiError(400, f"after {after[:64]!r} is not a video this server holds.",
                           param="after", code="invalid_value")  # fmt: skip
        ranked = ranked[ids.index(after) + 1 :]
    limit = int(raw)
    found: list[Video] = []
    more = False
    for rs in ranked:
        ev = omni.log.get(rs.admitted_pos)
        if not (isinstance(ev, Admitted | Rejected) and ev.spec.api == API_VIDEOS):
            continue
        if len(found) == limit:
            more = True
            break
        found.append(_video(server, rs.request_id)[0])
    body = VideoList(
        data=found,
        first_id=found[0].id if found else None,
        last_id=found[-1].id if found else None,
        has_more=more,
    )
    return _json(body)


async def delete(server: Server, request: web.Request) -> web.StreamResponse:
    vid = request.match_info["video_id"]
    _job(server, vid)
    omni = server.omni
    if omni.cancel(vid, "client"):
        # The stage drops the job at its next step; the request ends once
        # its abort is acknowledged (or the abort timeout passes).
        async with asyncio.timeout(omni.pipeline.abort_timeout_s + 5.0):
            async for _ in omni.events(vid):
                pass
    omni.delete(vid)
    return _json(VideoDeleted(id=vid))


async def content(server: Server, request: web.Request) -> web.StreamResponse:
    vid = request.match_info["video_id"]
    variant = request.query.get("variant", "video")
    if variant not in ("video", "thumbnail"):
        raise ApiError(
            400,
            f"variant {variant[:64]!r}: omnix serves the video and its thumbnail (its first "
            "frame); there is no spritesheet.",
            param="variant",
            code="unsupported_value",
        )
    video, events = _video(server, vid)
    f = render.fold(events, server.omni.blobs)
    ref = f.s.video
    if video.status != "completed" or ref is None:
        raise ApiError(
            409,
            f"Video {vid} is {video.status}: its content exists once it is completed "
            "(GET /v1/videos/{id} says when).",
            param="video_id",
            code="video_not_ready",
        )
    data = server.omni.blobs.get(ref)
    if variant == "thumbnail":
        data = await asyncio.to_thread(mp4_thumbnail, data)
        return web.Response(body=data, content_type="image/png")
    return web.Response(body=data, content_type="video/mp4", headers={"ETag": f'"{ref.digest}"'})


def _makes_video(ctx: DocContext) -> bool:
    return "video" in ctx.pipeline.outputs


_ID = {"name": "video_id", "in": "path", "required": True, "schema": {"type": "string"}}
_NOT_FOUND = {"404": doc.json_body(ErrorBody, "No such video (or deleted, or expired)")}


def _list_op(ctx: DocContext) -> dict[str, Any] | None:
    if not _makes_video(ctx):
        return None
    return doc.get(
        "The video jobs this server holds",
        doc.json_body(VideoList, "Video objects, newest first by default"),
        params=[
            {
                "name": "limit",
                "in": "query",
                "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
            },
            {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}},
            {"name": "after", "in": "query", "schema": {"type": "string"}},
        ],
        errors={
            "400": doc.json_body(ErrorBody, "A limit, order or after this route does not take")
        },
    )


def _get_op(ctx: DocContext) -> dict[str, Any] | None:
    if not _makes_video(ctx):
        return None
    return doc.get("A video job", doc.json_body(Video, "The job"), params=[_ID], errors=_NOT_FOUND)


def _delete_op(ctx: DocContext) -> dict[str, Any] | None:
    if not _makes_video(ctx):
        return None
    return doc.get("Delete a video job (cancelled first when in flight)",
                   doc.json_body(VideoDeleted, "Deleted"), params=[_ID], errors=_NOT_FOUND)  # fmt: skip


def _content_op(ctx: DocContext) -> dict[str, Any] | None:
    if not _makes_video(ctx):
        return None
    ok = {
        "description": "The MP4, or with variant=thumbnail its first frame as a PNG",
        "content": {"video/mp4": {}, "image/png": {}},
    }
    return doc.get(
        "A completed video's file",
        ok,
        params=[
            _ID,
            {"name": "variant", "in": "query", "schema": {"enum": ["video", "thumbnail"]}},
        ],
        errors={**_NOT_FOUND, "409": doc.json_body(ErrorBody, "Not completed")},
    )


CREATE = Route(
    "POST",
    "/v1/videos",
    create,
    Undescribed("a multipart form, which the document's JSON schemas do not describe"),
    submits="form",
)
LIST = Route("GET", "/v1/videos", list_videos, _list_op, types=(VideoList, Video))
RETRIEVE = Route("GET", "/v1/videos/{video_id}", retrieve, _get_op, types=(Video,))
DELETE = Route("DELETE", "/v1/videos/{video_id}", delete, _delete_op, types=(VideoDeleted,))
CONTENT = Route("GET", "/v1/videos/{video_id}/content", content, _content_op)
