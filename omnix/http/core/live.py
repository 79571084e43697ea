"""The live response: admit a plan, tail the log, render, write.

Owns ``respond``: a planned call admitted (``submit.admit``), then its
response while its requests run: a stream (``stream``: one request's
events rendered as the log tail yields them, written once per burst), the
one stream of an n > 1 group (``_stream_group``), or a whole response once
every member ended (``_collect``).  A client that goes away mid-response
cancels its request(s): aiohttp cancels the handler when the connection
drops (``handler_cancellation=True``) or a write fails; a streamed
response's request gets the resume grace first (``readers.py``).
``stream`` also serves ``GET /v1/requests/{id}/stream``, from a resume
point.

Does not own the bytes (``omnix.http.render``), the writes
(``respond.py``) nor any route.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from omnix.events.types import RequestEvent
from omnix.http.common.plan import Plan
from omnix.http.core.respond import (
    FLUSH_BYTES,
    Stream,
    caught_up,
    durable,
    finish,
    open_response,
    whole_response,
)
from omnix.http.core.resume import ResumePoint
from omnix.http.core.server import Server
from omnix.http.core.submit import admit
from omnix.http.render import GroupStreamRenderer, StreamRenderer, render_response


async def respond(server: Server, request: web.Request, plan: Plan) -> web.StreamResponse:
    """Admit ``plan`` and answer with its response, live."""
    rejected = await admit(server, plan)
    if rejected is not None:
        return whole_response(render_response(rejected, server.omni.blobs))
    rids = plan.request_ids
    if plan.stream and len(rids) > 1:
        return await _stream_group(server, request, rids)
    if plan.stream:
        return await stream(server, request, rids[0], None)
    try:
        return await _collect(server, plan)
    except (asyncio.CancelledError, ConnectionResetError):
        server.readers.disconnected(rids)
        raise


async def _collect(server: Server, plan: Plan) -> web.StreamResponse:
    omni = server.omni
    rids = plan.request_ids
    events = []
    for rid in rids:
        async for ev in omni.events(rid):
            events.append(ev)
    states = [omni.state(rid) for rid in rids]
    if not all(rs is not None and rs.terminal for rs in states):
        raise server.not_accepting()  # the log closed under us: shutdown
    # An answer given must outlive a crash: what it says is acknowledged first.
    await durable(omni, max(ev.pos for ev in events))
    heavy = any(spec.outputs != ("text",) for _, spec in plan.specs)
    if heavy:  # encoding audio or images: keep the event loop free
        rendered = await asyncio.to_thread(render_response, events, omni.blobs)
    else:
        rendered = render_response(events, omni.blobs)
    return whole_response(rendered)


async def stream(
    server: Server, request: web.Request, rid: str, point: ResumePoint | None
) -> web.StreamResponse:
    """The streamed response of ``rid``, live to its end; from ``point``
    on when resuming (whose renderer has seen the events the client
    already has).  A dropped client detaches this reader."""
    readers = server.readers
    readers.attach(rid)
    dropped = True
    try:
        resp = await _stream_body(server, request, rid, point)
        dropped = False
        return resp
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except BaseException:
        dropped = False
        raise
    finally:
        readers.detach(rid, dropped)


async def _stream_body(
    server: Server, request: web.Request, rid: str, point: ResumePoint | None
) -> web.StreamResponse:
    omni = server.omni
    renderer = point.renderer if point is not None else StreamRenderer(omni.blobs)
    resp: web.StreamResponse | None = None
    # Pieces of a burst of events (the tail yields whatever is already in
    # the log without waiting) leave in one write: a send per SSE event
    # costs more than the rest of the stream under load.
    buf = bytearray(point.rest if point is not None else b"")
    start = point.next_pos if point is not None else 0
    if point is not None and point.renderer.head is not None:
        if not point.renderer.head.streamed:
            await durable(omni, start - 1)
        resp = await open_response(request, point.renderer.head, buf)
        if not isinstance(resp, Stream):
            return resp
        if buf and not renderer.done and caught_up(omni, rid, start - 1):
            await durable(omni, start - 1)
            await resp.write(bytes(buf))
            buf.clear()
    if renderer.done:
        await durable(omni, start - 1)
        return await _finish(server, request, resp, buf, not renderer.aborted)
    last = start - 1
    async for ev in omni.events(rid, start):
        last = ev.pos
        for piece in renderer.feed(ev):
            buf += piece
        if resp is None and renderer.head is not None:
            if not renderer.head.streamed:
                # The whole body leaves now: only once what it says is
                # acknowledged (a crash must not take back an answer given).
                await durable(omni, ev.pos)
            resp = await open_response(request, renderer.head, buf)
            if not isinstance(resp, Stream):
                return resp
        if renderer.done:
            break
        if resp is not None and buf and (len(buf) >= FLUSH_BYTES or caught_up(omni, rid, ev.pos)):
            await durable(omni, ev.pos)
            await resp.write(bytes(buf))
            buf.clear()
    await durable(omni, last)
    return await _finish(server, request, resp, buf, renderer.done and not renderer.aborted)


async def _finish(
    server: Server,
    request: web.Request,
    resp: web.StreamResponse | None,
    buf: bytearray,
    complete: bool,
) -> web.StreamResponse:
    if resp is None:
        raise server.not_accepting()
    return await finish(request, resp, buf, complete)


async def _stream_group(
    server: Server, request: web.Request, rids: tuple[str, ...]
) -> web.StreamResponse:
    """The one SSE response of an n > 1 group: every member's events, in
    log order (``render.GroupStreamRenderer``).  Not resumable.  A dropped
    client, or a member that failed, cancels the members still running."""
    omni = server.omni
    renderer = GroupStreamRenderer(omni.blobs)
    members = set(rids)
    rs = omni.state(rids[0])
    start = max(rs.admitted_pos, 0) if rs is not None else 0
    resp: web.StreamResponse | None = None
    buf = bytearray()
    last = start - 1
    try:
        async for ev in omni.log.tail(start):
            if not isinstance(ev, RequestEvent) or ev.request_id not in members:
                continue
            last = ev.pos
            for piece in renderer.feed(ev):
                buf += piece
            if resp is None and renderer.head is not None:
                resp = await open_response(request, renderer.head, buf)
            if renderer.done:
                break
            if resp is not None and buf and all(caught_up(omni, r, ev.pos) for r in rids):
                await durable(omni, ev.pos)
                await resp.write(bytes(buf))
                buf.clear()
        await durable(omni, last)
        # Not done: the log closed under us.
        resp = await _finish(server, request, resp, buf, renderer.done)
    except (asyncio.CancelledError, ConnectionResetError):
        server.readers.disconnected(rids)
        raise
    finally:
        server.readers.disconnected(tuple(r for r in rids if not _ended(server, r)))
    return resp


def _ended(server: Server, rid: str) -> bool:
    rs = server.omni.state(rid)
    return rs is None or rs.terminal
