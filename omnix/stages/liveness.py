"""Whether the stage runtime's workers are alive: heartbeats and the tick.

Owns: ``Liveness``.  Every worker, spawned or not, sends heartbeats from a
thread every ``heartbeat_interval_s``; each is acknowledged (or refused,
for a worker the runtime no longer knows).  A periodic check (the tick)
judges: silence for ``lost_after_s`` (minus one check interval, so the
bound holds) makes a *ready* worker lost.  A spawned worker still loading
its engine is judged by its process and by ``load_timeout_s``, not by
heartbeats: a load can starve its heartbeat thread, and slow to load is not
dead.  Before judging silence the check reads whatever is queued on the
socket, and a check that itself ran late (this process was starved) judges
nobody, so a busy server does not mistake its own lateness for dead
workers.

Does not own what losing a worker does (``runtime.py``'s ``lose``) nor a
spawned process's exit, seen at once through its pidfd (``procs.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from omnix.stages.slots import Slot, SlotTable
from omnix.stages.wire import Wire
from omnix.transport import messages as m

log = logging.getLogger("omnix.runtime")


class Liveness:
    def __init__(
        self,
        slots: SlotTable,
        wire: Wire,
        *,
        heartbeat_interval_s: float,
        lost_after_s: float,
        load_timeout_s: float,
        lose: Callable[[Slot, str], None],
    ) -> None:
        self._slots = slots
        self._wire = wire
        self.load_timeout_s = load_timeout_s
        self._lose = lose
        # Check often enough that silence is judged within the bound.
        self._tick_s = min(heartbeat_interval_s, lost_after_s / 8)
        self._silence_s = lost_after_s - self._tick_s
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._skipped = False
        self._stopped = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._due = time.monotonic() + self._tick_s
        self._handle = loop.call_later(self._tick_s, self._tick, loop)

    def stop(self) -> None:
        self._stopped = True
        if self._handle is not None:
            self._handle.cancel()

    def on_heartbeat(self, identity: bytes, hb: m.Heartbeat) -> None:
        slot = self._slots.by_token.get(hb.token)
        if slot is None:
            self._wire.send_raw(
                identity,
                m.REFUSED,
                m.Refused(
                    "this server does not know the worker (it was declared lost or the server "
                    "restarted); start it again"
                ),
            )
        else:
            slot.last_seen = time.monotonic()
            self._wire.send_raw(identity, m.HEARTBEAT_ACK, m.HeartbeatAck())

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._stopped:
            return
        late = time.monotonic() - self._due
        self._handle = loop.call_later(self._tick_s, self._tick, loop)
        self._due = time.monotonic() + self._tick_s
        assert self._wire.inbox is not None
        self._wire.inbox.drain()  # heartbeats already queued count: our own lateness is not their death
        now = time.monotonic()
        if late > self._tick_s and not self._skipped:
            # This process did not run for a while (a starved server on a
            # loaded machine): heartbeats sent meanwhile may still sit in the
            # kernel, unread by ZMQ's I/O thread.  Judge at the next tick
            # (only one in a row: a loop that is always late still judges).
            self._skipped = True
            log.debug("liveness check ran %.2f s late; judging at the next one", late)
            return
        self._skipped = False
        for slot in self._slots.all():
            self._judge(slot, now)

    def _judge(self, slot: Slot, now: float) -> None:
        proc = slot.proc
        if proc is not None and proc.returncode is None:
            proc.poll()  # no-op with a pidfd; the fallback otherwise
        st = slot.state
        silent = now - slot.last_seen
        if st == "ready" and silent > self._silence_s:
            self._lose(slot, f"no heartbeat for {silent:.1f} s")
        elif st == "joining" and proc is None and silent > self._silence_s:
            # A worker we did not spawn has only its heartbeats.  One we
            # spawned is watched through its process (its death is seen
            # at once) while it loads: the load can starve its heartbeat
            # thread on a loaded machine, and slow to load is not dead.
            log.error(
                "%s went silent for %.1f s while loading its engine; dropping it",
                slot.worker_id,
                silent,
            )
            self._lose(slot, f"no heartbeat for {silent:.1f} s while loading")
        elif st == "joining" and proc is not None and now - slot.welcomed_at > self.load_timeout_s:
            self._lose(
                slot,
                f"did not finish loading its engine within {self.load_timeout_s:.0f} s "
                "(load_timeout_s); killed it",
            )
        elif st == "starting" and now - slot.started_at > self.load_timeout_s:
            self._lose(
                slot,
                f"worker process {slot.pid} did not say hello within "
                f"{self.load_timeout_s:.0f} s (load_timeout_s); killed it",
            )
