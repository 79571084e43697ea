"""Telemetry as a projection of the event log.

Owns: ``Projection``, which reads events in log order and turns them into
metric observations (``metrics.py``) and, when a tracer is configured, spans
(``spans.py``).  Nothing else in omnix records telemetry: the same
projection runs over a live log (``run``/``catch_up``) and over the events
of an old trace (``observe``), and gives the same result.

Does not own exporters or the process-wide setup (``setup.py``), nor any
state of its own beyond what a request needs until it ends.

How it stays cheap (``omnix bench telemetry``):
  * Live, it reads the log's storage in slices from its own position
    (``run``): never a listener on the append path (a no-op listener alone
    costs ~15% of append throughput), and per chunk only a type test and
    one field read.
  * It does not re-fold: request and stage timings come from the log's own
    fold (``log.state``) when the terminal event is read -- final by then,
    since nothing follows a terminal event -- and the few events a span
    needs (the admission, the cancel, first chunks) are read back by
    position.  Working state per live request is one audio sample count.
  * An ended request is a dozen list appends of raw integers on series it
    holds (``ended.py``); bucketing is done in bulk (``metrics.py``).
  * Spans are built only at the terminal event and only with a tracer.

Standalone (``observe``, for traces and tests) it folds privately and keeps
per request only the events a span reads back, released at the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Protocol, get_args

import msgspec

from omnix.events.log import EventLog
from omnix.events.reducer import (
    TERMINAL_STATUSES,
    Fold,
    IllegalTransition,
    RequestState,
    reduce_request,
)
from omnix.events.types import (
    EVENT_TYPES,
    Admitted,
    Cancelled,
    CancelReason,
    CancelRequested,
    Chunk,
    DeadlineExpired,
    Event,
    Failed,
    Finished,
    Rejected,
    RejectReason,
    RequestEvent,
    Routed,
    StageFailed,
    WorkerJoined,
    WorkerLost,
)
from omnix.telemetry.ended import EndedRequests
from omnix.telemetry.metrics import MetricSet
from omnix.telemetry.spans import SpanWriter

DEFAULT_SAMPLE_RATE = 24_000


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
                    rs = reduce_request(rs, ev)  # type: ignore[arg-type]
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


# Request events a span reads back by position (see ``SpanWriter``).
_KEEP = (Admitted, CancelRequested, StageFailed, DeadlineExpired)


class BufferSource:
    """Standalone: a private fold plus, per live request, the few events a
    span reads back.  Everything about a request is released at its end."""

    __slots__ = ("fold", "kept", "lost")

    def __init__(self) -> None:
        self.fold = Fold()
        self.kept: dict[str, dict[int, Event]] = {}
        # worker id -> its latest WorkerLost (a Failed's cause); one per worker.
        self.lost: dict[str, WorkerLost] = {}

    def apply(self, ev: Event) -> Event:
        if ev.pos < 0:
            ev = msgspec.structs.replace(ev, pos=self.fold.next_pos)
        self.fold.apply(ev)  # raises IllegalTransition; nothing kept then
        cls = type(ev)
        if cls in _KEEP or (cls is Chunk and ev.index == 0):  # type: ignore[union-attr]
            self.kept.setdefault(ev.request_id, {})[ev.pos] = ev  # type: ignore[union-attr]
        elif cls is WorkerLost:
            self.lost[ev.worker_id] = ev  # type: ignore[union-attr,assignment]
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
        self.fold.requests.pop(request_id, None)
        self.kept.pop(request_id, None)


class Projection:
    """Events in, observations and spans out.  See the module docstring."""

    #: bucket pending observations after this many ended requests (and
    #: before every collection)
    FOLD_EVERY = 1024

    def __init__(
        self,
        metrics: MetricSet,
        spans: SpanWriter | None = None,
        *,
        pipeline: str = "",
        sample_rate: int = DEFAULT_SAMPLE_RATE,
    ) -> None:
        self.metrics = metrics
        self.spans = spans
        self.pipeline = pipeline
        self.sample_rate = sample_rate
        #: next log position ``run``/``catch_up`` will read
        self.position = 0
        # class -> events read; every class present so increments need no test
        self._counts: dict[type, int] = dict.fromkeys(EVENT_TYPES, 0)
        # request id -> audio samples so far, for live requests only
        self._audio: dict[str, int] = {}
        # requests live when the projection attached mid-log (run(start>0))
        self._active_seed = 0
        # worker id -> stage, for replicas joined and not lost
        self._workers: dict[str, str] = {}
        self._stages_seen: dict[str, None] = {}
        self._own: BufferSource | None = None
        self._dropped = 0
        self._ended = EndedRequests(metrics, sample_rate)
        self._unfolded = 0
        self._last_pipeline = pipeline
        self._handlers: dict[type, Callable[[Any], None]] = {
            Rejected: self._on_rejected,
            Finished: self._on_terminal,
            Cancelled: self._on_cancelled,
            Failed: self._on_failed,
            WorkerJoined: self._on_worker_joined,
            WorkerLost: self._on_worker_lost,
        }
        self._source: LogSource | None = None
        # the source of the slice being consumed (handlers read it)
        self._src: EventSource = _NO_SOURCE
        self._wake: asyncio.Future[None] | None = None
        m = metrics
        self._c_rejected = m.sum("omnix.requests.rejected")
        self._c_cancelled = m.sum("omnix.requests.cancelled")
        self._c_failed = m.sum("omnix.requests.failed")
        m.sum("omnix.events").callback = self._event_points
        m.sum("omnix.requests.active").callback = self._active_points
        m.sum("omnix.workers.ready").callback = self._worker_points
        m.sum("omnix.telemetry.dropped").callback = self._dropped_points
        if pipeline:
            # Refusals and cancellations by every known reason start at 0, so
            # rate() has a series before the first one happens.
            for reason in get_args(RejectReason):
                self._c_rejected.get((pipeline, reason))
            for reason in get_args(CancelReason):
                self._c_cancelled.get((pipeline, reason))

    @property
    def requests_ended(self) -> int:
        c = self._counts
        return c[Finished] + c[Cancelled] + c[Failed] + c[Rejected]

    # -- feeding -----------------------------------------------------------
    def observe(self, ev: Event) -> None:
        """Standalone: one event in log order (a trace, a test)."""
        own = self._own
        if own is None:
            own = self._own = BufferSource()
        try:
            ev = own.apply(ev)
        except IllegalTransition:
            self._dropped += 1
            return
        self._consume((ev,), 1, own)

    def observe_many(self, events: Iterable[Event]) -> None:
        for ev in events:
            self.observe(ev)

    def catch_up(self, log: EventLog) -> int:
        """Read everything appended since the last call; return the count."""
        src = self._source
        if src is None or src.log is not log:
            src = self._source = LogSource(log)
        first = pos = self.position
        stop = log.next_pos
        while pos < stop:
            end = min(stop, pos + 4096)
            self._consume(log.read(pos, end), end - pos, src)
            self.position = pos = end
        return pos - first

    def flush(self) -> None:
        """Bucket pending observations now (collection does this itself)."""
        self.metrics.flush()

    async def run(
        self,
        log: EventLog,
        start: int | None = None,
        *,
        interval_s: float = 0.005,
        min_batch: int = 256,
    ) -> None:
        """Follow ``log`` from ``start`` (default: where it stopped) until it closes.

        The contract of ``log.tail(start)`` (the log's storage is the buffer;
        a slow reader costs only its position), read in slices rather than
        an async-generator step per event, which would cost more than all
        the other per-event work.  Idle, it waits on the log (one future,
        woken by the next append).  Woken with fewer than ``min_batch`` new
        events it lets up to ``interval_s`` of appends accumulate (a sparse
        log costs one wake-up per interval); with more it reads them at
        once, while they are still in the CPU's cache -- a slice read a few
        milliseconds late costs several times more per event.
        """
        if start is not None:
            self.position = start
            if start > 0:
                self._seed_from(log, start)
        while True:
            self.catch_up(log)
            if log.closed and self.position >= log.next_pos:
                return
            await log.wait_for(self.position)
            if interval_s > 0 and log.next_pos - self.position < min_batch and not log.closed:
                await self._pause(interval_s)

    async def _pause(self, seconds: float) -> None:
        # asyncio.sleep that ``wake()`` can cut short (on close, on shutdown).
        loop = asyncio.get_running_loop()
        fut = self._wake = loop.create_future()
        handle = loop.call_later(seconds, _resolve, fut)
        try:
            await fut
        finally:
            handle.cancel()
            self._wake = None

    def wake(self) -> None:
        """End ``run``'s current pause now (call after closing the log)."""
        fut = self._wake
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _seed_from(self, log: EventLog, start: int) -> None:
        # Attached mid-log: requests and workers live at ``start`` were
        # admitted/joined before it; take them from the log's fold.
        for rs in log.state.requests.values():
            if 0 <= rs.admitted_pos < start and not (0 <= rs.terminal_pos < start):
                self._active_seed += 1
        for ws in log.state.workers.values():
            if 0 <= ws.joined_pos < start and not (0 <= ws.lost_pos < start):
                self._workers[ws.worker_id] = ws.stage
                self._stages_seen[ws.stage] = None

    # The hot loop: every event of the log passes here.  Chunks and Routed
    # pieces are most of a log (tokens, codec frames, audio packets and the
    # pieces forwarding them): a chunk costs a type test and one field read
    # (audio chunks a few more), and both are counted by subtraction rather
    # than one by one.  Each bytecode on the chunk path costs ~0.3% of the
    # log's append throughput.  (C-level passes over the slice -- map, compress,
    # count -- measured no cheaper than this loop on CPython 3.11.)
    def _consume(
        self,
        batch: Iterable[Event],
        n: int,
        src: EventSource,
        # Bound as defaults: locals, not global lookups, in the hot loop.
        type: type[type] = type,
        Chunk: type[Chunk] = Chunk,
        Routed: type[Routed] = Routed,
    ) -> None:
        counts = self._counts
        handlers = self._handlers
        audio = self._audio
        self._src = src
        before = sum(counts.values())
        routed = 0
        for ev in batch:
            if type(ev) is Chunk:
                if ev.blob is not None and ev.modality == "audio":  # type: ignore[union-attr]
                    rid = ev.request_id  # type: ignore[union-attr]
                    shape = ev.blob.shape  # type: ignore[union-attr]
                    audio[rid] = audio.get(rid, 0) + (shape[0] if shape else 0)
                continue
            cls = type(ev)
            if cls is Routed:
                routed += 1
                continue
            counts[cls] += 1
            h = handlers.get(cls)
            if h is not None:
                h(ev)
        rare = sum(counts.values()) - before
        counts[Routed] += routed
        counts[Chunk] += n - routed - rare

    # -- handlers (rare events) ---------------------------------------------
    def _on_rejected(self, ev: Rejected) -> None:
        self._c_rejected.add((ev.pipeline, ev.reason))
        if self.spans is not None:
            self.spans.rejected(ev)
        if isinstance(self._src, BufferSource):
            self._src.release(ev.request_id)

    def _on_worker_joined(self, ev: WorkerJoined) -> None:
        self._workers[ev.worker_id] = ev.stage
        self._stages_seen[ev.stage] = None

    def _on_worker_lost(self, ev: WorkerLost) -> None:
        self._workers.pop(ev.worker_id, None)
        self._stages_seen[ev.stage] = None

    def _on_cancelled(self, ev: Cancelled) -> None:
        if self._on_terminal(ev):
            self._c_cancelled.add((self._last_pipeline, ev.reason))

    def _on_failed(self, ev: Failed) -> None:
        if self._on_terminal(ev):
            self._c_failed.add((self._last_pipeline, ev.reason, ev.stage))

    def _on_terminal(self, ev: RequestEvent) -> bool:
        rid = ev.request_id
        src = self._src
        rs = src.request(rid)
        audio = self._audio.pop(rid, 0) if self._audio else 0
        if rs is None or rs.status not in TERMINAL_STATUSES:
            # Not in the fold (the log dropped it) or not ended in this view:
            # nothing sound to measure.
            return False
        self._last_pipeline = rs.pipeline
        ended = self._ended
        ended.record(rs, audio, src.event)
        if self.spans is not None:
            p = rs.pipeline
            modalities = {st.name: ended.modality(p, st.name) for st in rs.stages}
            self.spans.request(rs, ev, src, modalities, audio, self.sample_rate)
        if isinstance(src, BufferSource):
            src.release(rid)
        self._unfolded += 1
        if self._unfolded >= self.FOLD_EVERY:
            # Bucket what is pending (bounds the pending lists).
            self._unfolded = 0
            self.metrics.flush()
        return True

    # -- collection callbacks (from a collecting thread: copy, then read) -------
    def _event_points(self) -> list[tuple[tuple[str, ...], float]]:
        p = self.pipeline
        return [((p, _tag(cls)), n) for cls, n in list(self._counts.items())]

    def _active_points(self) -> list[tuple[tuple[str, ...], float]]:
        # Admitted minus ended, from the event counts: no per-request state.
        c = self._counts
        active = self._active_seed + c[Admitted] - c[Finished] - c[Cancelled] - c[Failed]
        return [((self.pipeline,), max(active, 0))]

    def _worker_points(self) -> list[tuple[tuple[str, ...], float]]:
        by = dict.fromkeys(list(self._stages_seen), 0)
        for stage in list(self._workers.values()):
            by[stage] = by.get(stage, 0) + 1
        p = self.pipeline
        return [((p, stage), n) for stage, n in by.items()]

    def _dropped_points(self) -> list[tuple[tuple[str, ...], float]]:
        return [((self.pipeline,), self._dropped)]

    # -- introspection (tests, bench) ------------------------------------------
    def live_state_size(self) -> int:
        """Per-request entries held now (0 once every request has ended and
        pending observations were flushed)."""
        own = self._own
        held = len(self._audio)
        if own is not None:
            held += len(own.kept) + sum(
                1 for rs in own.fold.requests.values() if rs.status not in TERMINAL_STATUSES
            )
        return held


class _NoSource:
    def request(self, request_id: str) -> RequestState | None:
        return None

    def event(self, request_id: str, pos: int) -> Event | None:
        return None


_NO_SOURCE = _NoSource()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _tag(cls: type) -> str:
    return cls.__struct_config__.tag  # type: ignore[attr-defined]


__all__ = ["BufferSource", "EventSource", "LogSource", "Projection"]
