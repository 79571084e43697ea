"""Where a resumed stream starts: ``GET /v1/requests/{id}/stream``.

Owns: checking that a request's response can be streamed again (it was
streamed; the ``Last-Event-ID`` a client sends names an SSE event of that
response) and finding the point after that event, by rendering the
request's events up to it again.  Rendering is a pure function of the log
(``omnix.http.render``), so the renderer left there holds exactly the state the
original one had when it wrote that event: what it renders next is the
rest of the same bytes.

Does not own the live loop that sends the rest (``live.py``), nor any
byte of the response (``omnix.http.render``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from omnix.events.options import SpeechOptions, group_of
from omnix.events.types import Admitted, Rejected
from omnix.front import OmniProtocol
from omnix.http.common.rendering import parse_event_id
from omnix.http.core.errors import ApiError
from omnix.http.render import StreamRenderer


@dataclass
class ResumePoint:
    """A renderer fed up to the resume point, the bytes it rendered after
    that point (from the same log event), and the log position to tail
    from for the rest."""

    renderer: StreamRenderer
    rest: bytes
    next_pos: int


#: An SSE event id as the server writes them (``rendering.event_ids``).
_EVENT_ID = re.compile(r"^[0-9]{1,18}(\.[0-9]{1,4})?$")


def _bad_id(rid: str, last: str, why: str, status: int = 409) -> ApiError:
    """400 for what is not an event id at all; 409 for an id that is not
    one of this response's (it depends on the request, not on the form)."""
    return ApiError(
        status,
        f"Last-Event-ID {last!r} {why} of request {rid}'s response: send the id: of the last "
        "SSE event received from it, or no Last-Event-ID to get the response from its start.",
        param="Last-Event-ID",
        code="invalid_value" if status == 400 else "unknown_event_id",
    )


async def resume_point(omni: OmniProtocol, rid: str, last: str | None) -> ResumePoint:
    """The point after SSE event ``last`` of ``rid``'s streamed response
    (from its start when ``last`` is None).  Raises ``ApiError``: 400 when
    ``last`` is not an event id; 409 when the response was not streamed,
    or ``last`` is not one of its event ids."""
    rs = omni.state(rid)
    assert rs is not None, "the route checks the request is known"
    target = None
    if last is not None:
        target = parse_event_id(last) if _EVENT_ID.match(last) else None
        if target is None:
            raise _bad_id(rid, last, "is not an event id (a log position, or POS.N)", 400)
        if target[0] > rs.last_pos:
            raise _bad_id(rid, last, "is past the last event")
    renderer = StreamRenderer(omni.blobs)
    first = True
    async for ev in omni.events(rid, max(rs.admitted_pos, 0)):
        if first:
            first = False
            if isinstance(ev, (Admitted, Rejected)):
                _check_streamed(rid, ev, last)
        if target is not None and ev.pos > target[0]:
            break
        pieces = renderer.feed_ids(ev)
        if target is None:
            return ResumePoint(renderer, b"".join(p for _, p in pieces), ev.pos + 1)
        if ev.pos == target[0]:
            ids = [i for i, _ in pieces]
            want = str(target[0]) if target[1] == 0 else f"{target[0]}.{target[1]}"
            if want not in ids:
                break
            at = ids.index(want)
            return ResumePoint(renderer, b"".join(p for _, p in pieces[at + 1 :]), ev.pos + 1)
    if last is None:  # pragma: no cover - a known request has an admission
        raise ApiError(500, f"request {rid} has no events in the log", code="internal_error")
    raise _bad_id(rid, last, "is not an event")


def _check_streamed(rid: str, ev: Admitted | Rejected, last: str | None) -> None:
    opts = ev.spec.response
    if opts is None or not opts.stream:
        batch = ""
        group = group_of(opts)
        if group is not None and group.size > 1:
            batch = " (it is one conversation of a batch, and batches are never streamed)"
        raise ApiError(
            409,
            f"request {rid} was not streamed{batch}: there is no stream to resume. Its response "
            f"was sent whole; GET /v1/requests/{rid} gives its state and /trace its events.",
            param="id",
            code="not_streamed",
        )
    if last is not None and isinstance(opts, SpeechOptions) and opts.stream_format == "audio":
        raise ApiError(
            409,
            f"request {rid} streams raw audio, which carries no event ids: send no "
            "Last-Event-ID to get the whole stream again, or ask for stream_format 'sse'.",
            param="Last-Event-ID",
            code="invalid_value",
        )
