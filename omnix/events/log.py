"""The append-only event log: positions, validation, subscribers.

Owns: ``EventLog`` (the contract and the behaviour common to every
backend: assigning positions, stamping time, validating each append against
the reducer, notifying synchronous listeners, async tailing) and
``MemoryLog``.  The on-disk backend lives in ``disklog.py`` and implements
the same storage hooks.

Does not own decisions: it accepts any legal event and refuses illegal ones.

Subscribers never get a private buffer: ``tail`` reads from the log's own
storage from the subscriber's position, so a slow subscriber costs nothing
but its position and can never make memory grow.

Retention (``retention.py`` decides, a ``Released`` event records it): once
a ``Released`` is stored, its requests' events are gone from the log.
Positions never move: ``get`` of a released position raises
``EventReleased``, ``read`` and ``tail`` skip released positions, and
``events_for`` of a released request is empty.  What else a backend drops
(server-level events older than every retained request, disk segments) is
in its class docstring.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import msgspec

from omnix.events.clock import Clock, SystemClock
from omnix.events.reducer import Fold, IllegalTransition, Snapshot
from omnix.events.snapshot import RetentionState
from omnix.events.types import (
    Admitted,
    Cancelled,
    Chunk,
    Event,
    Failed,
    Finished,
    InputAppended,
    Progress,
    Rejected,
    Released,
    Scaled,
    SessionChanged,
    WorkerJoined,
    WorkerLost,
)

Listener = Callable[[Event], None]

#: The events the log shows its observer (``set_observer``), besides chunks,
#: progress events (a partial image, schema v7) and appended input (a
#: duplex session's user frame, schema v14) that carry a blob: a request's
#: first and last events and server events.
OBSERVED_TYPES: frozenset[type] = frozenset(
    (Admitted, Rejected, Finished, Failed, Cancelled, Released, WorkerJoined, WorkerLost)
)


def _never_released(request_id: str) -> bool:
    return False


class LogClosed(RuntimeError):
    pass


class EventReleased(IndexError):
    """The event at this position was released by retention (its request
    ended before the retention window): it is no longer in the log.  An
    ``IndexError``, as a position past the end is, so readers that treat a
    missing position as "not there" keep working."""

    def __init__(self, pos: int, where: str = "") -> None:
        self.pos = pos
        super().__init__(
            f"the event at position {pos} was released by retention{where} (its request "
            "ended before the retention window); keep requests longer (a longer --retain, "
            "more --retain-requests) or read an archived log directory"
        )


class EventLog:
    """Base class: subclasses implement ``_store``, ``read`` and ``_positions``.

    ``append`` is synchronous and cheap: it validates (the reducer raises
    ``IllegalTransition`` and nothing is stored), assigns the position,
    stamps ``ts_ns`` when the event has none, stores, folds and calls the
    listeners in registration order.  Listeners run inside ``append``; they
    must not block (they may append further events: those are stored after
    the current one, in the order they were appended).
    """

    def __init__(self, clock: Clock | None = None, snapshot: Snapshot | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self.state = Fold(snapshot)
        self._listeners: list[Listener] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._req_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._closed = False
        self._dispatching = False
        self._pending: list[Event] = []
        # Housekeeping between appends: due after this append (a backend's
        # snapshot, retention's decisions), run by whoever set the flag's hooks.
        self._maint_due = False
        self._maintaining = False
        self._housekeepers: list[Callable[[], None]] = []
        # One observer (retention's accounting) sees each event right after
        # it is stored, before the listeners, through a plain call: cheaper
        # than a listener on the hot path, and it never appends.
        self._observer: Listener | None = None
        # Retention's hand-over (``retention.py``): the position a reopened
        # log's snapshot was taken at, the accounting it carried, and where
        # the log's next snapshots get it from.
        self.snapshot_pos = 0
        self.loaded_retention: RetentionState | None = None
        self.retention_state: Callable[[], RetentionState] | None = None
        #: whether a request id was released (retention installs its
        #: answer): a tail of a released request ends instead of waiting
        self.released: Callable[[str], bool] = _never_released
        # Called before retention appends a ``Released``: a reader of the
        # fold's ended requests (telemetry) records them while they are held.
        self._release_readers: list[Callable[[], None]] = []

    #: Whether a worker may act on an event only once it is acknowledged
    #: (``durable_pos``): a replicated log's, whose takeover must never
    #: find work done for an event its stream does not hold.  A disk log's
    #: workers act at once (a restart re-drives from what is on disk).
    acts_when_acknowledged = False

    # -- storage hooks ---------------------------------------------------
    #: Store one validated, positioned event (a method, or a callable a
    #: backend binds in its constructor: the disk log's is its writer's).
    _store: Callable[[Event], None]

    def read(self, start: int = 0, stop: int | None = None) -> Iterator[Event]:
        """Events with ``start <= pos < stop`` in position order."""
        raise NotImplementedError

    def _positions(self, request_id: str) -> list[int]:
        raise NotImplementedError

    def get(self, pos: int) -> Event:
        for ev in self.read(pos, pos + 1):
            return ev
        raise IndexError(f"no event at position {pos} (log has {self.next_pos})")

    def _refusal(self) -> Exception:
        """The error ``append`` raises once the log is closed (a backend that
        closed itself after a failure says why)."""
        return LogClosed("the event log is closed")

    def _positions_since(self, request_id: str, start: int) -> list[int]:
        """The request's positions ``>= start``; backends override it to avoid
        rescanning a long request's index on every wake of a tail."""
        return [p for p in self._positions(request_id) if p >= start]

    # -- public API ----------------------------------------------------
    @property
    def next_pos(self) -> int:
        return self.state.next_pos

    def __len__(self) -> int:
        return self.state.next_pos

    def append(self, ev: Event) -> Event:
        """Validate, position, store and fold ``ev``; return the stored event."""
        if self._closed:
            raise self._refusal()
        ts = ev.ts_ns or self.clock.now_ns()
        return self._accept(msgspec.structs.replace(ev, pos=self.state.next_pos, ts_ns=ts))

    def _accept(self, ev: Event) -> Event:
        """Fold (validate), store and announce an event that already holds
        its position (``next_pos``) and time: ``append``'s path after it
        positioned the event, and a replica's for an event its leader
        appended (``natslog.py``)."""
        try:
            self.state.apply(ev)  # raises before anything is stored
        except IllegalTransition as exc:
            raise exc.refused() from None
        self._store(ev)
        observer = self._observer
        if observer is not None:
            # Only what retention counts: admissions, ends, chunks with a
            # blob, server events.  The rest (most events) skip the call.
            if type(ev) is Chunk or type(ev) is Progress or type(ev) is InputAppended:
                if ev.blob is not None:
                    observer(ev)
            elif type(ev) in OBSERVED_TYPES:
                observer(ev)
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        if (
            self._req_waiters
            and type(ev) is not WorkerJoined
            and type(ev) is not WorkerLost
            and type(ev) is not Released
            and type(ev) is not SessionChanged
            and type(ev) is not Scaled
        ):
            # A request's tail wakes only for its own events: an open stream
            # costs nothing when other requests' events are appended.
            req_waiters = self._req_waiters.pop(ev.request_id, None)
            if req_waiters:
                for fut in req_waiters:
                    if not fut.done():
                        fut.set_result(None)
        elif self._req_waiters and type(ev) is Released:
            # A released request's tail would wait forever: wake it to end.
            for rid in ev.request_ids:
                for fut in self._req_waiters.pop(rid, ()):
                    if not fut.done():
                        fut.set_result(None)
        if self._listeners:
            self._notify(ev)
        if self._maint_due and not self._dispatching:
            # Between appends, with every listener caught up: a release
            # decided now, or a snapshot taken now, sees one whole prefix.
            self._maintain()
        return ev

    # -- durability ---------------------------------------------------------
    @property
    def durable_pos(self) -> int:
        """Positions below this are acknowledged: a crash cannot take them
        back, so a client may be sent them and a worker may act on them.
        A memory log acknowledges at once (nothing outlives it anyway)."""
        return self.next_pos

    async def flush(self) -> int:
        """Wait until everything appended so far is acknowledged; return
        ``durable_pos``."""
        return self.durable_pos

    def _maintain(self) -> None:
        if self._maintaining:
            return  # an append made by the housekeeping itself: the loop below re-checks
        self._maintaining = True
        try:
            while self._maint_due:
                self._maint_due = False
                self._housekeeping()
        finally:
            self._maintaining = False

    def _housekeeping(self) -> None:
        """What is due between appends: the housekeepers' (retention's
        decisions), then a backend's own (the disk log's snapshots)."""
        for fn in self._housekeepers:
            fn()

    def set_observer(self, fn: Listener | None) -> None:
        """Install (or, with ``None``, remove) the one observer: called with
        each stored chunk that carries a blob and each event of
        ``OBSERVED_TYPES``, before the listeners; it must not append (it may
        set ``_maint_due`` and do its appending from a housekeeper)."""
        if fn is not None and self._observer is not None:
            raise RuntimeError("this log already has an observer (one Retention per log)")
        self._observer = fn

    def add_housekeeper(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` between appends whenever ``_maint_due`` was set."""
        self._housekeepers.append(fn)

    def remove_housekeeper(self, fn: Callable[[], None]) -> None:
        self._housekeepers.remove(fn)

    def add_release_reader(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` right before retention appends a ``Released`` (the
        requests it names are still in the fold then): how a reader of
        ``state.ended`` that polls (the telemetry projection) records every
        request before it goes.  It must not append."""
        self._release_readers.append(fn)

    def remove_release_reader(self, fn: Callable[[], None]) -> None:
        if fn in self._release_readers:
            self._release_readers.remove(fn)

    def before_release(self) -> None:
        """Run the release readers (``Retention`` calls it)."""
        for fn in self._release_readers:
            fn()

    def _notify(self, ev: Event) -> None:
        # Listeners may append; their events are delivered after this one to
        # every listener, so each listener sees the log in position order.
        if self._dispatching:
            self._pending.append(ev)
            return
        self._dispatching = True
        try:
            queue = [ev]
            i = 0
            while i < len(queue):
                cur = queue[i]
                i += 1
                for fn in self._listeners:
                    fn(cur)
                if self._pending:
                    queue.extend(self._pending)
                    self._pending.clear()
        finally:
            self._dispatching = False
            self._pending.clear()

    def add_listener(self, fn: Listener) -> None:
        self._listeners.append(fn)

    def remove_listener(self, fn: Listener) -> None:
        self._listeners.remove(fn)

    def events_for(self, request_id: str) -> list[Event]:
        """One request's events, via the index (no scan)."""
        out = []
        for p in self._positions(request_id):
            out.append(self.get(p))
        return out

    def positions_for(self, request_id: str) -> list[int]:
        return list(self._positions(request_id))

    async def wait_for(self, pos: int) -> None:
        """Return once an event at ``pos`` exists (or the log closes)."""
        while self.next_pos <= pos and not self._closed:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut

    async def tail(
        self,
        start: int = 0,
        *,
        request_id: str | None = None,
        batch: int = 256,
    ) -> AsyncIterator[Event]:
        """Yield events from ``start`` on, waiting for new ones forever.

        With ``request_id`` only that request's events are yielded (read via
        the index).  Ends when the log closes.  Memory per subscriber is one
        batch: the log's storage is the buffer.
        """
        pos = start
        while True:
            if request_id is None:
                stop = min(self.next_pos, pos + batch)
                if pos < stop:
                    for ev in self.read(pos, stop):
                        yield ev
                    pos = stop
                    continue
            else:
                positions = self._positions_since(request_id, pos)
                if positions:
                    try:
                        for p in positions:
                            yield self.get(p)
                    except EventReleased:
                        return  # released under a slow reader: its events are gone
                    pos = positions[-1] + 1
                    continue
                if request_id not in self.state.requests and (
                    pos > start or self.released(request_id)
                ):
                    # Released by retention (while read, or before): nothing
                    # more will come, and waiting would wait forever.
                    return
                pos = max(pos, self.next_pos)
            if self._closed:
                return
            if request_id is None:
                await self.wait_for(pos)
            else:
                await self._wait_request(request_id)

    async def _wait_request(self, request_id: str) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._req_waiters.setdefault(request_id, []).append(fut)
        try:
            await fut
        finally:
            waiters = self._req_waiters.get(request_id)
            if waiters is not None and fut in waiters:
                waiters.remove(fut)
                if not waiters:
                    del self._req_waiters[request_id]

    def close(self) -> None:
        self._closed = True
        waiters, self._waiters = self._waiters, []
        for group in self._req_waiters.values():
            waiters.extend(group)
        self._req_waiters.clear()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def available(self) -> bool:
        """Whether the log takes new work now: a replicated log is not while
        its servers are unreachable (admissions then answer 503)."""
        return True

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def worker_positions_before(self, first: int) -> list[int]:
        """Positions of every ``WorkerJoined``/``WorkerLost`` the log holds
        before ``first``, and of the ``Scaled`` events the scaler's state
        rests on (``Fold.scaled``), in order (a restart's recovery and a
        trace's prefix show them: they outlive the requests around them)."""
        if first <= 0:
            return []
        state = self.state
        workers = state.workers.values()
        scaled = {p for ps in state.scaled.values() for p in ps if p < first}
        if all(ws.incarnation == 1 for ws in workers):
            # Each worker joined once: the fold knows both positions, no scan.
            out = {ws.joined_pos for ws in workers if 0 <= ws.joined_pos < first}
            out |= {ws.lost_pos for ws in workers if 0 <= ws.lost_pos < first}
            return sorted(out | scaled)
        # A replica joined again: every join and loss, and every departure
        # after a drain (a Scaled "left"), before ``first`` in order, so
        # each join folds after the end of the one before it.
        kinds = (WorkerJoined, WorkerLost, Scaled)
        found = {ev.pos for ev in self.read(0, first) if isinstance(ev, kinds)}
        return sorted(found | scaled)

    def _worker_positions(self) -> set[int]:
        """Positions of the worker events the fold still refers to (kept
        when the requests around them are released)."""
        out: set[int] = set()
        for ws in self.state.workers.values():
            out.add(ws.joined_pos)
            if ws.lost_pos >= 0:
                out.add(ws.lost_pos)
        for ps in self.state.scaled.values():
            out.update(ps)
        return out


#: What a released slot of ``MemoryLog._events`` holds: a sentinel of the
#: event type (so the list stays ``list[Event]``), compared by identity.
_GONE: Event = Released(request_ids=(), reason="count", pos=-2)


class MemoryLog(EventLog):
    """The log held in a Python list; the index is a dict of position lists.

    Retention: when a ``Released`` is stored, the released requests' slots
    become a sentinel (8 bytes each) and their index entries go; server
    events (``WorkerJoined``, ``WorkerLost``, ``Released``) older than every
    retained request go too, except each worker's latest join and loss
    (the fold's ``joined_pos``/``lost_pos``: a trace exports them), which
    move to a small side table.  Once released slots are over half the
    list, the leading run of them is cut off (``_base`` counts the
    positions cut).  Memory is thus bounded by the positions from the
    oldest retained request's first event on: a request in flight for
    hours keeps 8 bytes per position appended since it started.
    """

    def __init__(
        self,
        clock: Clock | None = None,
        events: Iterable[Event] = (),
        *,
        keep_released: bool = False,
    ) -> None:
        super().__init__(clock)
        # ``keep_released``: an offline reader of a whole history (an
        # archived log) keeps released requests: their Released events are
        # stored and validated but drop nothing.
        self.state.keep_released = keep_released
        self._keep_released = keep_released
        self._events: list[Event] = []
        self._index: dict[str, list[int]] = {}
        self._base = 0  # the position of _events[0]
        self._holes = 0  # released slots (_GONE) in _events
        self._trim_at = 1024  # try to cut the leading holes once there are this many
        self._server: deque[int] = deque()  # server events' positions, still in _events
        self._pinned: dict[int, Event] = {}  # workers' latest events, cut from _events
        for ev in events:
            self.append(ev)

    def _store(self, ev: Event) -> None:
        self._events.append(ev)
        # Exact types, not isinstance(ev, RequestEvent): see types.py.
        if (
            type(ev) is not WorkerJoined
            and type(ev) is not WorkerLost
            and type(ev) is not Released
            and type(ev) is not SessionChanged
            and type(ev) is not Scaled
        ):
            idx = self._index.get(ev.request_id)
            if idx is None:
                self._index[ev.request_id] = [ev.pos]
            else:
                idx.append(ev.pos)
        else:
            self._server.append(ev.pos)
            if type(ev) is Released and not self._keep_released:
                self._forget(ev)

    def _resume_at(self, base: int, pinned: Iterable[Event]) -> None:
        """Storage restarts at ``base`` (a log opened from a snapshot): the
        positions before it are released, bar the ``pinned`` workers'
        events (``natslog.py``); events from ``base`` on are stored (or
        left as ``_hole``s) in position order."""
        self._events.clear()
        self._index.clear()
        self._server.clear()
        self._base = base
        self._holes = 0
        self._pinned = {ev.pos: ev for ev in pinned}

    def _hole(self) -> None:
        """The next position holds an event released before a snapshot."""
        self._events.append(_GONE)
        self._holes += 1

    def _forget(self, ev: Released) -> None:
        events = self._events
        base = self._base
        holes = 0
        index = self._index
        for rid in ev.request_ids:
            for p in index.pop(rid, ()):
                events[p - base] = _GONE
                holes += 1
        # Server events older than every retained request's first event.
        low = next(iter(index.values()))[0] if index else self.next_pos
        server = self._server
        if server and server[0] < low:
            keep = self._worker_positions()
            pinned = self._pinned
            for p in [p for p in pinned if p not in keep]:
                del pinned[p]
            while server and server[0] < low:
                p = server.popleft()
                if p in keep:
                    pinned[p] = events[p - base]
                events[p - base] = _GONE
                holes += 1
        self._holes += holes
        if self._holes >= self._trim_at:
            self._trim()

    def _trim(self) -> None:
        events = self._events
        k = 0
        n = len(events)
        while k < n and events[k] is _GONE:
            k += 1
        if k:
            del events[:k]
            self._base += k
            self._holes -= k
        # Holes behind a retained event wait for it; try again once as many
        # more have come (amortised: each try costs O(k) plus the cut).
        self._trim_at = self._holes + max(1024, len(events) // 2)

    def read(self, start: int = 0, stop: int | None = None) -> Iterator[Event]:
        if not self._holes and not self._base:
            return iter(self._events[start:stop])
        return self._read_held(start, stop)

    def _read_held(self, start: int, stop: int | None) -> Iterator[Event]:
        n = self.next_pos
        stop = n if stop is None else min(stop, n)
        start = max(start, 0)
        base = self._base
        pinned = sorted(p for p in self._pinned if start <= p < stop)
        k = 0
        pos = max(start, base)
        for ev in self._events[pos - base : max(stop - base, 0)]:
            while k < len(pinned) and pinned[k] < pos:
                yield self._pinned[pinned[k]]
                k += 1
            if ev is not _GONE:
                yield ev
            pos += 1
        for p in pinned[k:]:
            yield self._pinned[p]

    def get(self, pos: int) -> Event:
        if not self._holes and not self._base:
            return self._events[pos]
        i = pos - self._base
        if 0 <= i < len(self._events):
            ev = self._events[i]
            if ev is not _GONE:
                return ev
        found = self._pinned.get(pos)
        if found is not None:
            return found
        if 0 <= pos < self.next_pos:
            raise EventReleased(pos)
        raise IndexError(f"no event at position {pos} (log has {self.next_pos})")

    @property
    def held_events(self) -> int:
        """Events this log holds in memory (released ones excluded)."""
        return len(self._events) - self._holes + len(self._pinned)

    @property
    def held_slots(self) -> int:
        """List slots this log holds (held events plus released slots not yet cut)."""
        return len(self._events) + len(self._pinned)

    def _positions(self, request_id: str) -> list[int]:
        return self._index.get(request_id, [])

    def _positions_since(self, request_id: str, start: int) -> list[int]:
        idx = self._index.get(request_id, [])
        return idx[bisect.bisect_left(idx, start) :]
