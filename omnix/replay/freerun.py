"""Free runs: a trace's recorded inputs through an orchestrator, keeping going.

Owns: ``free_run`` and its result ``FreeRun``: lenient replay under another
config, rules or faults.  Illegal inputs are dropped and listed, faults add
``Injection``s at exact points or times, recorded inputs can be delayed,
and deadline timers and abort acknowledgements can be simulated in
virtual time.  The run is a ``_FreeRunner``: a schedule of typed inputs
ordered by (time, order scheduled), fed one cascade at a time.

Does not own the strict drive (``drive.py``), the comparison with the
recording (``counterfactual.py``), the fault vocabulary and invariants
(``faults.py``) or decisions (``omnix.orchestrator``).

No models, workers, sockets or asyncio: a ``MemoryLog`` on a
``ManualClock``, an ``Orchestrator``, a ``Sequencer`` and optionally a
``DeadlineTimer``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple, assert_never

import msgspec

from omnix.events.clock import ManualClock
from omnix.events.log import MemoryLog
from omnix.events.reducer import IllegalTransition
from omnix.events.types import (
    Admitted,
    CancelRequested,
    DeadlineExpired,
    Event,
    Rejected,
    StageFinished,
    StageOutputEvent,
    StageStarted,
    WorkerJoined,
    WorkerLost,
)
from omnix.orchestrator.decide import Orchestrator
from omnix.orchestrator.sequencer import Sequencer
from omnix.orchestrator.timers import DeadlineTimer
from omnix.pipelines.config import PipelineConfig
from omnix.replay.drive import OrchestratorFactory, default_orchestrator
from omnix.trace import Trace, is_decision

__all__ = ["Dropped", "FreeRun", "Injection", "Origin", "free_run"]

#: What a position of a free run's log holds: ``("in", recorded pos)``,
#: ``("inj", label)``, ``("timer", "")``, ``("ack", "")``, or ``("dec", "")``
#: for the orchestrator's decisions.
Origin = tuple[Literal["in", "inj", "timer", "ack", "dec"], int | str]

_DECISION: Origin = ("dec", "")
_TIMER: Origin = ("timer", "")
_ACK: Origin = ("ack", "")


class Dropped(msgspec.Struct, frozen=True):
    """A recorded input the free run did not apply, and why."""

    event: Event  # as recorded (recorded position)
    reason: str


@dataclass
class Injection:
    """An event a fault adds to the input stream, after recorded input
    ``after`` (-1: before everything), or at ``ts_ns`` when ``after`` is None."""

    event: Event
    after: int | None
    label: str
    ts_ns: int = 0


@dataclass
class FreeRun:
    log: MemoryLog
    pipeline: PipelineConfig
    rules: int
    origin: list[Origin]  # per position of ``log``
    dropped: list[Dropped]
    # Decisions the orchestrator made that the reducer refused (an input
    # stream the rules did not expect): each is a finding, not noise.
    refused: list[Dropped]
    injected: list[Event]
    # made up in fault runs: abort acknowledgements, a continuation's start
    synthesized: list[Event]
    timer_fired: list[Event]


def free_run(
    trace: Trace,
    *,
    pipeline: PipelineConfig | None = None,
    rules: int | None = None,
    orchestrator: OrchestratorFactory | None = None,
    injections: list[Injection] | None = None,
    shift: Callable[[Event], int] | None = None,
    timers: bool = False,
    ack_aborts_ms: float | None = None,
    max_timer_steps: int = 100_000,
) -> FreeRun:
    """Feed the trace's recorded inputs through an orchestrator, keeping
    going where a strict drive would stop.

    * Recorded decisions are not fed: the orchestrator makes its own.
    * An input the replayed state refuses (a chunk for a request that ended,
      a stage routed elsewhere) is dropped and listed in ``dropped``.
    * ``injections`` add inputs at exact points; ``shift(ev)`` delays a
      recorded input by that many ns (inputs are then merged by time, ties
      in recorded order).  Once an injected WorkerLost kills a worker, the
      recorded inputs from it are dropped (a dead process sends nothing)
      until the recording has it join again.
    * ``timers``: recorded DeadlineExpired inputs are dropped and a
      ``DeadlineTimer`` in virtual time appends them where they fall due
      under this run's decisions; after the last input the clock keeps
      advancing to due timers until none is left (at most
      ``max_timer_steps`` firings at a time).
    * ``ack_aborts_ms``: when a request starts cancelling, each active stage
      acknowledges the abort (StageFinished "aborted") that much later in
      virtual time, as a worker would, unless the recording has its own
      acknowledgement for it.
    """
    cfg = pipeline if pipeline is not None else trace.pipeline
    rv = rules if rules is not None else trace.rules_version
    orch = (orchestrator or default_orchestrator)(cfg, rv)
    runner = _FreeRunner(
        trace,
        orch,
        injections=injections or [],
        shift=shift,
        timers=timers,
        ack_after_ns=None if ack_aborts_ms is None else int(ack_aborts_ms * 1_000_000),
        max_timer_steps=max_timer_steps,
    )
    runner.run()
    return FreeRun(
        log=runner.log,
        pipeline=cfg,
        rules=rv,
        origin=runner.origin,
        dropped=runner.dropped,
        refused=runner.refused,
        injected=runner.injected,
        synthesized=runner.synthesized,
        timer_fired=runner.timer_fired,
    )


# --------------------------------------------------------------------------
# The schedule
# --------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class _Recorded:
    """A recorded input, as recorded (the time it is due at may be shifted)."""

    event: Event


@dataclass(slots=True, frozen=True)
class _AbortAck:
    """A worker's acknowledgement of an abort, simulated; ``chunks`` is
    filled in when it is delivered."""

    ack: StageFinished


_Input = _Recorded | Injection | _AbortAck


class _Due(NamedTuple):
    """A scheduled input.  ``order`` counts up as inputs are scheduled, so
    ties in time keep that order (log order for recorded inputs) and the
    input itself is never compared."""

    ts_ns: int
    order: int
    item: _Input


class _FreeRunner:
    """One free run: inputs due in virtual time, each fed with its cascade
    through a ``Sequencer`` over a ``MemoryLog``; what happened to each is
    collected for the ``FreeRun``."""

    def __init__(
        self,
        trace: Trace,
        orch: Orchestrator,
        *,
        injections: list[Injection],
        shift: Callable[[Event], int] | None,
        timers: bool,
        ack_after_ns: int | None,
        max_timer_steps: int,
    ) -> None:
        events = trace.events
        self.clock = ManualClock(events[0].ts_ns if events else 0)
        self.log = MemoryLog(self.clock)
        self.seq = Sequencer(self.log, orch)
        self.timer: DeadlineTimer | None = None
        if timers:
            self.timer = DeadlineTimer(self.seq, self.clock)
            self.timer.attach(None)
        self.max_timer_steps = max_timer_steps
        self.ack_after_ns = ack_after_ns

        self.origin: list[Origin] = []
        self.dropped: list[Dropped] = []
        self.refused: list[Dropped] = []
        self.injected: list[Event] = []
        self.synthesized: list[Event] = []
        self.timer_fired: list[Event] = []

        self.dead: set[str] = set()  # worker ids lost to an injected fault
        self.recorded_acks = {
            (ev.request_id, ev.stage, ev.replica)
            for ev in events
            if type(ev) is StageFinished and ev.finish_reason == "aborted"
        }
        self.acks_scheduled: set[tuple[str, str, int]] = set()

        self._due: list[_Due] = []
        self._order = 0
        self._after: dict[int, list[Injection]] = {}
        for inj in injections:
            if inj.after is None:
                self._schedule(inj.ts_ns, inj)
            else:
                self._after.setdefault(inj.after, []).append(inj)
        for ev in events:
            if not is_decision(ev):
                self._schedule(ev.ts_ns + (shift(ev) if shift is not None else 0), _Recorded(ev))
        if ack_after_ns is not None:
            self.log.add_listener(self._on_append)

    def run(self) -> None:
        self._inject_after(-1)
        while self._due:
            ts, _, item = heapq.heappop(self._due)
            self._fire_timers(until=ts)
            self.clock.set(max(ts, self.clock.now_ns()))
            match item:
                case _Recorded(event=ev):
                    self._deliver_recorded(ev, ts)
                case Injection():
                    self._inject(msgspec.structs.replace(item.event, ts_ns=ts), item.label)
                case _AbortAck(ack=ack):
                    self._deliver_ack(ack, ts)
                case _:
                    assert_never(item)
        self._fire_timers(until=None)

    def _schedule(self, ts_ns: int, item: _Input) -> None:
        heapq.heappush(self._due, _Due(ts_ns, self._order, item))
        self._order += 1

    # -- delivering inputs ---------------------------------------------------

    def _deliver_recorded(self, ev: Event, ts: int) -> None:
        if self.timer is not None and type(ev) is DeadlineExpired:
            self.dropped.append(Dropped(ev, "replaced by the virtual-time deadline timer"))
        elif self.dead and _from_dead_worker(ev, self.dead):
            moved = self._continued(ev, ts)
            if moved is None:
                self.dropped.append(Dropped(ev, "its worker was lost (injected fault)"))
            else:
                self._feed(moved, ("in", ev.pos))
        else:
            self._feed(
                msgspec.structs.replace(ev, ts_ns=ts) if ts != ev.ts_ns else ev, ("in", ev.pos)
            )
            if type(ev) is WorkerJoined:
                self.dead.discard(ev.worker_id)
        self._inject_after(ev.pos)

    def _continued(self, ev: Event, ts: int) -> Event | None:
        """A dead worker's recorded output for a stage this run moved to
        another replica (a continuation): the same output, as the new
        replica's.  A continuation produces exactly what the lost replica
        would have from there on (``Resume``), so the recording stands in
        for it.  Its first output is preceded by a simulated StageStarted.
        None when the stage was not moved (or is waiting for a replica)."""
        if not isinstance(ev, StageOutputEvent):
            return None
        rs = self.log.state.requests.get(ev.request_id)
        st = rs.stage(ev.stage) if rs is not None else None
        if st is None or not st.active or st.replica == ev.replica or st.attempt < 2:
            return None
        if f"{st.name}/{st.replica}" in self.dead:
            return None
        if st.status == "routed" and type(ev) is not StageStarted:
            started = StageStarted(
                request_id=ev.request_id, stage=st.name, replica=st.replica, ts_ns=ts
            )
            at = self._feed(started, _ACK)
            if at >= 0:
                self.synthesized.append(self.log.get(at))
        return msgspec.structs.replace(ev, replica=st.replica, ts_ns=ts, pos=-1)

    def _inject_after(self, pos: int) -> None:
        """The injections anchored right after recorded input ``pos``."""
        for inj in self._after.pop(pos, []):
            ts = max(inj.event.ts_ns, self.clock.now_ns())
            self._inject(msgspec.structs.replace(inj.event, ts_ns=ts), inj.label)

    def _inject(self, ev: Event, label: str) -> None:
        at = self._feed(ev, ("inj", label))
        if at >= 0:
            self.injected.append(self.log.get(at))
            if type(ev) is WorkerLost:
                self.dead.add(ev.worker_id)

    def _deliver_ack(self, ack: StageFinished, ts: int) -> None:
        """The simulated acknowledgement, if its stage is still active."""
        rs = self.log.state.requests.get(ack.request_id)
        if rs is None or rs.terminal:
            return
        st = rs.stage(ack.stage)
        if st is None or not st.active:
            return
        at = self._feed(msgspec.structs.replace(ack, chunks=st.chunks, ts_ns=ts), _ACK)
        if at >= 0:
            self.synthesized.append(self.log.get(at))

    def _feed(self, ev: Event, origin: Origin) -> int:
        """Append one input and its cascade; its position, or -1 if refused."""
        log = self.log
        start = log.next_pos
        try:
            if type(ev) is Admitted or type(ev) is Rejected:
                self.seq.submit(ev.request_id, ev.spec, ev.ts_ns)
            else:
                self.seq.append(msgspec.structs.replace(ev, pos=-1))
        except IllegalTransition as exc:
            if log.next_pos > start:
                # The input went in, but a decision of its cascade was
                # refused by the reducer: the orchestrator decided something
                # illegal.  The rest of that cascade is lost; keep going.
                self._note(start, origin)
                self.refused.append(Dropped(exc.event, str(exc)))
                return start
            if origin[0] == "in":
                self.dropped.append(Dropped(ev, exc.reason))
            return -1
        self._note(start, origin)
        return start

    def _note(self, start: int, origin: Origin) -> None:
        """The origin of the input at ``start`` and of the decisions after it."""
        for p in range(start, self.log.next_pos):
            self.origin.append(origin if p == start else _DECISION)

    # -- virtual time ----------------------------------------------------------

    def _fire_timers(self, until: int | None) -> None:
        """Advance the clock to each timer due by ``until`` (None: every one)
        and fire it."""
        timer = self.timer
        if timer is None:
            return
        log = self.log
        for _ in range(self.max_timer_steps):
            due = timer.next_due()
            if due is None or (until is not None and due > until):
                return
            self.clock.set(max(due, self.clock.now_ns()))
            start = log.next_pos
            timer.fire_due()
            for p in range(start, log.next_pos):
                ev = log.get(p)
                if type(ev) is DeadlineExpired:
                    self.timer_fired.append(ev)
                    self.origin.append(_TIMER)
                else:
                    self.origin.append(_DECISION)

    def _on_append(self, ev: Event) -> None:
        """Log listener: when a request starts cancelling, schedule each
        active stage's acknowledgement of the abort."""
        if type(ev) is not CancelRequested or self.ack_after_ns is None:
            return
        rs = self.log.state.requests[ev.request_id]
        if rs.cancel_pos != ev.pos:
            return  # a second cancel changes nothing
        for st in rs.active_stages():
            key = (ev.request_id, st.name, st.replica)
            if key in self.recorded_acks or key in self.acks_scheduled:
                continue
            self.acks_scheduled.add(key)
            ack = StageFinished(
                request_id=ev.request_id,
                stage=st.name,
                replica=st.replica,
                chunks=0,
                finish_reason="aborted",
            )
            self._schedule(ev.ts_ns + self.ack_after_ns, _AbortAck(ack))


def _from_dead_worker(ev: Event, dead: set[str]) -> bool:
    """Whether ``ev`` came from a worker in ``dead`` (its loss, or output of
    its stage replica); a WorkerJoined is its restart, not from the dead."""
    if type(ev) is WorkerLost:
        return ev.worker_id in dead
    if isinstance(ev, StageOutputEvent):
        return f"{ev.stage}/{ev.replica}" in dead
    return False
