"""Responses as a pure function of the log: the entry points.

Owns: turning a request's events (and the blobs they reference) into the
exact bytes the HTTP API sent for it, whatever its API: the dispatch, on
the typed response options its admission recorded (``RequestSpec.response``),
to each room's renderer (``omnix.http.chat.render``, ``completions``,
``audio``, ``images``), and the entry points the live handlers *and*
replay use:

    render_response(events, blobs) -> Rendered      # head + whole body
    render_stream(events, blobs) -> Iterator[bytes] # the body, piece by piece
    StreamRenderer(blobs).feed(ev) -> list[bytes]   # incremental (live)
    GroupStreamRenderer(blobs).feed(ev)             # the stream of n > 1 choices

``events`` are one request's events in log order (other events are
ignored), or for a batched request (``messages`` as a list of
conversations, images with ``n`` > 1) the events of all its members.
``b"".join(render_stream(...)) == render_response(...).body`` always, and
both equal what a client that stayed connected received.

SSE events carry ``id:``, the log position of the event that rendered them
(``common.rendering.event_ids``), where the response's options say so
(``StreamRenderer.ids``), so that rendering the events up to an id again
leaves a renderer that goes on with the rest of the same bytes
(``core.resume``).

Determinism: ids derive from the request id, ``created`` from the Admitted
event's ``ts_ns``, the model from ``spec.model``, usage from StageFinished
counts, audio from chunk blobs through bitexact encoders.  Does not own
reading the log, waiting, or sockets (``core.live`` feeds events in as the
log tail yields them).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import assert_never

from omnix.events.blobs import BlobStore
from omnix.events.options import (
    API_CHAT,
    API_COMPLETIONS,
    API_IMAGES,
    API_SPEECH,
    API_TRANSCRIPTION,
    ChatOptions,
    CompletionOptions,
    DuplexOptions,
    ImageOptions,
    RealtimeOptions,
    SpeechOptions,
    TranscriptionOptions,
    VideoOptions,
)
from omnix.events.types import (
    Admitted,
    Cancelled,
    CancelRequested,
    Chunk,
    DeadlineExpired,
    Event,
    Failed,
    Finished,
    InputAppended,
    Progress,
    Rejected,
    Released,
    Routed,
    Scaled,
    SessionChanged,
    StageFailed,
    StageFinished,
    StageStarted,
    WorkerJoined,
    WorkerLost,
)
from omnix.http.audio import speech_render, transcription_render
from omnix.http.chat import render as chat_render
from omnix.http.common.rendering import (
    RENDER_VERSION,
    RETRY_AFTER,
    SSE_DONE,
    ApiStream,
    Head,
    Rendered,
    StreamTail,
    event_ids,
    json_head,
    parse_event_id,
    sse_head,
    terminal_error,
    with_id,
)
from omnix.http.common.summary import RequestSummary
from omnix.http.completions import render as completions_render
from omnix.http.core.groups import (
    GroupStream,
    batched,
    group_refused,
    group_streamed,
    in_log_order,
    members_in_order,
    split,
)
from omnix.http.images import render as images_render
from omnix.http.videos import render as videos_render

__all__ = [
    "API_CHAT",
    "API_COMPLETIONS",
    "API_IMAGES",
    "API_SPEECH",
    "API_TRANSCRIPTION",
    "RENDER_VERSION",
    "RETRY_AFTER",
    "GroupStreamRenderer",
    "Head",
    "Rendered",
    "StreamRenderer",
    "parse_event_id",
    "render_response",
    "render_stream",
    "whole_response",
]


def whole_response(members: list[RequestSummary]) -> Rendered:
    """A complete response for finished (or refused/failed) members."""
    rids = [s.request_id for s in members]
    for s in members:
        if s.terminal is None:
            raise ValueError(
                f"request {s.request_id} has no terminal event: cannot render its response yet"
            )
        err = terminal_error(s.terminal)
        if err is not None:
            status, body, extra = err
            return Rendered(json_head(status, rids, extra), body)
    opts = members[0].response
    match opts:
        case ChatOptions():
            return chat_render.whole(members, opts)
        case CompletionOptions():
            return completions_render.whole(members, opts)
        case ImageOptions():
            return images_render.whole(members, opts)
        case TranscriptionOptions():
            return transcription_render.whole(members[0], opts)
        case SpeechOptions():
            return speech_render.whole(members[0])
        case VideoOptions():
            return videos_render.whole(members[0], opts)
        case RealtimeOptions() | DuplexOptions():
            raise ValueError(
                f"request {rids[0]}: a realtime response has no HTTP form "
                "(omnix.http.realtime.render and .duplex.render render its server events)"
            )
        case None:
            spec = members[0].spec
            api = spec.api if spec is not None else ""
            raise ValueError(f"request {rids[0]}: no renderer for api {api!r}")
        case _:
            assert_never(opts)


def _open(s: RequestSummary, ev: Admitted, blobs: BlobStore) -> tuple[ApiStream, Head, bool]:
    """The stream of a request admitted with a streamed response: its
    renderer, its head, and whether its SSE events carry ``id:``."""
    opts = ev.spec.response
    rid = ev.request_id
    match opts:
        case ChatOptions():
            return chat_render.ChatStream(s, opts), sse_head(rid), chat_render.stream_ids(opts)
        case CompletionOptions():
            stream = completions_render.CompletionStream(s, opts)
            return stream, sse_head(rid), completions_render.stream_ids(opts)
        case SpeechOptions():
            head = speech_render.stream_head(s, opts)
            return speech_render.SpeechStream(s, opts), head, speech_render.stream_ids(opts)
        case TranscriptionOptions():
            stream_ = transcription_render.TranscriptionStream(s, opts)
            return stream_, sse_head(rid), transcription_render.stream_ids(opts)
        case ImageOptions():
            stream__ = images_render.ImageStream(s, opts, blobs)
            return stream__, sse_head(rid), images_render.stream_ids(opts)
        case VideoOptions() | RealtimeOptions() | DuplexOptions() | None:
            raise ValueError(f"request {rid}: api {ev.spec.api!r} has no streamed HTTP form")
        case _:
            assert_never(opts)


class StreamRenderer:
    """Incremental rendering of one request: ``feed`` each of its events in
    log order; it returns the body bytes to send now.  ``head`` is set once
    known: at admission for a streamed response, at the terminal event for
    a whole one (whose body is then the one piece returned).  ``done`` after
    the terminal event; ``aborted`` when the connection must be cut.

    ``ids``: the response is SSE whose events carry ``id:`` (known at
    admission); ``feed_ids`` returns each piece with its id (None for
    ``[DONE]``, raw audio and whole bodies)."""

    def __init__(self, blobs: BlobStore) -> None:
        self.summary = RequestSummary(blobs)
        self.head: Head | None = None
        self.done = False
        self.aborted = False
        self.ids = False
        self._stream: ApiStream | None = None

    def feed(self, ev: Event) -> list[bytes]:
        return [piece for _, piece in self.feed_ids(ev)]

    def feed_ids(self, ev: Event) -> list[tuple[str | None, bytes]]:
        pieces = self._feed(ev)
        if not self.ids or not pieces:
            return [(None, p) for p in pieces]
        framed = [p for p in pieces if p != SSE_DONE]
        ids = iter(event_ids(ev.pos, len(framed)))
        out: list[tuple[str | None, bytes]] = []
        for p in pieces:
            if p == SSE_DONE:
                out.append((None, p))
            else:
                i = next(ids)
                out.append((i, with_id(i, p)))
        return out

    def _feed(self, ev: Event) -> list[bytes]:
        if self.done:
            return []
        s = self.summary
        stream = self._stream
        # Chunks are most of a request's events: one exact-type test first
        # (a ``match`` class pattern costs an isinstance check per case,
        # ~150 ns against a Struct class; see omnix/events/types.py).
        if type(ev) is Chunk:
            s.chunk(ev)
            return stream.chunk(ev) if stream is not None else []
        match ev:
            case Admitted():
                s.admitted(ev)
                response = ev.spec.response
                if response is None or not response.stream:
                    return []
                s.collect_media = False
                self._stream, self.head, self.ids = _open(s, ev, s.blobs)
                return self._stream.admitted(ev)
            case StageFinished():
                s.finished[ev.stage] = ev
                return []
            case Progress():
                s.progressed(ev)
                return stream.progress(ev) if stream is not None else []
            case Finished():
                s.terminal = ev
                return self._end(stream.finished(ev) if stream is not None else [])
            case Failed() | Cancelled():
                s.terminal = ev
                return self._end(stream.ended(ev) if stream is not None else [])
            case Rejected():
                s.admitted(ev)
                s.terminal = ev
                return self._end([])
            case (
                Chunk()
                | Routed()
                | StageStarted()
                | StageFailed()
                | CancelRequested()
                | DeadlineExpired()
                | WorkerJoined()
                | WorkerLost()
                | Released()
                | SessionChanged()
                | Scaled()
                | InputAppended()
            ):
                return []
            case _:
                assert_never(ev)

    def _end(self, out: list[bytes]) -> list[bytes]:
        self.done = True
        if self._stream is None:
            whole = whole_response([self.summary])
            self.head = whole.head
            return [whole.body]
        self.aborted = self._stream.aborted
        return out


def _member_stream(s: RequestSummary) -> StreamTail:
    opts = s.response
    match opts:
        case ChatOptions():
            return chat_render.ChatStream(s, opts, member=True)
        case CompletionOptions():
            return completions_render.CompletionStream(s, opts, member=True)
        case (
            SpeechOptions()
            | ImageOptions()
            | TranscriptionOptions()
            | VideoOptions()
            | RealtimeOptions()
            | DuplexOptions()
            | None
        ):
            raise ValueError(f"request {s.request_id}: no stream of n choices for its api")
        case _:
            assert_never(opts)


class GroupStreamRenderer:
    """``StreamRenderer``'s counterpart for an n > 1 chat or completions
    stream: ``feed`` the events of every member, in log order."""

    def __init__(self, blobs: BlobStore) -> None:
        self._g = GroupStream(blobs, _member_stream)

    @property
    def head(self) -> Head | None:
        return self._g.head

    @property
    def done(self) -> bool:
        return self._g.done

    def feed(self, ev: Event) -> list[bytes]:
        return self._g.feed(ev)


def render_response(events: Iterable[Event], blobs: BlobStore) -> Rendered:
    """The complete response (status, headers, body) the HTTP API sent for
    the request(s) these events belong to.  The events must reach each
    request's terminal event."""
    by_rid = split(events)
    if group_streamed(by_rid):
        g = GroupStreamRenderer(blobs)
        body = b"".join(piece for ev in in_log_order(by_rid) for piece in g.feed(ev))
        if group_refused(by_rid):
            return whole_response(members_in_order(by_rid, blobs))
        if not g.done or g.head is None:
            raise ValueError("the group's stream has not ended: cannot render its response yet")
        return Rendered(g.head, body)
    if len(by_rid) > 1 or batched(by_rid):
        return whole_response(members_in_order(by_rid, blobs))
    ((rid, evs),) = by_rid.items()
    r = StreamRenderer(blobs)
    body = b"".join(piece for ev in evs for piece in r.feed(ev))
    if not r.done or r.head is None:
        raise ValueError(f"request {rid} has no terminal event: cannot render its response yet")
    return Rendered(r.head, body, r.aborted)


def render_stream(events: Iterable[Event], blobs: BlobStore) -> Iterator[bytes]:
    """The body as the pieces the server wrote, in order (for a streamed
    response, one piece per SSE event or encoded audio piece; a whole
    response is one piece).  Stops early if the events stop early."""
    by_rid = split(events)
    if group_streamed(by_rid) and not group_refused(by_rid):
        g = GroupStreamRenderer(blobs)
        for ev in in_log_order(by_rid):
            yield from g.feed(ev)
        return
    if len(by_rid) > 1 or batched(by_rid):
        yield whole_response(members_in_order(by_rid, blobs)).body
        return
    (evs,) = by_rid.values()
    r = StreamRenderer(blobs)
    for ev in evs:
        yield from r.feed(ev)
