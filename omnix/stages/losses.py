"""What losing a replica means to the stage runtime.

Owns: ``Losses``, the one place a replica's worker is given up on, however
that was learned (its process exited, its heartbeats stopped, its engine
could not load, it said goodbye, a send to it failed): its slot is
cleaned up and unbound, a worker still alive is killed (no ghost beside
its replacement), a ready one becomes ``WorkerLost``, and a spawned one is
restarted through the launcher, unless start-up is under way and it
failed ``start_attempts`` starts in a row or its engine said why it cannot
load: then the error ``start()`` fails with is recorded here
(``errors``).  A draining replica's end is the scaling's
(``ReplicaScaling.gone``), not a loss.

Does not own noticing a loss (``liveness.py``, the launchers' process
watch, ``wire.py``), restarting's backoff (the launchers), nor what
happens to the lost replica's requests (the orchestrator, from
``WorkerLost``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from omnix.events.types import Event, WorkerLost
from omnix.stages.launcher import Launcher, ReplicaProcess
from omnix.stages.scaling import ReplicaScaling
from omnix.stages.slots import Slot, SlotTable
from omnix.transport import messages as m

log = logging.getLogger("omnix.runtime")


class Losses:
    """Gives up on replicas (see the module docstring)."""

    def __init__(
        self,
        slots: SlotTable,
        spawner: Launcher,
        scaling: ReplicaScaling,
        *,
        restart: bool,
        start_attempts: int,
        emit: Callable[[Event], None],
        changed: Callable[[], None],
        closed: Callable[[], bool],
    ) -> None:
        self._slots = slots
        self._spawner = spawner
        self._scaling = scaling
        self.restart = restart
        self.start_attempts = start_attempts
        self._emit = emit
        self._changed = changed
        self._closed = closed
        #: ``start()`` waits for its replicas: a failed start counts towards
        #: ``start_attempts``, and what gives up is recorded in ``errors``
        self.starting = False
        #: why start-up failed, one line per replica ("" when none did)
        self.errors: list[str] = []

    def lose(self, slot: Slot, reason: str, detail: str = "", *, restart: bool = True) -> None:
        """The slot's worker is gone (or disowned): emit, clean up, restart.

        ``detail`` (how it ended and its last output) goes into start-up
        errors and logs, ``reason`` into ``WorkerLost``."""
        if slot.state == "down":
            return
        if slot.draining:
            self._scaling.gone(slot, reason)
            return
        was_ready = slot.state == "ready"
        self._slots.unbind(slot)
        slot.state = "down"
        slot.active.clear()  # its requests are lost; the reducer marks their stages
        slot.deferred.clear()
        slot.outbox.clear()
        if slot.proc is not None and slot.proc.returncode is None:
            # Alive but silent (hung, stopped, partitioned) or too slow to
            # load: make sure it can never come back as a ghost next to its
            # replacement.
            slot.proc.kill()
        if was_ready:
            log.warning("lost %s: %s", slot.worker_id, reason)
            self._emit(
                WorkerLost(
                    worker_id=slot.worker_id, stage=slot.stage, replica=slot.replica, reason=reason
                )
            )
            slot.failures = 0
        else:
            slot.failures += 1
            slot.last_failure = detail or reason
        self._changed()
        if slot.proc is None or self._closed():
            return  # hand-started: restarting it is its process manager's job
        if not restart or not self.restart:
            if self.starting:
                self.errors.append(f"{slot.where()} did not come up: {detail or reason}")
            return
        if self.starting and not was_ready and slot.failures >= self.start_attempts:
            self.errors.append(
                f"{slot.where()} did not come up ({slot.failures} failed starts in a row); the last: "
                f"{slot.last_failure}"
            )
            return
        if not was_ready:
            log.error("%s failed to start: %s", slot.worker_id, slot.last_failure)
        self._spawner.schedule_restart(slot)

    def on_proc_exit(self, proc: ReplicaProcess) -> None:
        slot = next((s for s in self._slots.all() if s.proc is proc), None)
        if slot is None or self._closed() or slot.state == "down":
            return  # not ours any more, or already handled (lost by heartbeat, then killed)
        why = proc.describe_exit()
        when = "" if slot.state == "ready" else " before it was ready"
        self.lose(slot, why, f"{why}{when}; its last output:\n{proc.last_output()}")

    def on_start_failed(self, identity: bytes, msg: m.StartFailed) -> None:
        slot = self._slots.by_identity.get(identity)
        if slot is None or slot.token != msg.token:
            return
        text = f"{slot.where()} could not load its engine: {msg.message}"
        if self.starting:
            # The engine said why: a missing model or a bad argument, which a
            # restart would only repeat.  Fail start-up with its own words.
            self.errors.append(text)
            self.lose(slot, text, restart=False)
        else:
            self.lose(slot, text)

    def on_goodbye(self, identity: bytes, msg: m.Goodbye) -> None:
        slot = self._slots.by_identity.get(identity)
        if slot is not None and slot.token == msg.token:
            self.lose(slot, f"worker exited: {msg.reason}")
