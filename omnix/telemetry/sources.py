"""Where the telemetry projection reads back what it did not keep.

Owns: ``EventSource`` (a request's final state and an event by position),
``LogSource`` over a live log and ``BufferSource``, a private fold that
keeps per live request only the events a span reads back.  Does not own
the projection itself (``projection.py``) nor building spans (``spans.py``).
"""

from __future__ import annotations

from typing import Protocol, assert_never

import msgspec

from omnix.events.log import EventLog
from omnix.events.reducer import Fold, IllegalTransition, RequestState, reduce_request
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
    RequestEvent,
    Routed,
    Scaled,
    SessionChanged,
    StageFailed,
    StageFinished,
    StageStarted,
    WorkerJoined,
    WorkerLost,
)


class EventSource(Protocol):
    """Where the projection reads back what it did not keep."""

    def request(self, request_id: str) -> RequestState | None: ...

    def event(self, request_id: str, pos: int) -> Event | None: ...


class LogSource:
    """A live log: its fold has every request's final state, its storage
    every event by position."""

    __slots__ = ("log",)

    def __init__(self, log: EventLog) -> None:
        self.log = log

    def request(self, request_id: str) -> RequestState | None:
        rs = self.log.state.requests.get(request_id)
        if rs is None:
            # A log that evicts ended requests from its fold: refold this
            # one from its own events (stages marked lost by a WorkerLost are
            # then seen as unfinished).
            try:
                for ev in self.log.events_for(request_id):
                    if isinstance(ev, RequestEvent):  # all are: the index is by request
                        rs = reduce_request(rs, ev)
            except (IllegalTransition, IndexError):
                return None
        return rs

    def event(self, request_id: str, pos: int) -> Event | None:
        if pos < 0:
            return None
        try:
            return self.log.get(pos)
        except (IndexError, KeyError):
            return None


class BufferSource:
    """Standalone: a private fold plus, per live request, the few events a
    span reads back.  Everything about a request is released at its end."""

    __slots__ = ("fold", "kept", "lost", "released")

    def __init__(self) -> None:
        self.fold = Fold()
        self.kept: dict[str, dict[int, Event]] = {}
        # worker id -> its latest WorkerLost (a Failed's cause); one per worker.
        self.lost: dict[str, WorkerLost] = {}
        self.released = 0  # ended requests dropped from the fold

    def apply(self, ev: Event) -> Event:
        if ev.pos < 0:
            ev = msgspec.structs.replace(ev, pos=self.fold.next_pos)
        self.fold.apply(ev)  # raises IllegalTransition; nothing kept then
        match ev:
            case Chunk():  # first: most events are chunks
                if ev.index == 0:  # a stage's first: a span event
                    self.kept.setdefault(ev.request_id, {})[ev.pos] = ev
            # What a span or a counter reads back by position (see
            # ``SpanWriter``): the admission, the cancel, stage failures,
            # deadlines and the terminal event.
            case (
                Admitted()
                | CancelRequested()
                | StageFailed()
                | DeadlineExpired()
                | Finished()
                | Cancelled()
                | Failed()
                | Rejected()
            ):
                self.kept.setdefault(ev.request_id, {})[ev.pos] = ev
            case WorkerLost():  # a Failed's cause
                self.lost[ev.worker_id] = ev
            case (
                Routed()
                | StageStarted()
                | Progress()
                | StageFinished()
                | WorkerJoined()
                | Released()
                | SessionChanged()
                | Scaled()
                | InputAppended()
            ):
                pass  # nothing read back: the fold's state has what they tell
            case _:
                assert_never(ev)
        return ev

    def request(self, request_id: str) -> RequestState | None:
        return self.fold.requests.get(request_id)

    def event(self, request_id: str, pos: int) -> Event | None:
        ev = self.kept.get(request_id, {}).get(pos)
        if ev is None:
            for lost in self.lost.values():
                if lost.pos == pos:
                    return lost
        return ev

    def release(self, request_id: str) -> None:
        if self.fold.requests.pop(request_id, None) is not None:
            self.released += 1
        self.fold.audio_samples.pop(request_id, None)
        self.kept.pop(request_id, None)
