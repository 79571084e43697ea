"""Timeouts: the one place the wall clock meets the orchestrator.

Owns: ``DeadlineTimer``, a log listener plus one ``loop.call_at`` handle.
After each event of a live request it asks the orchestrator when that
request's timeouts fall due (``Orchestrator.due_times``, a pure function of
the log), keeps the earliest per request in a heap, and when the clock
passes one it appends ``DeadlineExpired`` as an input.  What the expiry
means (cancel, fail, give up on aborts) is decided by the orchestrator, and
because the expiry is an event, replay needs no clock.

Event-driven, never polling: nothing runs until the earliest due time.  A
heap entry made stale by later activity is re-checked when it fires and
re-armed for the new due time.  Entries of requests that ended (or whose
earlier entry supersedes them) are dropped in bulk once they outnumber the
armed ones, so the heap stays proportional to the requests in flight on a
server that never reaches a request's far deadline (a heap census found it
growing by one entry per request otherwise).
"""

from __future__ import annotations

import asyncio
import heapq

from omnix.events.clock import Clock
from omnix.events.types import Chunk, DeadlineExpired, Event, Progress, RequestEvent
from omnix.orchestrator.decide import Orchestrator
from omnix.orchestrator.sequencer import Sequencer


class DeadlineTimer:
    def __init__(self, sequencer: Sequencer, clock: Clock) -> None:
        self.sequencer = sequencer
        self.orchestrator: Orchestrator = sequencer.orchestrator
        self.clock = clock
        self._heap: list[tuple[int, str]] = []
        self._armed: dict[str, int] = {}  # request id -> due time in the heap
        self._handle: asyncio.TimerHandle | None = None
        self._handle_due = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def attach(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Listen to the log.  With ``loop`` None nothing is armed in real
        time: a virtual-time driver calls ``next_due``/``fire_due`` itself."""
        self._loop = loop
        self.sequencer.log.add_listener(self)

    def next_due(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def fire_due(self) -> None:
        """Append expiries for everything due at the clock's current time."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._fire()

    def close(self) -> None:
        self._closed = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def __call__(self, ev: Event) -> None:
        if type(ev) is Chunk or type(ev) is Progress:
            if ev.request_id in self._armed:
                # Output only pushes a stage's inactivity timeout later and
                # moves nothing earlier, and the armed entry fires no later
                # than the earliest due time (stale entries re-arm when they
                # fire).  So a chunk of an armed request needs no due-time
                # computation, which would be a quarter of the server's work
                # per streamed token.
                return
        elif not isinstance(ev, RequestEvent):
            return
        self.track(ev.request_id)

    def track(self, rid: str) -> None:
        """Arm (or disarm) ``rid`` for its next due time: after each of its
        events, and for every live request of a log taken over at start."""
        due = self.orchestrator.due_times(rid, self.sequencer.log.state)
        if not due:
            if (
                self._armed.pop(rid, None) is not None
                and len(self._heap) > 2 * len(self._armed) + 1024
            ):
                self._compact()
            return
        t = due[0][0]
        armed = self._armed.get(rid)
        # A later due time needs no new entry: the earlier one fires, finds
        # nothing due and re-arms.  Only an earlier one is pushed.
        if armed is None or t < armed:
            self._armed[rid] = t
            heapq.heappush(self._heap, (t, rid))
            self._rearm()

    def _compact(self) -> None:
        """Keep only each armed request's entry (its earliest: a later one
        would only re-check it); the handle stays armed for the earliest,
        which is among them."""
        self._heap = [(t, rid) for rid, t in self._armed.items()]
        heapq.heapify(self._heap)

    def _rearm(self) -> None:
        if self._closed or self._loop is None or not self._heap:
            return
        t = self._heap[0][0]
        if self._handle is not None:
            if self._handle_due <= t:
                return
            self._handle.cancel()
        delay = max(0.0, (t - self.clock.now_ns()) / 1e9)
        self._handle_due = t
        self._handle = self._loop.call_at(self._loop.time() + delay, self._fire)

    def _fire(self) -> None:
        self._handle = None
        now = self.clock.now_ns()
        state = self.sequencer.log.state
        while self._heap and self._heap[0][0] <= now:
            _, rid = heapq.heappop(self._heap)
            if self._armed.get(rid) is None:
                continue
            del self._armed[rid]
            due = self.orchestrator.due_times(rid, state)
            expired = [scope for t, scope in due if t <= now]
            if expired:
                self.sequencer.emit(DeadlineExpired(request_id=rid, scope=expired[0]))
            # Re-arm for whatever is still ahead (the append above also
            # re-arms through the listener when the request lives on).
            due = self.orchestrator.due_times(rid, state)
            if due and rid not in self._armed:
                # Never spin: something still due now is looked at again a
                # little later rather than in this loop.
                t = max(due[0][0], now + 10_000_000)
                self._armed[rid] = t
                heapq.heappush(self._heap, (t, rid))
        self._rearm()

    @property
    def armed(self) -> int:
        return len(self._armed)
