"""What waits between the log and the runtime, in both directions.

Owns: ``EmitGate``, the ``emit`` a runtime is built with, and ``AckGate``,
the runtime calls that wait for the log's acknowledgement (below).

``EmitGate``  Open, it passes
each event straight to the sequencer.  Closed, it keeps them in order, for
a standby server (``omnix serve --log nats://... --standby``) whose
workers start and join while another server leads the log: the standby
follows the log and may not append, yet its replicas must be ready the
moment it takes over.  ``open`` (at the takeover, after the losses of the
old leader's replicas are in the log) appends what was held, in the order
it came, then passes everything on.

Does not own when a server may append (the lease, ``omnix.http.serve_cluster``)
nor the events themselves (the runtime's).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from omnix.events.log import EventLog, LogClosed
from omnix.events.segments import LogError
from omnix.events.types import Event

log = logging.getLogger("omnix.orchestrator")


class EmitGate:
    """``emit`` for a runtime: passes events on, or holds them until ``open``."""

    def __init__(self, emit: Callable[[Event], None], *, held: bool = False) -> None:
        self._emit = emit
        self._held: list[Event] | None = [] if held else None

    @property
    def holding(self) -> bool:
        return self._held is not None

    def __call__(self, ev: Event) -> None:
        if self._held is not None:
            self._held.append(ev)
        else:
            self._emit(ev)

    def open(self) -> int:
        """Pass on what was held, in order, and everything from now on;
        how many events were held."""
        held, self._held = self._held, None
        for ev in held or ():
            self._emit(ev)
        return len(held or ())


class AckGate:
    """Runtime calls that wait until the log acknowledged the event implying them.

    On a replicated log (``omnix serve --log nats://``) an event is
    appended at once and acknowledged once the stream acked it; a worker
    must not act on one that a takeover could find missing (work the new
    leader's log does not hold).  ``run(pos, call)`` calls at once when
    the event at ``pos`` is acknowledged (always, when the gate is off);
    otherwise it queues the call, in order behind any already queued, and
    a task runs the queue as the log's acknowledgements come.  A log that
    closes or fails drops what is queued: nothing it did not acknowledge
    may be acted on.
    """

    def __init__(self, log: EventLog, *, on: bool) -> None:
        self._log = log
        self._on = on
        self._held: deque[tuple[int, Callable[[], None]]] = deque()
        self._task: asyncio.Task[None] | None = None

    def run(self, pos: int, call: Callable[[], None]) -> None:
        if not self._on or (not self._held and self._log.durable_pos > pos):
            call()
            return
        self._held.append((pos, call))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        held = self._held
        try:
            while held:
                await self._log.flush()
                durable = self._log.durable_pos
                while held and held[0][0] < durable:
                    _, call = held.popleft()
                    call()
        except (LogError, LogClosed) as exc:
            log.warning("dropping %d runtime calls the log never acknowledged: %s", len(held), exc)
            held.clear()
        finally:
            self._task = None
