"""Regenerate the bytes a client received, from a trace.

Owns: ``client_bytes`` / ``client_response``: pick a request's events (and
its batch siblings') out of a trace and hand them to the HTTP layer's pure
renderer, ``omnix.http.render`` (``render_stream`` / ``render_response``),
which is the same function the live handlers stream through.

Does not own rendering: if the renderer changes its output for a recorded
request, that is a change to the HTTP API's bytes, and this module is how
you find out.
"""

from __future__ import annotations

from omnix.events.options import DuplexOptions, RealtimeOptions, group_of
from omnix.events.types import Admitted, Event, Rejected, RequestEvent
from omnix.http import render
from omnix.http.realtime.duplex.render import DuplexStream
from omnix.http.realtime.render import ResponseStream
from omnix.trace import Trace


def pick_request(trace: Trace, request_id: str | None) -> str:
    if request_id is not None:
        if request_id not in trace.fold().requests:
            raise KeyError(
                f"request {request_id!r} is not in {trace.source} "
                f"(requests: {', '.join(trace.request_ids)})"
            )
        return request_id
    if len(trace.targets) == 1:
        return trace.targets[0]
    raise KeyError(
        f"{trace.source} holds several requests ({', '.join(trace.targets or trace.request_ids)}); "
        "say which with --request ID"
    )


def response_events(trace: Trace, request_id: str) -> list[Event]:
    """The request's events, plus those of the other members of its batch
    (a batched HTTP request is several omnix requests with one response)."""
    group = ""
    specs: dict[str, str] = {}
    for ev in trace.events:
        if type(ev) is Admitted or type(ev) is Rejected:
            member = group_of(ev.spec.response)
            g = member.id if member is not None else ""
            specs[ev.request_id] = g
            if ev.request_id == request_id:
                group = g
    members = {request_id} | ({rid for rid, g in specs.items() if g == group} if group else set())
    return [ev for ev in trace.events if isinstance(ev, RequestEvent) and ev.request_id in members]


def client_bytes(trace: Trace, request_id: str | None = None) -> bytes:
    """The response body the client received (the SSE stream for a streamed
    request), byte for byte; for a ``/v1/realtime`` response (or a
    full-duplex session), the server events it rendered to, one WebSocket
    message a line (a duplex session's own events, not rendered from the
    log, are not among them)."""
    rid = pick_request(trace, request_id)
    events = response_events(trace, rid)
    first = events[0] if events else None
    if isinstance(first, Admitted) and isinstance(first.spec.response, RealtimeOptions):
        stream = ResponseStream(trace.blobs)
        return b"".join(frame + b"\n" for ev in events for frame in stream.feed(ev))
    if isinstance(first, Admitted) and isinstance(first.spec.response, DuplexOptions):
        duplex = DuplexStream(trace.blobs)
        return b"".join(frame + b"\n" for ev in events for frame in duplex.feed(ev))
    return b"".join(render.render_stream(events, trace.blobs))


def client_response(trace: Trace, request_id: str | None = None) -> render.Rendered:
    """Status, headers and body (the request must have ended in the trace)."""
    rid = pick_request(trace, request_id)
    return render.render_response(response_events(trace, rid), trace.blobs)
