"""omnix's routes about one request: its state, events, stream, cancel, trace.

Owns the handlers of ``/v1/requests/{id}`` and below: the request named
in the path must be held (404; 410 for one retention released), its
folded state as JSON, an SSE tail of its events (from the start or after
``Last-Event-ID``; ``?format=object``), its figures (TTFT, RTF, ...:
``figures.py``), its streamed response again (``core.resume`` finds where;
``core.live`` sends the rest), a cancel, and a replayable trace once it has
ended, or that trace as the page ``omnix replay --html`` writes; and their
OpenAPI operations.

Does not own the bytes of a streamed response (``omnix.http.render``).
"""

from __future__ import annotations

import re
from typing import Any, Final

from aiohttp import web

from omnix.events.types import Chunk
from omnix.http.common import doc
from omnix.http.core.errors import ApiError, ErrorBody
from omnix.http.core.live import stream
from omnix.http.core.respond import FLUSH_BYTES, Stream, caught_up, durable, json_response
from omnix.http.core.resume import resume_point
from omnix.http.core.route import DocContext, Route
from omnix.http.core.server import Server
from omnix.http.requests.figures import Figures, figures
from omnix.http.requests.protocol import CancelResult
from omnix.http.requests.views import event_object_sse, event_sse, state_json
from omnix.telemetry.setup import sample_rate_of
from omnix.trace import export_trace, read_trace
from omnix.traceview.html import render_html

#: A log position, as ``/events`` writes its ``id:``.
_POSITION: Final = re.compile(r"^[0-9]{1,18}$")
#: An SSE event id of a response (``common.rendering.event_ids``).
_EVENT_ID: Final = re.compile(r"^[0-9]{1,18}([.][0-9]{1,4})?$")


def known(server: Server, request: web.Request) -> str:
    """The id in the path, of a request this server holds: 404 for one it
    never had, 410 for one retention released."""
    rid = request.match_info["id"]
    omni = server.omni
    if omni.state(rid) is not None:
        return rid
    if omni.request_status(rid) == "released":
        raise ApiError(
            410,
            f"Request {rid!r} ended before this server's retention window and was "
            "released: its state, events and trace are no longer kept. To keep traces "
            "longer, start the server with a longer --retain (or a larger "
            "--retain-requests / --retain-bytes), or with --log-dir DIR --archive to "
            "keep released requests on disk for `omnix trace export`.",
            param="id",
            code="request_released",
            type="not_found_error",
            headers={"X-Request-Id": rid},
        )
    raise ApiError(
        404,
        f"No request {rid!r} on this server. Request ids come back in the X-Request-Id "
        "header and the request_ids field of responses.",
        param="id",
        code="request_not_found",
    )


def _last_event_id(request: web.Request, form: re.Pattern[str], what: str) -> str | None:
    """The ``Last-Event-ID`` header, else the ``last_event_id`` query
    parameter; None when neither is given; 400 when one given is not of
    ``form`` (an empty one included)."""
    for name, value in (
        ("Last-Event-ID", request.headers.get("Last-Event-ID")),
        ("last_event_id", request.query.get("last_event_id")),
    ):
        if value is not None and not form.match(value):
            raise ApiError(
                400,
                f"{name} {value!r} is not an event id ({what}): send the id: of the last "
                "event received, or none to start from the beginning.",
                param=name,
                code="invalid_value",
            )
    return request.headers.get("Last-Event-ID") or request.query.get("last_event_id")


async def state(server: Server, request: web.Request) -> web.Response:
    rid = known(server, request)
    rs = server.omni.state(rid)
    assert rs is not None
    return web.Response(
        body=state_json(rs), content_type="application/json", headers={"X-Request-Id": rid}
    )


async def events(server: Server, request: web.Request) -> web.StreamResponse:
    """SSE tail of one request's events, from the start or after the
    ``Last-Event-ID`` (a log position) a reconnecting client sends; ends
    after the terminal event.  ``?format=object`` for named fields."""
    rid = known(server, request)
    last = _last_event_id(request, _POSITION, "a log position: digits")
    start = 0 if last is None else int(last) + 1
    fmt = request.query.get("format", "array")
    if fmt not in ("array", "object"):
        raise ApiError(
            400, "format must be 'array' or 'object'.", param="format", code="invalid_value"
        )
    frame = event_object_sse if fmt == "object" else event_sse
    resp = Stream(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Request-Id": rid,
        }
    )
    await resp.prepare(request)
    omni = server.omni
    rs = omni.state(rid)
    buf = bytearray()
    if not (rs is not None and rs.terminal and start > rs.terminal_pos):
        async for ev in omni.events(rid, start):
            buf += frame(ev)
            if len(buf) >= FLUSH_BYTES or caught_up(omni, rid, ev.pos):
                await durable(omni, ev.pos)
                await resp.write(bytes(buf))
                buf.clear()
    await resp.write_eof(bytes(buf))
    return resp


async def request_figures(server: Server, request: web.Request) -> web.Response:
    """The request's figures from the times its events recorded, as far as
    the log holds it now."""
    rid = known(server, request)
    omni = server.omni
    rs = omni.state(rid)
    assert rs is not None
    samples = 0
    async for ev in omni.events(rid, 0):
        if type(ev) is Chunk and ev.modality == "audio" and ev.blob is not None and ev.blob.shape:
            samples += ev.blob.shape[0]
        if ev.pos >= rs.last_pos:
            break
    return json_response(
        figures(rs, samples, sample_rate_of(omni.pipeline)), headers={"X-Request-Id": rid}
    )


async def resume(server: Server, request: web.Request) -> web.StreamResponse:
    """The streamed response of a request, again: from its start, or
    after the ``Last-Event-ID`` (header or ``?last_event_id=``) of the
    last SSE event the client received; live to the request's end."""
    rid = known(server, request)
    last = _last_event_id(request, _EVENT_ID, "POS or POS.N")
    point = await resume_point(server.omni, rid, last)
    return await stream(server, request, rid, point)


async def cancel(server: Server, request: web.Request) -> web.Response:
    rid = known(server, request)
    asked = server.omni.cancel(rid, "client")
    rs = server.omni.state(rid)
    assert rs is not None
    return json_response(
        CancelResult(request_id=rid, cancel_requested=asked, status=rs.status),
        headers={"X-Request-Id": rid},
    )


def _ended_trace(server: Server, rid: str) -> bytes:
    """The trace of ``rid``, which must have ended (409 otherwise)."""
    omni = server.omni
    rs = omni.state(rid)
    if rs is not None and not rs.terminal:
        raise ApiError(
            409,
            f"request {rid} is still {rs.status}: download its trace once it has ended.",
            code="request_running",
        )
    # On the loop, not a thread: the log is appended to by this loop.
    return export_trace(omni.log, omni.blobs, omni.pipeline, [rid])


async def trace(server: Server, request: web.Request) -> web.Response:
    rid = known(server, request)
    data = _ended_trace(server, rid)
    return web.Response(
        body=data,
        content_type="application/octet-stream",
        headers={
            "Content-Disposition": f'attachment; filename="{rid}.omnixtrace"',
            "X-Request-Id": rid,
        },
    )


async def trace_html(server: Server, request: web.Request) -> web.Response:
    """The request's trace as the self-contained page ``omnix replay
    TRACE --html`` writes (inline CSS and SVG, no script)."""
    rid = known(server, request)
    page = render_html(read_trace(_ended_trace(server, rid)), requests=[rid])
    return web.Response(
        text=page,
        content_type="text/html",
        headers={
            "X-Request-Id": rid,
            "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
        },
    )


def _state_doc(ctx: DocContext) -> dict[str, Any]:
    return doc.get(
        "A request's state, folded from its events",
        {"description": "RequestState as a JSON object", "content": {"application/json": {}}},
        params=[doc.ID_PARAM],
        errors={"404": doc.NOT_FOUND},
    )


def _events_doc(ctx: DocContext) -> dict[str, Any]:
    return doc.get(
        "SSE tail of a request's events (resumable with Last-Event-ID)",
        {
            "description": "`id:` is the log position, `event:` the type tag, `data:` the event "
            "as msgspec JSON; ends after the terminal event",
            "content": {"text/event-stream": doc.sse()},
        },
        params=[
            doc.ID_PARAM,
            {"name": "Last-Event-ID", "in": "header", "schema": doc.POSITION},
            {"name": "last_event_id", "in": "query", "schema": doc.POSITION},
            {"name": "format", "in": "query", "schema": {"enum": ["array", "object"]}},
        ],
        errors={
            "400": doc.json_body(ErrorBody, "Last-Event-ID is not an event id"),
            "404": doc.NOT_FOUND,
        },
    )


def _figures_doc(ctx: DocContext) -> dict[str, Any]:
    return doc.get(
        "A request's figures (TTFT, time to first audio, RTF, tokens/s per stage) "
        "from the times its events recorded",
        doc.json_body(Figures, "Figures, in milliseconds from the admission"),
        params=[doc.ID_PARAM],
        errors={"404": doc.NOT_FOUND},
    )


def _stream_doc(ctx: DocContext) -> dict[str, Any]:
    return doc.get(
        "The request's streamed response again: whole, or the rest after Last-Event-ID",
        {
            "description": "The same bytes as the original response (chat or speech SSE, "
            "raw audio from the start), live to the request's end; after Last-Event-ID, "
            "what followed that SSE event",
            "content": {"text/event-stream": doc.sse(), "audio/wav": {}, "audio/pcm": {}},
        },
        params=[
            doc.ID_PARAM,
            {"name": "Last-Event-ID", "in": "header", "schema": doc.EVENT_ID},
            {"name": "last_event_id", "in": "query", "schema": doc.EVENT_ID},
        ],
        errors={
            "400": doc.json_body(ErrorBody, "Last-Event-ID is not an event id"),
            "404": doc.NOT_FOUND,
            "409": doc.json_body(
                ErrorBody,
                "The request was not streamed, or its response has no such event",
            ),
        },
    )


def _cancel_doc(ctx: DocContext) -> dict[str, Any]:
    return {
        "summary": "Cancel a request (every active stage is aborted)",
        "parameters": [doc.ID_PARAM],
        "responses": {
            "200": doc.json_body(CancelResult, "Cancel requested (or already ended)"),
            "403": doc.ERRORS["403"],
            "404": doc.NOT_FOUND,
        },
    }


def _trace_doc(ctx: DocContext) -> dict[str, Any]:
    return doc.get(
        "Download a replayable trace of the request",
        {"description": "Trace file", "content": {"application/octet-stream": {}}},
        params=[doc.ID_PARAM],
        errors={
            "404": doc.NOT_FOUND,
            "409": doc.json_body(ErrorBody, "Still running"),
            "501": doc.json_body(ErrorBody, "Not available"),
        },
    )


def _trace_html_doc(ctx: DocContext) -> dict[str, Any]:
    return doc.get(
        "The request's trace as one HTML page (what omnix replay --html writes)",
        {"description": "HTML page", "content": {"text/html": {}}},
        params=[doc.ID_PARAM],
        errors={"404": doc.NOT_FOUND, "409": doc.json_body(ErrorBody, "Still running")},
    )


STATE = Route("GET", "/v1/requests/{id}", state, _state_doc)
EVENTS = Route("GET", "/v1/requests/{id}/events", events, _events_doc)
FIGURES = Route("GET", "/v1/requests/{id}/figures", request_figures, _figures_doc, types=(Figures,))
STREAM = Route("GET", "/v1/requests/{id}/stream", resume, _stream_doc)
CANCEL = Route("POST", "/v1/requests/{id}/cancel", cancel, _cancel_doc, types=(CancelResult,))
TRACE = Route("GET", "/v1/requests/{id}/trace", trace, _trace_doc)
TRACE_HTML = Route("GET", "/v1/requests/{id}/trace.html", trace_html, _trace_html_doc)
