"""Telemetry as a projection of the event log.

Owns: ``Projection``, which reads events in log order and turns them into
metric observations (``metrics.py``) and, when a tracer is configured, spans
(``spans.py``).  Nothing else in omnix records telemetry: the same
projection runs over a live log (``run``/``catch_up``) and over the events
of an old trace (``observe``), and gives the same result.

Does not own exporters or the process-wide setup (``setup.py``), nor any
state of its own beyond what a request needs until it ends.

How it stays cheap (``omnix bench telemetry``): it never reads the log's
events one by one.  The log's fold already keeps, as it folds, what the
projection needs beside each request's final state -- the requests in the
order they ended and each request's audio samples (``Fold.ended``,
``Fold.audio_samples``) -- so a pass is a poll:
  * the requests ended since the last pass, each read from the fold (final
    by then: nothing follows a terminal event); events are read back by
    position only for a span (the terminal one, the admission, the cancel,
    first chunks), for the stage a ``Failed`` names, and once per stage for
    its output modality;
  * an ended request is a dozen list appends of raw integers on series it
    holds (``ended.py``); bucketing is done in bulk (``metrics.py``);
  * counters and gauges of the log as a whole (events: the log's length;
    requests in flight; workers ready) are read from the fold when a
    collector asks;
  * spans are built only at the terminal event and only with a tracer.
Live (``run``), it wakes at most once per ``interval_s`` while the log
grows and sleeps while it does not.

Standalone (``observe``, for traces and tests) it folds privately and keeps
per request only the events a span reads back, released at the end; the
ended requests it recorded leave its private fold's ``ended`` list too.

Bounded on a server that runs for months: it holds no per-request map of
its own.  Retention (``omnix.events.retention``) takes released requests
off the front of the fold's ``ended`` (``Fold.ended_dropped`` counts
them), so the projection keeps its place as an absolute count of ended
requests (``ended_dropped`` plus an index) and never goes backwards; and
``run`` registers a release reader on the log, so it records every
request right before a ``Released`` drops it, whatever its poll interval.
The retention gauges (``omnix_requests_retained``...) read a
``RetentionCounters`` given with ``follow_retention``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Protocol, get_args

from omnix.events.log import EventLog
from omnix.events.reducer import (
    TERMINAL_STATUSES,
    Fold,
    IllegalTransition,
    RequestState,
)
from omnix.events.types import (
    CancelReason,
    Event,
    Failed,
    Rejected,
    RejectReason,
    RequestEvent,
)
from omnix.telemetry.ended import EndedRequests
from omnix.telemetry.metrics import MetricSet
from omnix.telemetry.sources import BufferSource, EventSource, LogSource
from omnix.telemetry.spans import SpanWriter

DEFAULT_SAMPLE_RATE = 24_000


class RetentionCounters(Protocol):
    """What the retention gauges read (``omnix.events.retention.Retention``)."""

    @property
    def retained_events(self) -> int: ...

    @property
    def retained_bytes(self) -> int: ...

    @property
    def blobs_retained_bytes(self) -> int: ...

    @property
    def requests_retained(self) -> int: ...


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
        #: the log position ``run``/``catch_up`` has seen up to
        self.position = 0
        # The fold being read (the live log's or the standalone one's) and
        # how many of its ended requests were recorded, counted from the
        # first one it ever had (``fold.ended[k - fold.ended_dropped]`` is
        # the k-th): retention drops recorded ones off the list's front.
        self._fold: Fold | None = None
        self._ended_seen = 0
        #: ended requests released before this projection read them (a log
        #: without ``run``'s release reader): counted, not measured
        self.ended_missed = 0
        self._recorded = 0
        self._retention: RetentionCounters | None = None
        self._own: BufferSource | None = None
        self._dropped = 0
        self._ended = EndedRequests(metrics, sample_rate)
        self._unfolded = 0
        self._source: LogSource | None = None
        self._wake: asyncio.Future[None] | None = None
        m = metrics
        self._c_rejected = m.sum("omnix.requests.rejected")
        self._c_cancelled = m.sum("omnix.requests.cancelled")
        self._c_failed = m.sum("omnix.requests.failed")
        m.sum("omnix.events").callback = self._event_points
        m.sum("omnix.requests.active").callback = self._active_points
        m.sum("omnix.workers.ready").callback = self._worker_points
        m.sum("omnix.telemetry.dropped").callback = self._dropped_points
        for name, attr in (
            ("omnix.log.retained_events", "retained_events"),
            ("omnix.log.retained_bytes", "retained_bytes"),
            ("omnix.blobs.retained_bytes", "blobs_retained_bytes"),
            ("omnix.requests.retained", "requests_retained"),
        ):
            m.sum(name).callback = self._retention_points(attr)
        if pipeline:
            # Refusals and cancellations by every known reason start at 0, so
            # rate() has a series before the first one happens.
            for reason in get_args(RejectReason):
                self._c_rejected.get((pipeline, reason))
            for reason in get_args(CancelReason):
                self._c_cancelled.get((pipeline, reason))

    @property
    def requests_ended(self) -> int:
        """Requests whose end this projection recorded (never decreases)."""
        return self._recorded

    def follow_retention(self, retention: RetentionCounters | None) -> None:
        """Export ``retention``'s counters as the ``omnix.*.retained*`` gauges."""
        self._retention = retention

    def _retention_points(self, attr: str) -> Callable[[], list[tuple[tuple[str, ...], float]]]:
        def points() -> list[tuple[tuple[str, ...], float]]:
            # 0 until a server's retention is followed (a trace, a log read
            # offline: nothing is retained there): exposed from the start.
            ret = self._retention
            value = 0.0 if ret is None else float(getattr(ret, attr))
            return [((self.pipeline,), value)]

        return points

    # -- feeding -----------------------------------------------------------
    def observe(self, ev: Event) -> None:
        """Standalone: one event in log order (a trace, a test)."""
        own = self._own
        if own is None:
            own = self._own = BufferSource()
        try:
            own.apply(ev)
        except IllegalTransition:
            self._dropped += 1
            return
        fold = own.fold
        if len(fold.ended) + fold.ended_dropped > self._ended_seen or self._fold is not fold:
            self._poll(fold, own)

    def observe_many(self, events: Iterable[Event]) -> None:
        for ev in events:
            self.observe(ev)

    def catch_up(self, log: EventLog) -> int:
        """Record what the log gained since the last pass; return how many
        positions it advanced."""
        src = self._source
        if src is None or src.log is not log:
            src = self._source = LogSource(log)
        first = self.position
        self._poll(log.state, src)
        self.position = log.next_pos
        return self.position - first

    def flush(self) -> None:
        """Bucket pending observations now (collection does this itself)."""
        self.metrics.flush()

    async def run(
        self,
        log: EventLog,
        start: int | None = None,
        *,
        interval_s: float = 0.05,
    ) -> None:
        """Follow ``log`` until it closes: requests that end from ``start``
        on (default: where the last pass stopped) are recorded.

        Each pass is a poll of the log's fold (see the module docstring).
        Idle, it waits on the log (one future, woken by the next append);
        woken, it lets ``interval_s`` of appends accumulate before the next
        pass, so a busy log costs one pass per interval, not one per event.
        The default 50 ms keeps a busy server's wake-ups at 20 a second;
        metrics are scraped every few seconds and spans leave in batches,
        so nobody sees the delay.
        """
        if start is not None:
            self._start_at(log, start)

        def before_release() -> None:
            self.catch_up(log)

        log.add_release_reader(before_release)
        try:
            while True:
                self.catch_up(log)
                if log.closed and self.position >= log.next_pos:
                    return
                await log.wait_for(self.position)
                if interval_s > 0 and not log.closed:
                    await self._pause(interval_s)
        finally:
            log.remove_release_reader(before_release)

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

    def _start_at(self, log: EventLog, start: int) -> None:
        # Requests that ended before ``start`` are not this projection's to
        # record; the fold lists ended requests in log order.
        fold = log.state
        ended = fold.ended
        k = len(ended)
        while k > 0:
            rs = fold.requests.get(ended[k - 1])
            if rs is None or rs.terminal_pos < start:
                break
            k -= 1
        self._fold = fold
        self._ended_seen = fold.ended_dropped + k
        self.position = start

    def _poll(self, fold: Fold, src: EventSource) -> None:
        if fold is not self._fold:
            self._fold = fold
            self._ended_seen = fold.ended_dropped
        ended = fold.ended
        dropped = fold.ended_dropped
        i = self._ended_seen - dropped
        if i < 0:
            # Released before this projection read them: lost to it.
            self.ended_missed -= i
            self._ended_seen = dropped
            i = 0
        n = len(ended)
        if i == n:
            return
        audio = fold.audio_samples
        requests = fold.requests
        record = self._record_end
        while i < n:
            rid = ended[i]
            i += 1
            self._ended_seen = dropped + i
            self._recorded += 1
            rs = requests.get(rid) or src.request(rid)
            if rs is not None and rs.status in TERMINAL_STATUSES:
                record(rs, audio.get(rid, 0), src)
            # else: not in the fold (a log that dropped it): nothing sound to measure
        if type(src) is BufferSource and src.fold is fold:
            # The private fold: what was recorded is released (see
            # ``BufferSource.release``); its ids leave ``ended`` too.
            del ended[:i]
            fold.ended_dropped += i

    # -- ended requests -------------------------------------------------------
    def _record_end(self, rs: RequestState, audio: int, src: EventSource) -> None:
        status = rs.status
        spans = self.spans
        # The terminal event is read back only when something needs more
        # than the state has: a span, or the stage a Failed names.
        ev = (
            src.event(rs.request_id, rs.terminal_pos)
            if spans is not None or status == "failed"
            else None
        )
        if status == "rejected":
            self._c_rejected.add((rs.pipeline, rs.reason))
            if spans is not None and isinstance(ev, Rejected):
                spans.rejected(ev)
        else:
            ended = self._ended
            ended.record(rs, audio, src.event)
            if spans is not None and isinstance(ev, RequestEvent):
                p = rs.pipeline
                modalities = {st.name: ended.modality(p, st.name) for st in rs.stages}
                spans.request(rs, ev, src, modalities, audio, self.sample_rate)
            if status == "cancelled":
                self._c_cancelled.add((rs.pipeline, rs.reason))
            elif status == "failed":
                stage = ev.stage if isinstance(ev, Failed) else ""
                self._c_failed.add((rs.pipeline, rs.reason, stage))
            self._unfolded += 1
            if self._unfolded >= self.FOLD_EVERY:
                # Bucket what is pending (bounds the pending lists).
                self._unfolded = 0
                self.metrics.flush()
        if type(src) is BufferSource:
            src.release(rs.request_id)

    # -- collection callbacks (from a collecting thread: copy, then read) -------
    # (The fold's dicts are read whole with ``list()``/``dict()``, which
    # hold the GIL throughout: a consistent copy while the loop appends.)
    def _event_points(self) -> list[tuple[tuple[str, ...], float]]:
        fold = self._fold
        return [((self.pipeline,), fold.next_pos if fold is not None else 0)]

    def _active_points(self) -> list[tuple[tuple[str, ...], float]]:
        # Requests in the fold that have not ended (a standalone fold drops
        # ended ones once recorded).
        fold = self._fold
        if fold is None:
            return [((self.pipeline,), 0)]
        # Ended requests still in the fold are exactly those in ``ended``
        # (retention and the standalone release drop both together).
        active = len(fold.requests) - len(fold.ended)
        return [((self.pipeline,), max(active, 0))]

    def _worker_points(self) -> list[tuple[tuple[str, ...], float]]:
        fold = self._fold
        if fold is None:
            return []
        by: dict[str, int] = {}
        for ws in sorted(list(fold.workers.values()), key=lambda w: w.worker_id):
            by[ws.stage] = by.get(ws.stage, 0) + (1 if ws.alive else 0)
        p = self.pipeline
        return [((p, stage), n) for stage, n in by.items()]

    def _dropped_points(self) -> list[tuple[tuple[str, ...], float]]:
        return [((self.pipeline,), self._dropped)]

    # -- introspection (tests, bench) ------------------------------------------
    def live_state_size(self) -> int:
        """Per-request entries held now (0 once every request has ended and
        pending observations were flushed)."""
        own = self._own
        held = 0
        if own is not None:
            held += (
                len(own.kept)
                + len(own.fold.audio_samples)
                + sum(1 for rs in own.fold.requests.values() if rs.status not in TERMINAL_STATUSES)
            )
        return held


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


__all__ = ["Projection"]
