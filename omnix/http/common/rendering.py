"""Rendering's common ground: what every API's response is made of.

Owns: ``RENDER_VERSION``; ``Head`` (status and headers) and ``Rendered``
(a whole response); SSE framing (``sse``, ``SSE_DONE``, the event ids a
resumed stream names: ``event_ids``, ``parse_event_id``, ``with_id``);
the errors of requests refused, failed or cancelled (``terminal_error``,
as a whole body, an SSE ``{"error": ...}`` event or a typed
``{"type": "error", ...}`` one); ``ApiStream``, what a streamed API's
renderer answers for each kind of event; and ``StreamTail``, how an
OpenAI chunk stream (chat, completions) ends.

Nothing here reads a clock, a random source or the server's config: a
response is a pure function of its request's events (``omnix.http.render``
has the entry points).  Does not own any API's bodies (each room's
``render.py``).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Final, Protocol

import msgspec

from omnix.events.options import Group
from omnix.events.types import (
    Admitted,
    Cancelled,
    Chunk,
    Failed,
    Finished,
    Progress,
    Rejected,
    RequestEvent,
    TerminalEvent,
)
from omnix.http.common.fields import Usage
from omnix.http.common.summary import RequestSummary
from omnix.http.core.errors import error_body, error_type

#: Bumped whenever the bytes rendered for the same events change; recorded
#: in each request's options so a trace says which renderer produced it,
#: and requests recorded by an older version render as they did then.
#: 2: SSE events carry ``id:`` (``event_ids``).  3: chat streams carry
#: ``id:`` only when the client asked for a resumable stream
#: (``ChatOptions.resumable``): vLLM's benchmark client and other
#: line-naive SSE parsers take every event for ``data: <json>``, as
#: OpenAI's are.
RENDER_VERSION: Final = 3

#: Seconds a client should wait before retrying a refused request.
RETRY_AFTER: Final = {
    "overloaded": "1",
    "not_ready": "5",
    "shutting_down": "30",
    "unavailable": "2",
}

#: How long the audio of a chat response is said to be valid (informational:
#: omnix keeps audio in its blob store, not behind an audio id).
AUDIO_EXPIRES_S: Final = 24 * 3600

SSE_DONE: Final = b"data: [DONE]\n\n"
SSE_HEADERS: Final = (("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"))


class Head(msgspec.Struct, frozen=True):
    """Status and headers of a response (aiohttp adds Date, Server, framing).

    ``streamed`` heads are sent before the body is known (chunked transfer);
    the others go with a complete body.  Whether the connection is cut
    instead of the body ending cleanly is not the head's to say: that is
    ``Rendered.aborted`` / ``StreamRenderer.aborted`` (a raw audio stream
    whose request failed must not look complete to its client).
    """

    status: int
    headers: tuple[tuple[str, str], ...]
    streamed: bool = False

    def header(self, name: str) -> str | None:
        low = name.lower()
        for k, v in self.headers:
            if k.lower() == low:
                return v
        return None


class Rendered(msgspec.Struct, frozen=True):
    head: Head
    body: bytes
    #: True when the connection was cut after ``body`` (a failed raw stream).
    aborted: bool = False


_enc = msgspec.json.Encoder()


def encode(obj: Any) -> bytes:
    return _enc.encode(obj)


def sse(obj: Any) -> bytes:
    return b"data: " + _enc.encode(obj) + b"\n\n"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def created(ev: RequestEvent) -> int:
    return ev.ts_ns // 1_000_000_000


def group_id(group: Group | None) -> str:
    """The id of the call a member belongs to, "" when it is alone."""
    return group.id if group is not None else ""


def json_head(status: int, rids: Sequence[str], extra: tuple[tuple[str, str], ...] = ()) -> Head:
    return Head(
        status, (("Content-Type", "application/json"), ("X-Request-Id", ",".join(rids)), *extra)
    )


def sse_head(rid: str) -> Head:
    return Head(200, (*SSE_HEADERS, ("X-Request-Id", rid)), streamed=True)


# --------------------------------------------------------------------------
# Errors of admitted-then-ended and refused requests
# --------------------------------------------------------------------------


def terminal_error(ev: TerminalEvent) -> tuple[int, bytes, tuple[tuple[str, str], ...]] | None:
    """(status, error body, extra headers) for a request that did not
    finish; None for ``Finished``."""
    rid = ev.request_id
    if isinstance(ev, Rejected):
        status = 429 if ev.reason == "overloaded" else 503
        msg = (
            f"request {rid} was not admitted ({ev.reason}): {ev.message or ev.reason}. "
            "Retry after the number of seconds in the Retry-After header."
        )
        return (
            status,
            error_body(msg, error_type(status), None, ev.reason),
            (("Retry-After", RETRY_AFTER.get(ev.reason, "1")),),
        )
    if isinstance(ev, Failed):
        status = {"stage_timeout": 504, "no_replica": 503, "shutdown": 503}.get(ev.reason, 500)
        where = f" on stage {ev.stage!r}" if ev.stage else ""
        detail = f": {ev.message}" if ev.message else ""
        msg = f"request {rid} failed{where} ({ev.reason}){detail}"
        return status, error_body(msg, error_type(status), None, ev.reason), ()
    if isinstance(ev, Cancelled):
        status, code, why = {
            "deadline": (504, "deadline_exceeded", "its deadline passed"),
            "shutdown": (503, "shutdown", "the server is shutting down; retry on another server"),
            "client": (409, "cancelled", f"POST /v1/requests/{rid}/cancel asked for it"),
            "disconnect": (499, "client_disconnected", "its client disconnected"),
            "interrupted": (409, "interrupted", "its realtime session's user spoke over it"),
        }[ev.reason]
        msg = f"request {rid} was cancelled: {why}"
        return status, error_body(msg, error_type(status), None, code), ()
    return None


def _error(ev: Failed | Cancelled) -> bytes:
    err = terminal_error(ev)
    assert err is not None  # only Finished has none
    return err[1]


def sse_error(ev: Failed | Cancelled) -> bytes:
    """OpenAI's chunk streams: ``data: {"error": {...}}``."""
    return b"data: " + _error(ev) + b"\n\n"


def typed_sse_error(ev: Failed | Cancelled) -> bytes:
    """Typed event streams (speech, transcriptions):
    ``data: {"type": "error", "error": {...}}``."""
    return b'data: {"type":"error",' + _error(ev)[1:] + b"\n\n"


# --------------------------------------------------------------------------
# SSE event ids
# --------------------------------------------------------------------------


def event_ids(pos: int, n: int) -> list[str]:
    """The ``id:`` of the ``n`` SSE events rendered from the log event at
    ``pos``: the position itself for the first, ``pos.1``, ``pos.2``... for
    the others (only a terminal event renders several), so that every SSE
    event a client may have last received names one point to resume after.
    ``data: [DONE]`` carries none: resuming after the event before it sends
    it again."""
    return [str(pos) if k == 0 else f"{pos}.{k}" for k in range(n)]


def parse_event_id(value: str) -> tuple[int, int] | None:
    """``"57"`` -> (57, 0), ``"57.2"`` -> (57, 2); None when not an id."""
    head, dot, sub = value.strip().partition(".")
    if not head.isdigit() or (dot and not sub.isdigit()):
        return None
    return int(head), int(sub) if dot else 0


def with_id(event_id: str, piece: bytes) -> bytes:
    return b"id: " + event_id.encode("ascii") + b"\n" + piece


# --------------------------------------------------------------------------
# Streams
# --------------------------------------------------------------------------


class ApiStream(Protocol):
    """One API's streamed response of one request: the body bytes each kind
    of event renders to (the events that render none are not shown).
    ``aborted``: the connection must be cut rather than the body ended (a
    raw stream whose request failed)."""

    aborted: bool

    def admitted(self, ev: Admitted) -> list[bytes]: ...

    def chunk(self, ev: Chunk) -> list[bytes]: ...

    def progress(self, ev: Progress) -> list[bytes]: ...

    def finished(self, ev: Finished) -> list[bytes]: ...

    def ended(self, ev: Failed | Cancelled) -> list[bytes]: ...


class StreamTail:
    """How an OpenAI chunk stream (chat, completions) ends: after the finish
    chunk, the ``include_usage`` chunk (no choices, the totals) and
    ``[DONE]`` (a member of an n > 1 group leaves both to the group); a
    failed or cancelled request with its error event and ``[DONE]``."""

    aborted = False

    def __init__(self, s: RequestSummary, *, usage: bool, member: bool) -> None:
        self.s = s
        #: stream_options.include_usage
        self.usage = usage
        #: one choice of an n > 1 group's stream: no usage chunk or
        #: ``[DONE]`` of its own
        self.member = member

    def usage_chunk(self, usage: Usage, created: int) -> bytes:
        """The last chunk of an ``include_usage`` stream: no choices, the totals."""
        raise NotImplementedError

    def admitted(self, ev: Admitted) -> list[bytes]:
        raise NotImplementedError

    def chunk(self, ev: Chunk) -> list[bytes]:
        raise NotImplementedError

    def progress(self, ev: Progress) -> list[bytes]:
        return []  # text streams show no steps

    def finished(self, ev: Finished) -> list[bytes]:
        raise NotImplementedError

    def closing(self, out: list[bytes]) -> list[bytes]:
        if self.member:
            return out
        if self.usage:
            p, c = self.s.usage()
            out.append(self.usage_chunk(totals(p, c), self.s.created))
        out.append(SSE_DONE)
        return out

    def ended(self, ev: Failed | Cancelled) -> list[bytes]:
        return [sse_error(ev), SSE_DONE]


def totals(prompt: int, completion: int) -> Usage:
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )
