"""Fault injection at an exact event position, and the invariants it checks.

Owns: the fault vocabulary (``parse_fault``: ``worker-lost@P``,
``slow-stage@P:STAGE:MS``, ``cancel@P``), turning faults into a free run
of the trace (``inject``: injected inputs, delayed inputs, a
``DeadlineTimer`` in virtual time, simulated abort acknowledgements), and
``check_invariants`` over any log: exactly one terminal event per request,
nothing routed after it, no event for a lost worker's stage after the loss.

Does not own the replay loop (``freerun.free_run``) or decisions.

Exact meaning of each fault (``P`` is a trace position, as printed by
``omnix replay TRACE --events``).  "Right after P" means after the
recorded input at P and the decisions of its cascade; when P is itself a
decision, after the cascade it belongs to (nothing can come between the
events of one cascade, in a live server either).

``worker-lost@P[:STAGE/REPLICA]``
    Right after P the worker is lost (``WorkerLost``, reason ``injected``,
    at P's timestamp).  The worker defaults to the one event P names: the
    stage/replica of a Routed or stage event, the worker of a worker event.
    From then on its recorded outputs are dropped (a dead process sends
    nothing) until the recording has it join again.  Where the stage's
    ``retry`` allows it (rules v2), the orchestrator migrates the stage to
    another replica as a continuation; the recorded outputs of the lost
    replica from there on are then delivered as the new replica's (a
    continuation produces exactly those), after a simulated StageStarted.
``slow-stage@P:STAGE:MS``
    STAGE stalls for MS milliseconds at P: every recorded input from STAGE
    (started, progress, chunk, finished, failed) at position >= P arrives
    MS later than recorded, and so does every input from the stages
    downstream of it (they work on its output, so they cannot be ahead of
    it).  Upstream stages and worker events keep their times; inputs are
    merged again by time (ties in recorded order).
``cancel@P[:REQUEST]``
    Right after P the client cancels the request of event P (or REQUEST):
    a ``CancelRequested`` (reason ``client``) at P's timestamp.

Every fault run replaces the recorded ``DeadlineExpired`` events by a
``DeadlineTimer`` driven in virtual time (deadlines and stage timeouts
fall due where this run's decisions put them), simulates each abort's
acknowledgement by the worker ``ack_aborts_ms`` after the cancel (unless
the recording has one), and after the last input keeps advancing the
clock to due timers until none is left, so every request ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import assert_never

import msgspec

from omnix.events.reducer import RequestState
from omnix.events.types import (
    TERMINAL_TYPES,
    CancelRequested,
    DeadlineExpired,
    Event,
    Released,
    RequestEvent,
    Routed,
    Scaled,
    SessionChanged,
    StageEvent,
    StageOutputEvent,
    StageStarted,
    WorkerEvent,
    WorkerJoined,
    WorkerLost,
    event_tag,
)
from omnix.pipelines.config import PipelineConfig
from omnix.replay.freerun import FreeRun, Injection, free_run
from omnix.trace import Trace, is_decision
from omnix.traceview.show import describe

__all__ = [
    "FaultError",
    "FaultResult",
    "FaultSpec",
    "Violation",
    "check_invariants",
    "inject",
    "parse_fault",
]

FAULT_SYNTAX = (
    "worker-lost@POSITION[:STAGE/REPLICA], slow-stage@POSITION:STAGE:MS, cancel@POSITION[:REQUEST]"
)


class FaultError(ValueError):
    """A fault spec that is malformed or does not fit the trace."""


class FaultSpec(msgspec.Struct, frozen=True):
    kind: str  # worker-lost | slow-stage | cancel
    position: int
    target: str = ""  # worker id, stage or request id ("" = from the event at position)
    ms: float = 0.0

    def __str__(self) -> str:
        if self.kind == "slow-stage":
            return f"slow-stage@{self.position}:{self.target}:{self.ms:g}"
        return f"{self.kind}@{self.position}" + (f":{self.target}" if self.target else "")


_SPEC = re.compile(r"^(worker-lost|slow-stage|cancel)@(\d+)(?::(.*))?$")


def parse_fault(text: str) -> FaultSpec:
    """``worker-lost@40``, ``worker-lost@40:talker/1``, ``slow-stage@12:talker:250``,
    ``cancel@30``, ``cancel@30:req-1``."""
    m = _SPEC.match(text.strip())
    if m is None:
        raise FaultError(f"cannot read fault {text!r}; the forms are: {FAULT_SYNTAX}")
    kind, pos, rest = m.group(1), int(m.group(2)), m.group(3) or ""
    if kind == "slow-stage":
        stage, sep, ms = rest.rpartition(":")
        try:
            value = float(ms)
        except ValueError:
            value = -1.0
        if not sep or not stage or value < 0:
            raise FaultError(
                f"cannot read fault {text!r}: slow-stage needs a stage and a delay in ms, "
                "e.g. slow-stage@12:talker:250"
            )
        return FaultSpec(kind, pos, stage, value)
    if kind == "worker-lost" and rest and "/" not in rest:
        raise FaultError(
            f"cannot read fault {text!r}: a worker is STAGE/REPLICA, e.g. worker-lost@40:talker/0"
        )
    return FaultSpec(kind, pos, rest)


# --------------------------------------------------------------------------
# Invariants
# --------------------------------------------------------------------------


class Violation(msgspec.Struct, frozen=True):
    rule: str  # one-terminal | nothing-after-terminal | lost-worker-silent
    subject: str  # request or worker id
    position: int
    detail: str


INVARIANTS = {
    "legal-decisions": "every decision the orchestrator made was legal (the reducer took it)",
    "one-terminal": "every request has exactly one terminal event",
    "nothing-after-terminal": "nothing is routed (or appended) for a request after its terminal event",
    "lost-worker-silent": "no event for a lost worker's stage after the loss (until it rejoins)",
}


def check_invariants(events: list[Event], *, require_terminal: bool = True) -> list[Violation]:
    """The lifecycle invariants over a log (replayed or recorded).

    ``require_terminal``: a request without a terminal event is a
    violation (a fault run ends only when every timer has fired, so every
    request must have ended; a recorded trace may stop while some run).
    """
    out: list[Violation] = []
    terminal: dict[str, int] = {}
    seen: dict[str, None] = {}
    lost: dict[str, int] = {}  # worker id -> position of its loss
    for ev in events:
        match ev:
            case WorkerLost():
                lost.setdefault(ev.worker_id, ev.pos)
                continue
            case WorkerJoined():
                lost.pop(ev.worker_id, None)
                continue
            case Released() | SessionChanged() | Scaled():
                continue  # retention's, a session's, scaling's: about no request's own history
            case RequestEvent():
                pass  # below: every request event is held to the rules alike
            case _:
                assert_never(ev)
        rid = ev.request_id
        seen.setdefault(rid, None)
        if rid in terminal:
            rule = "nothing-after-terminal"
            what = "routed" if type(ev) is Routed else event_tag(ev)
            out.append(
                Violation(rule, rid, ev.pos, f"{what} after its terminal event at #{terminal[rid]}")
            )
            if type(ev) in TERMINAL_TYPES:
                out.append(Violation("one-terminal", rid, ev.pos, "a second terminal event"))
            continue
        if type(ev) in TERMINAL_TYPES:
            terminal[rid] = ev.pos
            continue
        if isinstance(ev, StageEvent):
            wid = f"{ev.stage}/{ev.replica}"
            if wid in lost:
                out.append(
                    Violation(
                        "lost-worker-silent",
                        wid,
                        ev.pos,
                        f"{event_tag(ev)} for {rid} after {wid} was lost at #{lost[wid]}",
                    )
                )
    if require_terminal:
        for rid in seen:
            if rid not in terminal:
                out.append(Violation("one-terminal", rid, -1, "never ended"))
    return out


# --------------------------------------------------------------------------
# Injection
# --------------------------------------------------------------------------


@dataclass
class PlannedFault:
    spec: FaultSpec
    description: str


@dataclass
class FaultResult:
    run: FreeRun
    faults: list[PlannedFault]
    violations: list[Violation]
    outcomes: list[tuple[str, str, str]]  # request, recorded outcome, outcome now
    differing_decisions: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self, trace: Trace) -> str:
        t0 = trace.events[0].ts_ns if trace.events else 0
        out = [f"fault injection on {trace.source}"]
        for pf in self.faults:
            out.append(f"  {pf.spec}: {pf.description}")
        out.append("what happened")
        for rid, before, now in self.outcomes:
            change = f"{before} -> {now}" if before != now else f"{now} (as recorded)"
            out.append(f"  {rid}: {change}")
        log_events = list(self.run.log.read())
        for ev in self.run.injected:
            out.append(f"  injected       {describe(ev, t0)}")
        for ev in self.run.timer_fired:
            out.append(f"  timer fired    {describe(ev, t0)}")
        for ev in log_events:
            if type(ev) is Routed and ev.resume:
                out.append(
                    f"  migrated       {describe(ev, t0)}  (the recording's outputs from there "
                    "stand in for the new replica's)"
                )
        for ev in self.run.synthesized:
            if type(ev) is StageStarted:
                out.append(
                    f"  continued      {describe(ev, t0)}  (simulated start of the continuation)"
                )
            else:
                out.append(
                    f"  abort acked    {describe(ev, t0)}  (simulated worker acknowledgement)"
                )
        for ev in log_events:
            if type(ev) in TERMINAL_TYPES:
                out.append(f"  ended          {describe(ev, t0)}")
        real_drops = [d for d in self.run.dropped if type(d.event) is not DeadlineExpired]
        if real_drops:
            out.append(f"  recorded inputs dropped ({len(real_drops)}):")
            for d in real_drops[:20]:
                out.append(f"    {describe(d.event, t0)}  -- {d.reason}")
            if len(real_drops) > 20:
                out.append(f"    ... and {len(real_drops) - 20} more")
        end = log_events[-1].ts_ns if log_events else t0
        out.append(
            f"  {len(log_events)} events in the replayed log ({len(trace.events)} recorded), "
            f"the last at +{(end - t0) / 1e6:.3f}ms"
        )
        out.extend(f"  note: {n}" for n in self.notes)
        out.append("invariants")
        for rule, text in INVARIANTS.items():
            bad = [v for v in self.violations if v.rule == rule]
            mark = "ok  " if not bad else "FAIL"
            out.append(f"  {mark} {text}")
            for v in bad[:10]:
                where = f" at #{v.position}" if v.position >= 0 else ""
                out.append(f"       {v.subject}{where}: {v.detail}")
        out.append(
            "all invariants hold" if self.ok else f"{len(self.violations)} invariant violation(s)"
        )
        return "\n".join(out) + "\n"


def _anchor(events: list[Event], pos: int) -> int:
    """The recorded input whose cascade holds ``pos``."""
    j = pos
    while j > 0 and is_decision(events[j]):
        j -= 1
    return j


def plan(
    trace: Trace, specs: list[FaultSpec]
) -> tuple[list[Injection], dict[str, list[tuple[int, int]]], list[PlannedFault]]:
    """Injections, per-stage delays ``[(from_pos, ns)]`` and descriptions."""
    events = trace.events
    n = len(events)
    t0 = events[0].ts_ns if events else 0
    injections: list[Injection] = []
    delays: dict[str, list[tuple[int, int]]] = {}
    planned: list[PlannedFault] = []
    stages = {st.name: st for st in trace.pipeline.stages}
    for spec in specs:
        if not 0 <= spec.position < n:
            raise FaultError(
                f"fault {spec}: position {spec.position} is outside the trace (0..{n - 1})"
            )
        ev = events[spec.position]
        at = f"right after #{spec.position} ({describe(ev)})"
        if spec.kind == "worker-lost":
            wid = spec.target
            if not wid:
                if isinstance(ev, WorkerEvent):
                    wid = ev.worker_id
                elif isinstance(ev, StageEvent) and ev.stage:
                    wid = f"{ev.stage}/{ev.replica}"
                else:
                    raise FaultError(
                        f"fault {spec}: event #{spec.position} ({event_tag(ev)}) names no worker; "
                        "say which: worker-lost@POSITION:STAGE/REPLICA"
                    )
            stage, _, rep = wid.partition("/")
            if stage not in stages or not rep.isdigit() or int(rep) >= stages[stage].max_replicas:
                raise FaultError(
                    f"fault {spec}: no worker {wid!r} in pipeline {trace.pipeline.name} "
                    f"(workers: {', '.join(f'{s.name}/{r}' for s in trace.pipeline.stages for r in range(s.max_replicas))})"
                )
            lost = WorkerLost(
                worker_id=wid, stage=stage, replica=int(rep), reason="injected", ts_ns=ev.ts_ns
            )
            injections.append(Injection(lost, _anchor(events, spec.position), str(spec), ev.ts_ns))
            planned.append(
                PlannedFault(spec, f"worker {wid} is lost {at}, at +{(ev.ts_ns - t0) / 1e6:.3f}ms")
            )
        elif spec.kind == "cancel":
            rid = spec.target or (ev.request_id if isinstance(ev, RequestEvent) else "")
            if not rid:
                raise FaultError(
                    f"fault {spec}: event #{spec.position} ({event_tag(ev)}) belongs to no "
                    "request; say which: cancel@POSITION:REQUEST"
                )
            if rid not in trace.fold().requests:
                raise FaultError(f"fault {spec}: no request {rid!r} in this trace")
            cancel = CancelRequested(request_id=rid, reason="client", ts_ns=ev.ts_ns)
            injections.append(
                Injection(cancel, _anchor(events, spec.position), str(spec), ev.ts_ns)
            )
            planned.append(PlannedFault(spec, f"the client cancels {rid} {at}"))
        else:
            if spec.target not in stages:
                raise FaultError(
                    f"fault {spec}: no stage {spec.target!r} (stages: {', '.join(stages)})"
                )
            affected = _downstream(trace.pipeline, spec.target)
            for stage in affected:
                delays.setdefault(stage, []).append((spec.position, int(spec.ms * 1_000_000)))
            also = f" (and downstream {', '.join(affected[1:])})" if len(affected) > 1 else ""
            planned.append(
                PlannedFault(
                    spec,
                    f"stage {spec.target}{also} stalls {spec.ms:g} ms from #{spec.position} on: "
                    "outputs from there arrive that much later",
                )
            )
    return injections, delays, planned


def _downstream(cfg: PipelineConfig, stage: str) -> list[str]:
    """``stage`` and every stage its output reaches, in declaration order."""
    reach = {stage}
    changed = True
    while changed:
        changed = False
        for e in cfg.edges:
            if e.source in reach and e.target not in reach:
                reach.add(e.target)
                changed = True
    return [stage] + [st.name for st in cfg.stages if st.name in reach and st.name != stage]


def inject(
    trace: Trace,
    specs: list[FaultSpec | str],
    *,
    pipeline: PipelineConfig | None = None,
    rules: int | None = None,
    ack_aborts_ms: float = 1.0,
) -> FaultResult:
    """Replay ``trace`` with ``specs`` applied; check the invariants."""
    parsed = [parse_fault(s) if isinstance(s, str) else s for s in specs]
    injections, delays, planned = plan(trace, parsed)

    def shift(ev: Event) -> int:
        if not isinstance(ev, StageOutputEvent) or ev.stage not in delays:
            return 0
        return sum(ns for start, ns in delays[ev.stage] if ev.pos >= start)

    run = free_run(
        trace,
        pipeline=pipeline,
        rules=rules,
        injections=injections,
        shift=shift if delays else None,
        timers=True,
        ack_aborts_ms=ack_aborts_ms,
    )
    new_events = list(run.log.read())
    violations = [
        Violation(
            "legal-decisions",
            d.event.request_id if isinstance(d.event, RequestEvent) else "",
            d.event.pos,
            f"{describe(d.event)} refused: {d.reason}",
        )
        for d in run.refused
    ]
    violations += check_invariants(new_events, require_terminal=True)
    rec = trace.fold().requests
    now = run.log.state.requests
    outcomes = []
    for rid in dict.fromkeys([*rec, *now]):
        outcomes.append((rid, _outcome(rec.get(rid)), _outcome(now.get(rid))))
    notes = []
    if not trace.targets:
        notes.append("whole-log trace: every request is replayed")
    return FaultResult(
        run=run, faults=planned, violations=violations, outcomes=outcomes, notes=notes
    )


def _outcome(rs: RequestState | None) -> str:
    if rs is None:
        return "absent"
    if not rs.terminal:
        return f"{rs.status} (no terminal event)"
    return rs.status + (f" ({rs.reason})" if rs.reason else "")
