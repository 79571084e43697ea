"""The stage runtime's side of scaling: carrying out ``Scaled`` events.

Owns: ``ReplicaScaling``.  A ``start`` spawns the replica's worker through
the runtime's spawner (as at start-up: local processes, or whatever
launcher stands behind the same ``spawn``); a ``drain`` of a replica not
ready yet stops its worker at once (nothing ran there, nothing joined); a
ready one is marked draining and, once it runs nothing (no request
active, none waiting for its credit), is told to stop (``SHUTDOWN``).
Its worker's goodbye or exit is then ``Scaled(op="left")``, not a
``WorkerLost``: nothing moves, nothing restarts it.  A draining replica
that dies while it still runs requests is lost as any replica is (its
requests move), and not restarted either.  Also ``check_scaling``: a
stage that scales must be one the runtime starts.

Does not own when to scale (``omnix.orchestrator.scaling``: decisions
from the log), routing (the orchestrator gives a draining replica no new
request) nor processes (``spawner.py``).  Never emits from inside
``scale`` (the Dispatcher calls it inside a cascade).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

from omnix.events.types import Event, Scaled, WorkerLost
from omnix.pipelines.config import PipelineConfig
from omnix.stages.errors import RuntimeConfigError
from omnix.stages.launcher import Launcher
from omnix.stages.slots import ReplicaProcess, Slot, SlotTable
from omnix.stages.wire import Wire
from omnix.transport import messages as m

log = logging.getLogger("omnix.runtime")


def check_scaling(pipeline: PipelineConfig, spawned: Collection[str]) -> None:
    """A stage that scales (``replicas = {min, max}``) must be started by
    the runtime: it cannot start a hand-started stage's workers."""
    for st in pipeline.stages:
        if st.scaling is not None and st.name not in spawned:
            raise RuntimeConfigError(
                f"stage {st.name!r} scales (replicas = {{min = {st.scaling.min}, max = "
                f"{st.scaling.max}}}) but its workers are started by hand (--spawn): the "
                "server starts the replicas of a stage that scales; spawn it, or give it a "
                "fixed count"
            )


class ReplicaScaling:
    def __init__(
        self,
        slots: SlotTable,
        wire: Wire,
        spawner: Launcher,
        *,
        emit: Callable[[Event], None],
        changed: Callable[[], None],
        running: Callable[[], bool],
        grace_s: float,
    ) -> None:
        self._slots = slots
        self._wire = wire
        self._spawner = spawner
        self._emit = emit
        self._changed = changed
        self._running = running
        self.grace_s = grace_s
        self.loop: asyncio.AbstractEventLoop | None = None  # set once the runtime binds

    def scale(self, ev: Scaled) -> None:
        """Start or drain ``ev``'s replica (see the module docstring)."""
        slot = self._slots.get(ev.stage, ev.replica)
        if ev.op == "start":
            slot.wanted = True
            slot.draining = False
            if self._running() and slot.state == "down":
                if slot.restart_handle is not None:
                    slot.restart_handle.cancel()
                slot.failures = 0
                self._spawner.spawn(slot)
            return
        if ev.op != "drain":
            return  # "left" is this runtime's own report
        slot.wanted = False
        if slot.state == "ready":
            slot.draining = True
            if self.loop is not None:
                self.loop.call_soon(self.leave_if_idle, slot)
            return
        if slot.restart_handle is not None:
            slot.restart_handle.cancel()
            slot.restart_handle = None
        self._slots.unbind(slot)
        slot.state = "down"
        slot.failures = 0
        self._spawner.stop(slot)
        self._changed()

    def leave_if_idle(self, slot: Slot) -> None:
        """A draining replica that runs nothing is told to stop."""
        if not slot.draining or slot.state != "ready" or slot.active or slot.deferred:
            return
        if slot.identity is not None:
            self._wire.send_raw(slot.identity, m.SHUTDOWN, m.Shutdown("drained"))

    def gone(self, slot: Slot, reason: str) -> None:
        """A draining replica's worker is gone (goodbye, exit, silence):
        ``left`` when it ran nothing, else lost; never restarted."""
        busy = bool(slot.active)
        was_ready = slot.state == "ready"
        self._slots.unbind(slot)
        slot.state = "down"
        slot.draining = False
        slot.active.clear()
        slot.deferred.clear()
        slot.outbox.clear()
        proc = slot.proc
        if proc is not None and proc.returncode is None and self.loop is not None:
            # It said goodbye and is exiting: it gets the shutdown grace.
            self.loop.call_later(self.grace_s, _kill_if_running, proc)
        if was_ready and busy:
            log.warning("lost draining %s: %s", slot.worker_id, reason)
            self._emit(
                WorkerLost(
                    worker_id=slot.worker_id, stage=slot.stage, replica=slot.replica, reason=reason
                )
            )
        elif was_ready:
            log.info("%s drained and left", slot.worker_id)
            self._emit(
                Scaled(
                    stage=slot.stage, replica=slot.replica, op="left", replicas=-1, reason="drained"
                )
            )
        self._changed()


def _kill_if_running(proc: ReplicaProcess) -> None:
    if proc.poll() is None:
        proc.kill()
