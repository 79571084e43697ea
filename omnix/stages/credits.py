"""Per-replica credits: how much work a replica is sent, and when.

Owns: ``Credits``, the runtime's ``send``/``abort``/``release`` and the
return of a credit.  A replica takes at most ``capacity`` requests at once
(its READY says how many); a new request (seq 0) beyond that is refused
loudly (``CapacityExceeded``: an orchestrator bug), except while a released
request still holds a credit until its worker acknowledges the abort: then
the new one waits here (``Slot.deferred``) and starts when a credit comes
back.  Continuation pieces follow their request; pieces for a request the
replica does not run are dropped.  Aborts and releases tell the worker once.

Does not own which replica gets a request nor what a lost replica's
requests become (the orchestrator's), nor how messages reach the wire
(``wire.py``).  Never calls ``emit`` from inside ``send``/``abort``/
``release``: an acknowledgement it makes itself goes out on the next loop
turn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from omnix.events.types import Event, StageFinished
from omnix.stages.errors import CapacityExceeded, ReplicaUnavailable, StageRuntimeError
from omnix.stages.slots import Run, Slot, SlotTable
from omnix.stages.wire import Wire
from omnix.transport import messages as m
from omnix.transport.work import WorkItem

log = logging.getLogger("omnix.runtime")


class Credits:
    def __init__(self, slots: SlotTable, wire: Wire, emit: Callable[[Event], None]) -> None:
        self._slots = slots
        self._wire = wire
        self._emit = emit

    def send(self, work: WorkItem) -> None:
        """Send ``work`` to its replica now (non-blocking).

        Raises ``ReplicaUnavailable`` if the replica is not ready and
        ``CapacityExceeded`` for a seq-0 item beyond its credits: both are
        orchestrator bugs, reported loudly.  A continuation for a request
        the replica does not run (it ended, was aborted or lost) is dropped.
        """
        slot = self._slots.get(work.stage, work.replica)
        if slot.state != "ready":
            raise ReplicaUnavailable(
                f"{slot.where()} is not ready ({slot.state}); route only to replicas with a "
                f"WorkerJoined and no later WorkerLost (request {work.request_id})"
            )
        rid = work.request_id
        run = slot.active.get(rid)
        waiting = slot.deferred.get(rid)
        if waiting is not None:
            waiting.append(work)
            return
        if work.seq == 0:
            if run is not None:
                raise StageRuntimeError(
                    f"request {rid} already runs on {slot.where()}; seq 0 sent twice"
                )
            if len(slot.active) >= slot.capacity:
                self._defer(slot, work)
                return
            slot.active[rid] = Run()
        elif run is None or run.aborted:
            log.debug(
                "dropping piece %d of request %s: not running on %s", work.seq, rid, slot.where()
            )
            return
        else:
            run.next_seq = work.seq + 1
        self._wire.queue(slot, work)

    def _defer(self, slot: Slot, work: WorkItem) -> None:
        """A new request finds every credit taken: wait for one that a
        released request still holds, or refuse it."""
        rid = work.request_id
        draining = sum(1 for r in slot.active.values() if r.released)
        if len(slot.active) - draining >= slot.capacity:
            log.error(
                "over-capacity send refused: %s has %d/%d in flight",
                slot.where(),
                len(slot.active),
                slot.capacity,
            )
            raise CapacityExceeded(
                f"{slot.where()} has capacity {slot.capacity} and {len(slot.active)} requests "
                f"in flight; request {rid} must wait for a StageFinished/StageFailed there "
                "(the orchestrator's queue holds it, not the runtime)"
            )
        slot.deferred[rid] = [work]

    def abort(self, request_id: str, stage: str, replica: int) -> None:
        """Ask the replica to stop ``request_id``; it answers StageFinished(aborted).

        A no-op when the replica does not run the request (already ended, or
        the replica is lost: its WorkerLost already ended the stage).
        """
        slot = self._slots.get(stage, replica)
        if slot.deferred.pop(request_id, None) is not None:
            # Never reached the worker: acknowledge for it, after the caller's
            # cascade (emit is never called from inside abort).
            assert self._wire.loop is not None
            self._wire.loop.call_soon(
                self._emit,
                StageFinished(
                    request_id=request_id,
                    stage=stage,
                    replica=replica,
                    chunks=0,
                    finish_reason="aborted",
                ),
            )
            return
        run = slot.active.get(request_id)
        if run is None or run.aborted or slot.state != "ready":
            return
        run.aborted = True
        self._wire.send_to(slot, m.ABORT, m.Abort(request_id))

    def release(self, request_id: str) -> None:
        """Forget ``request_id`` (call after its terminal event).

        If a replica still runs it (a terminal decision without aborts) it
        is aborted, its credit stays taken until the worker acknowledges,
        and no further events are emitted for it.
        """
        for slot in self._slots.all():
            slot.deferred.pop(request_id, None)
            run = slot.active.get(request_id)
            if run is None:
                continue
            run.released = True
            if not run.aborted and slot.state == "ready":
                run.aborted = True
                self._wire.send_to(slot, m.ABORT, m.Abort(request_id))

    def returned(self, slot: Slot) -> None:
        """A credit came back: start the oldest waiting request(s)."""
        while slot.deferred and len(slot.active) < slot.capacity and slot.state == "ready":
            rid = next(iter(slot.deferred))
            items = slot.deferred.pop(rid)
            run = slot.active[rid] = Run()
            for work in items:
                run.next_seq = work.seq + 1
                self._wire.queue(slot, work)
