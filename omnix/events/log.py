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
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import msgspec

from omnix.events.clock import Clock, SystemClock
from omnix.events.reducer import Fold, IllegalTransition, Snapshot
from omnix.events.types import Event, WorkerJoined, WorkerLost

Listener = Callable[[Event], None]


class LogClosed(RuntimeError):
    pass


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

    # -- storage hooks ---------------------------------------------------
    def _store(self, ev: Event) -> None:
        raise NotImplementedError

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
        state = self.state
        ts = ev.ts_ns or self.clock.now_ns()
        ev = msgspec.structs.replace(ev, pos=state.next_pos, ts_ns=ts)
        try:
            state.apply(ev)  # raises before anything is stored
        except IllegalTransition as exc:
            raise exc.refused() from None
        self._store(ev)
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        if self._req_waiters and type(ev) is not WorkerJoined and type(ev) is not WorkerLost:
            # A request's tail wakes only for its own events: an open stream
            # costs nothing when other requests' events are appended.
            req_waiters = self._req_waiters.pop(ev.request_id, None)
            if req_waiters:
                for fut in req_waiters:
                    if not fut.done():
                        fut.set_result(None)
        if self._listeners:
            self._notify(ev)
        return ev

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
                    for p in positions:
                        yield self.get(p)
                    pos = positions[-1] + 1
                    continue
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

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class MemoryLog(EventLog):
    """The log held in a Python list; the index is a dict of position lists."""

    def __init__(self, clock: Clock | None = None, events: Iterable[Event] = ()) -> None:
        super().__init__(clock)
        self._events: list[Event] = []
        self._index: dict[str, list[int]] = {}
        for ev in events:
            self.append(ev)

    def _store(self, ev: Event) -> None:
        self._events.append(ev)
        # Exact types, not isinstance(ev, RequestEvent): see types.py.
        if type(ev) is not WorkerJoined and type(ev) is not WorkerLost:
            idx = self._index.get(ev.request_id)
            if idx is None:
                self._index[ev.request_id] = [ev.pos]
            else:
                idx.append(ev.pos)

    def read(self, start: int = 0, stop: int | None = None) -> Iterator[Event]:
        return iter(self._events[start:stop])

    def get(self, pos: int) -> Event:
        return self._events[pos]

    def _positions(self, request_id: str) -> list[int]:
        return self._index.get(request_id, [])

    def _positions_since(self, request_id: str, start: int) -> list[int]:
        idx = self._index.get(request_id, [])
        return idx[bisect.bisect_left(idx, start) :]
