"""Drive: the real orchestrator against a trace's recorded inputs.

Owns: ``drive`` (strict replay: every decision must come out byte for byte
as recorded, else a ``Divergence`` naming the first differing event, the
cascade that produced it and the inputs before it, as Temporal's replayer
reports non-determinism), ``free_run`` (lenient replay under another
config, rules or faults: illegal inputs are dropped and listed, timers and
abort acknowledgements can be simulated in virtual time) and
``counterfactual`` (a free run compared decision by decision with the
recording).

Does not own the decisions (``omnix.orchestrator.decide``), the append
loop (``Sequencer``), the fault vocabulary and invariants (``faults.py``)
or presentation (``show.py``).

No models, workers, sockets or asyncio: a ``MemoryLog`` on a
``ManualClock``, an ``Orchestrator`` and a ``Sequencer``.  Inputs are fed in
recorded order with their recorded ``ts_ns``; admissions go through
``Sequencer.submit`` because admitting is itself a decision.
"""

from __future__ import annotations

import difflib
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from omnix.events.clock import ManualClock
from omnix.events.log import MemoryLog
from omnix.events.reducer import Fold, IllegalTransition, RequestState, fold
from omnix.events.types import (
    Admitted,
    Cancelled,
    CancelRequested,
    DeadlineExpired,
    Event,
    Failed,
    Finished,
    Rejected,
    RequestEvent,
    Routed,
    StageFinished,
    WorkerJoined,
    WorkerLost,
    event_tag,
)
from omnix.orchestrator.decide import RULES_VERSION, Orchestrator
from omnix.orchestrator.sequencer import Sequencer
from omnix.orchestrator.timers import DeadlineTimer
from omnix.pipelines.config import PipelineConfig
from omnix.replay.show import describe
from omnix.trace import Trace, is_decision

__all__ = [
    "Counterfactual",
    "Divergence",
    "DivergenceContext",
    "DriveResult",
    "Dropped",
    "FreeRun",
    "counterfactual",
    "drive",
    "free_run",
]

OrchestratorFactory = Callable[[PipelineConfig, int], Orchestrator]


def _default_factory(pipeline: PipelineConfig, rules: int) -> Orchestrator:
    return Orchestrator(pipeline, rules=rules)


# --------------------------------------------------------------------------
# Strict drive
# --------------------------------------------------------------------------


@dataclass
class DivergenceContext:
    """What led to a divergence.

    ``kind``: ``different`` (a decision with other contents), ``missing``
    (the recording has a decision the orchestrator did not make), ``extra``
    (the orchestrator made a decision the recording does not have),
    ``admission`` (admitted vs rejected), ``refused`` (a recorded input the
    replayed state does not allow).
    """

    kind: str
    trigger: Event | None  # the input whose cascade diverged
    cause_chain: list[Event]  # the expected (else actual) event's causes, nearest first
    recent_inputs: list[Event]  # the inputs before the trigger, oldest first
    request_state: RequestState | None  # the request's state before the divergent event
    produced: list[Event]  # what the replayed cascade appended (its decisions)
    recorded: list[Event]  # what the recording has for that cascade
    t0: int = 0
    refusal: str = ""  # the reducer's reason, for kind == "refused"


class Divergence(Exception):
    """The replayed orchestrator decided differently from the recording."""

    def __init__(
        self,
        position: int,
        expected: Event | None,
        actual: Event | None,
        context: DivergenceContext,
        *,
        trace: Trace,
        rules: int,
        pipeline_changed: bool,
    ) -> None:
        self.position = position
        self.expected = expected
        self.actual = actual
        self.context = context
        self.trace_source = trace.source
        self.rules = rules
        self.trace_rules = trace.rules_version
        self.trace_omnix = trace.omnix_version
        self.pipeline_changed = pipeline_changed
        super().__init__(self.summary())

    def summary(self) -> str:
        what = {
            "different": "the orchestrator made a different decision",
            "missing": "the orchestrator did not make a recorded decision",
            "extra": "the orchestrator made a decision the recording does not have",
            "admission": "admission came out differently",
            "refused": "the reducer refused an event (a recorded input, or a decision)",
        }[self.context.kind]
        return f"divergence at position {self.position}: {what}"

    def report(self) -> str:
        """A multi-line report: both events, what caused them, the inputs
        before them, the request's state and what to do."""
        c = self.context
        t0 = c.t0
        none = "(nothing: the cascade ended here)"
        lines = [
            f"{self.trace_source}: {self.summary()}",
            f"  expected (recorded): {describe(self.expected, t0) if self.expected else none}",
            f"  actual   (replayed): {describe(self.actual, t0) if self.actual else none}",
        ]
        if self.expected is not None and self.actual is not None:
            diff = _field_diff(self.expected, self.actual)
            if diff:
                lines.append(f"  differs in: {diff}")
        if c.refusal:
            lines.append(f"  refused because: {c.refusal}")
        if c.trigger is not None:
            lines.append(f"  in the cascade of input: {describe(c.trigger, t0)}")
        if c.recorded or c.produced:
            lines.append("  that cascade, recorded vs replayed:")
            n = max(len(c.recorded), len(c.produced))
            for i in range(n):
                r = describe(c.recorded[i], t0) if i < len(c.recorded) else "-"
                p = describe(c.produced[i], t0) if i < len(c.produced) else "-"
                mark = "  " if r == p else "≠ "
                lines.append(f"    {mark}recorded {r}")
                if r != p:
                    lines.append(f"      replayed {p}")
        if c.cause_chain:
            lines.append("  cause chain (recorded):")
            for ev in c.cause_chain:
                lines.append(f"    <- {describe(ev, t0)}")
        if c.recent_inputs:
            lines.append(f"  last {len(c.recent_inputs)} inputs before it:")
            for ev in c.recent_inputs:
                lines.append(f"    {describe(ev, t0)}")
        if c.request_state is not None:
            lines.append(f"  request state before it: {_state_line(c.request_state)}")
        lines.append("  what it means: " + self._advice())
        return "\n".join(lines)

    def _advice(self) -> str:
        if self.context.kind == "refused" and self.actual is not None and is_decision(self.actual):
            return (
                "the orchestrator made a decision the reducer refuses.  A live server drops it "
                "inside the cascade (Sequencer.emit counts it in `dropped`), so a recording of "
                "the same run lacks it too and the rest of that cascade is lost: this is a bug "
                "in the decision logic (omnix/orchestrator/decide.py), not in the trace"
            )
        if self.pipeline_changed:
            return (
                "the trace was driven under a different pipeline config, so different "
                "decisions are expected; use --config/--set without --drive for a "
                "counterfactual report"
            )
        if self.rules != self.trace_rules:
            return (
                f"the trace was recorded under rules v{self.trace_rules} and driven under "
                f"v{self.rules}"
            )
        return (
            f"the decision logic changed since this trace was captured (omnix "
            f"{self.trace_omnix}, rules v{self.trace_rules}).  If the change is a bug, fix it. "
            "If it is intended, bump RULES_VERSION in omnix/orchestrator/decide.py and keep "
            f"the v{self.trace_rules} behaviour behind `self.rules` so recorded traces still "
            "replay, then recapture the corpus (docs/replay.md)"
        )


def _field_diff(a: Event, b: Event) -> str:
    if type(a) is not type(b):
        return f"type {event_tag(a)} vs {event_tag(b)}"
    parts = []
    for name in a.__struct_fields__:
        va, vb = getattr(a, name), getattr(b, name)
        if va != vb:
            parts.append(f"{name}: {va!r} vs {vb!r}")
    return "; ".join(parts)


def _state_line(rs: RequestState) -> str:
    stages = ", ".join(
        f"{st.name}/{st.replica} {st.status} ({st.chunks} chunks, {st.pieces} pieces"
        f"{', input closed' if st.input_closed else ''})"
        for st in rs.stages
    )
    return f"{rs.request_id} {rs.status}" + (f"; stages: {stages}" if stages else "; no stage routed")


@dataclass
class DriveResult:
    """The outcome of ``drive``.  ``divergence`` is None when every
    decision matched; ``log`` is the replayed log (up to the divergence)."""

    events: int  # trace events checked
    inputs: int
    decisions: int
    digest: str  # of the replayed log's fold
    log: MemoryLog
    divergence: Divergence | None = None

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def check(self) -> DriveResult:
        if self.divergence is not None:
            raise self.divergence
        return self


_encode = msgspec.msgpack.Encoder().encode


def drive(
    trace: Trace,
    *,
    pipeline: PipelineConfig | None = None,
    rules: int | None = None,
    orchestrator: OrchestratorFactory | None = None,
    raise_on_divergence: bool = True,
    context_inputs: int = 6,
) -> DriveResult:
    """Re-derive every decision of ``trace`` and compare it with the record.

    Runs ``Orchestrator(trace.pipeline, rules=trace.rules_version)`` (or the
    given ``pipeline``/``rules``/factory) and a ``Sequencer`` over a
    ``MemoryLog``.  Stops at the first mismatch: raises ``Divergence`` or,
    with ``raise_on_divergence=False``, returns it in the result.
    """
    cfg = pipeline if pipeline is not None else trace.pipeline
    rv = rules if rules is not None else trace.rules_version
    if rv > RULES_VERSION:
        raise ValueError(
            f"{trace.source} was recorded under decision rules v{rv}, newer than this omnix "
            f"(v{RULES_VERSION}); replay it with the omnix that captured it "
            f"({trace.omnix_version}) or newer"
        )
    orch = (orchestrator or _default_factory)(cfg, rv)
    log = MemoryLog(ManualClock(0))
    seq = Sequencer(log, orch)
    stored = log._events  # the replayed events; read in place on the hot path
    events = trace.events
    n = len(events)
    decision_set = (Routed, Cancelled, Failed, Finished)
    inputs = decisions = 0
    i = 0
    div: Divergence | None = None

    def diverge(pos: int, expected: Event | None, actual: Event | None, kind: str, trig: int) -> Divergence:
        return _divergence(
            trace, log, pos, expected, actual, kind, trig, rv, cfg is not trace.pipeline, context_inputs
        )

    while i < n:
        ev = events[i]
        cls = type(ev)
        if cls in decision_set or (cls is CancelRequested and ev.cause >= 0):  # type: ignore[union-attr]
            # A recorded decision with no input before it in this cascade:
            # the previous cascade stopped short of it.
            div = diverge(i, ev, None, "missing", _input_before(events, i))
            break
        inputs += 1
        if cls is Admitted or cls is Rejected:
            got = seq.submit(ev.request_id, ev.spec, ev.ts_ns)  # type: ignore[union-attr]
            if type(got) is not cls or _encode(got) != _encode(ev):
                div = diverge(i, ev, got, "admission", i)
                break
        else:
            try:
                seq.append(ev)
            except IllegalTransition as exc:
                if len(stored) > i:
                    # The input went in; a decision of its cascade was
                    # refused: the orchestrator decided something illegal.
                    at = exc.event.pos
                    exp = events[at] if at < n else None
                    div = diverge(at, exp, exc.event, "refused", i)
                else:
                    div = diverge(i, ev, None, "refused", i)
                div.context.refusal = str(exc)
                break
        after = len(stored)
        j = i + 1
        k = j
        while j < n:
            exp = events[j]
            ecls = type(exp)
            if not (ecls in decision_set or (ecls is CancelRequested and exp.cause >= 0)):  # type: ignore[union-attr]
                break
            if k >= after:
                div = diverge(j, exp, None, "missing", i)
                break
            act = stored[k]
            if _encode(act) != _encode(exp):
                div = diverge(j, exp, act, "different", i)
                break
            j += 1
            k += 1
        if div is not None:
            break
        if k < after:
            div = diverge(k, events[j] if j < n else None, stored[k], "extra", i)
            break
        decisions += j - i - 1
        i = j

    result = DriveResult(
        events=i if div is None else div.position,
        inputs=inputs,
        decisions=decisions,
        digest=log.state.digest(),
        log=log,
        divergence=div,
    )
    if div is None and result.digest != trace.digest and cfg is trace.pipeline:
        # Every event matched, so the folds must agree; if not, the reducer
        # folds the same events differently from the one that wrote the trace.
        raise AssertionError(
            f"{trace.source}: every decision matched but the replayed state digest "
            f"{result.digest} differs from the recorded {trace.digest}"
        )  # pragma: no cover
    if div is not None and raise_on_divergence:
        raise div
    return result


def _input_before(events: list[Event], i: int) -> int:
    j = i - 1
    while j > 0 and is_decision(events[j]):
        j -= 1
    return max(j, 0)


def _divergence(
    trace: Trace,
    log: MemoryLog,
    pos: int,
    expected: Event | None,
    actual: Event | None,
    kind: str,
    trigger_pos: int,
    rules: int,
    pipeline_changed: bool,
    n_inputs: int,
) -> Divergence:
    events = trace.events
    trigger = events[trigger_pos] if 0 <= trigger_pos < len(events) else None
    # The cascade as recorded and as replayed.
    recorded: list[Event] = []
    j = trigger_pos + 1
    while j < len(events) and is_decision(events[j]):
        recorded.append(events[j])
        j += 1
    produced = [ev for ev in log.read(trigger_pos + 1) if is_decision(ev)] if trigger else []
    # Causes of the expected event (else the actual one), through the recording.
    chain: list[Event] = []
    probe = expected if expected is not None else actual
    seen = set()
    while probe is not None:
        c = getattr(probe, "cause", -1)
        if c < 0 or c in seen or c >= len(events):
            break
        seen.add(c)
        probe = events[c]
        chain.append(probe)
    recent: list[Event] = []
    j = trigger_pos - 1
    while j >= 0 and len(recent) < n_inputs:
        if not is_decision(events[j]):
            recent.append(events[j])
        j -= 1
    recent.reverse()
    rid = getattr(expected, "request_id", None) or getattr(actual, "request_id", None)
    state = None
    if rid is not None:
        before = fold(events[:pos]) if pos <= len(events) else Fold()
        state = before.requests.get(rid)
    ctx = DivergenceContext(
        kind=kind,
        trigger=trigger,
        cause_chain=chain,
        recent_inputs=recent,
        request_state=state,
        produced=produced,
        recorded=recorded,
        t0=events[0].ts_ns if events else 0,
    )
    return Divergence(
        pos, expected, actual, ctx, trace=trace, rules=rules, pipeline_changed=pipeline_changed
    )


# --------------------------------------------------------------------------
# Free runs: other configs, other rules, faults
# --------------------------------------------------------------------------


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
    # New position -> what it was: ("in", recorded pos), ("inj", label),
    # ("timer", ""), ("ack", ""), or ("dec", "") for decisions.
    origin: list[tuple[str, object]]
    dropped: list[Dropped]
    # Decisions the orchestrator made that the reducer refused (an input
    # stream the rules did not expect): each is a finding, not noise.
    refused: list[Dropped]
    injected: list[Event]
    synthesized: list[Event]  # abort acknowledgements made up in fault runs
    timer_fired: list[Event]


_WORKER_SIDE = ("stage_started", "progress", "chunk", "stage_finished", "stage_failed")


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
      advancing to due timers until none is left.
    * ``ack_aborts_ms``: when a request starts cancelling, each active stage
      acknowledges the abort (StageFinished "aborted") that much later in
      virtual time, as a worker would, unless the recording has its own
      acknowledgement for it.
    """
    cfg = pipeline if pipeline is not None else trace.pipeline
    rv = rules if rules is not None else trace.rules_version
    orch = (orchestrator or _default_factory)(cfg, rv)
    events = trace.events
    clock = ManualClock(events[0].ts_ns if events else 0)
    log = MemoryLog(clock)
    seq = Sequencer(log, orch)
    timer: DeadlineTimer | None = None
    if timers:
        timer = DeadlineTimer(seq, clock)
        timer.attach(None)
    origin: list[tuple[str, object]] = []
    dropped: list[Dropped] = []
    refused: list[Dropped] = []
    injected: list[Event] = []
    synthesized: list[Event] = []
    timer_fired: list[Event] = []
    recorded_acks = {
        (ev.request_id, ev.stage, ev.replica)
        for ev in events
        if type(ev) is StageFinished and ev.finish_reason == "aborted"
    }
    dead: set[str] = set()

    # The input schedule: (ts, order, kind, payload).  Kind 0: recorded
    # input; 1: injection; 2: synthesized ack.  ``order`` keeps ties in the
    # order they were scheduled, which for recorded inputs is log order.
    sched: list[tuple[int, int, int, object]] = []
    order = 0
    after_map: dict[int, list[Injection]] = {}
    for inj in injections or []:
        if inj.after is None:
            sched.append((inj.ts_ns, order, 1, inj))
            order += 1
        else:
            after_map.setdefault(inj.after, []).append(inj)
    for ev in events:
        if is_decision(ev):
            continue
        ts = ev.ts_ns + (shift(ev) if shift is not None else 0)
        sched.append((ts, order, 0, ev))
        order += 1
    heapq.heapify(sched)

    acks_pending: dict[tuple[str, str, int], None] = {}

    def listener(ev: Event) -> None:
        if ack_aborts_ms is None or type(ev) is not CancelRequested:
            return
        rs = log.state.requests[ev.request_id]
        if rs.cancel_pos != ev.pos:
            return  # a second cancel changes nothing
        nonlocal order
        for st in rs.active_stages():
            key = (ev.request_id, st.name, st.replica)
            if key in recorded_acks or key in acks_pending:
                continue
            acks_pending[key] = None
            ack = StageFinished(
                request_id=ev.request_id,
                stage=st.name,
                replica=st.replica,
                chunks=0,  # filled in when it is delivered
                finish_reason="aborted",
            )
            heapq.heappush(sched, (ev.ts_ns + int(ack_aborts_ms * 1_000_000), order, 2, ack))
            order += 1

    log.add_listener(listener)

    def note_new(start: int, what: tuple[str, object]) -> None:
        for p in range(start, log.next_pos):
            origin.append(what if p == start else ("dec", ""))

    def fire_timers(until: int | None) -> None:
        if timer is None:
            return
        steps = 0
        while True:
            due = timer.next_due()
            if due is None or (until is not None and due > until) or steps >= max_timer_steps:
                return
            steps += 1
            clock.set(max(due, clock.now_ns()))
            start = log.next_pos
            timer.fire_due()
            for p in range(start, log.next_pos):
                ev = log.get(p)
                if type(ev) is DeadlineExpired:
                    timer_fired.append(ev)
                    origin.append(("timer", ""))
                else:
                    origin.append(("dec", ""))

    def feed(ev: Event, what: tuple[str, object]) -> int:
        """Append one input and its cascade; its position, or -1 if refused."""
        start = log.next_pos
        cls = type(ev)
        try:
            if cls is Admitted or cls is Rejected:
                seq.submit(ev.request_id, ev.spec, ev.ts_ns)  # type: ignore[union-attr]
            else:
                seq.append(msgspec.structs.replace(ev, pos=-1))
        except IllegalTransition as exc:
            if log.next_pos > start:
                # The input went in, but a decision of its cascade was
                # refused by the reducer: the orchestrator decided something
                # illegal.  The rest of that cascade is lost; keep going.
                note_new(start, what)
                refused.append(Dropped(exc.event, str(exc)))
                return start
            if what[0] == "in":
                dropped.append(Dropped(ev, exc.reason))
            return -1
        note_new(start, what)
        return start

    def run_injections(after: int) -> None:
        for inj in after_map.pop(after, []):
            ev = msgspec.structs.replace(inj.event, ts_ns=max(inj.event.ts_ns, clock.now_ns()))
            at = feed(ev, ("inj", inj.label))
            if at >= 0:
                injected.append(log.get(at))
                if type(ev) is WorkerLost:
                    dead.add(ev.worker_id)  # type: ignore[union-attr]

    run_injections(-1)
    while sched:
        ts, _, kind, payload = heapq.heappop(sched)
        fire_timers(ts)
        clock.set(max(ts, clock.now_ns()))
        if kind == 0:
            ev = payload  # type: ignore[assignment]
            if timers and type(ev) is DeadlineExpired:
                dropped.append(Dropped(ev, "replaced by the virtual-time deadline timer"))
                run_injections(ev.pos)
                continue
            if dead and _from_dead_worker(ev, dead):
                dropped.append(Dropped(ev, "its worker was lost (injected fault)"))
                run_injections(ev.pos)
                continue
            ev_t = msgspec.structs.replace(ev, ts_ns=ts) if ts != ev.ts_ns else ev
            feed(ev_t, ("in", ev.pos))
            if type(ev) is WorkerJoined:
                dead.discard(ev.worker_id)  # type: ignore[union-attr]
            run_injections(ev.pos)
        elif kind == 1:
            inj = payload  # type: ignore[assignment]
            ev = msgspec.structs.replace(inj.event, ts_ns=ts)  # type: ignore[union-attr]
            at = feed(ev, ("inj", inj.label))  # type: ignore[union-attr]
            if at >= 0:
                injected.append(log.get(at))
                if type(ev) is WorkerLost:
                    dead.add(ev.worker_id)  # type: ignore[union-attr]
        else:
            ack = payload  # type: ignore[assignment]
            rs = log.state.requests.get(ack.request_id)  # type: ignore[union-attr]
            st = rs.stage(ack.stage) if rs is not None else None  # type: ignore[union-attr]
            if rs is None or rs.terminal or st is None or not st.active:
                continue
            ack = msgspec.structs.replace(ack, chunks=st.chunks, ts_ns=ts)  # type: ignore[arg-type]
            at = feed(ack, ("ack", ""))
            if at >= 0:
                synthesized.append(log.get(at))
    fire_timers(None)
    return FreeRun(
        log=log,
        pipeline=cfg,
        rules=rv,
        origin=origin,
        dropped=dropped,
        refused=refused,
        injected=injected,
        synthesized=synthesized,
        timer_fired=timer_fired,
    )


def _from_dead_worker(ev: Event, dead: set[str]) -> bool:
    cls = type(ev)
    if cls is WorkerLost:
        return ev.worker_id in dead  # type: ignore[union-attr]
    if cls is WorkerJoined:
        return False  # a restart: the worker is back
    stage = getattr(ev, "stage", None)
    if stage is None or cls is Routed or not isinstance(ev, RequestEvent):
        return False
    if event_tag(ev) not in _WORKER_SIDE:
        return False
    return f"{stage}/{ev.replica}" in dead  # type: ignore[union-attr]


# --------------------------------------------------------------------------
# Counterfactual
# --------------------------------------------------------------------------


@dataclass
class RequestDiff:
    request_id: str
    recorded_outcome: str
    new_outcome: str
    lines: list[str]  # unified-diff style: "  ", "- ", "+ "


@dataclass
class Counterfactual:
    run: FreeRun
    recorded_decisions: int
    new_decisions: int
    differing: int
    requests: list[RequestDiff] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return self.differing == 0 and not self.run.dropped

    def report(self, trace: Trace) -> str:
        out = [
            f"counterfactual replay of {trace.source}",
            f"  pipeline {self.run.pipeline.name} · rules v{self.run.rules} "
            f"(recorded: rules v{trace.rules_version})",
            f"  decisions: {self.recorded_decisions} recorded, {self.new_decisions} now; "
            f"{self.differing} differ",
        ]
        t0 = trace.events[0].ts_ns if trace.events else 0
        for rd in self.requests:
            if not any(line[0] in "+-" for line in rd.lines):
                continue
            change = (
                f"{rd.recorded_outcome} -> {rd.new_outcome}"
                if rd.recorded_outcome != rd.new_outcome
                else f"{rd.new_outcome} (same outcome)"
            )
            out.append(f"request {rd.request_id}: {change}")
            out.extend(f"  {line}" for line in rd.lines)
        if self.run.dropped:
            out.append(f"inputs dropped as illegal under the new decisions ({len(self.run.dropped)}):")
            for d in self.run.dropped[:50]:
                out.append(f"  {describe(d.event, t0)}  -- {d.reason}")
            if len(self.run.dropped) > 50:
                out.append(f"  ... and {len(self.run.dropped) - 50} more")
        if self.same:
            out.append("no decision differs: this change does not alter the recorded case")
        return "\n".join(out) + "\n"


def _canon(events: list[Event], ident: Callable[[int], str]) -> dict[str, list[tuple[str, str]]]:
    """Per request, its decisions as position-free lines: references to
    inputs become their recorded positions, to decisions their ordinal."""
    per: dict[str, list[tuple[str, str]]] = {}
    for ev in events:
        if not is_decision(ev):
            continue
        rid = ev.request_id  # type: ignore[union-attr]
        cls = type(ev)
        if cls is Routed:
            src = " ".join(ident(p) for p in ev.sources)  # type: ignore[union-attr]
            line = (
                f"routed -> {ev.stage}/{ev.replica} seq={ev.seq} sources=[{src}]"  # type: ignore[union-attr]
                f"{' last' if ev.last else ''} cause={ident(ev.cause)}"  # type: ignore[union-attr]
            )
        elif cls is Failed:
            line = f"failed {ev.reason} stage={ev.stage} cause={ident(ev.cause)} {ev.message!r}"  # type: ignore[union-attr]
        elif cls is Finished:
            line = f"finished cause={ident(ev.cause)}"  # type: ignore[union-attr]
        else:
            line = f"{event_tag(ev)} {ev.reason} cause={ident(ev.cause)}"  # type: ignore[union-attr]
        per.setdefault(rid, []).append((line, ""))
    return per


def counterfactual(
    trace: Trace,
    *,
    pipeline: PipelineConfig | None = None,
    rules: int | None = None,
    orchestrator: OrchestratorFactory | None = None,
    timers: bool = False,
) -> Counterfactual:
    """Drive the recorded inputs under another config or rules and compare
    the decisions with the recording, request by request."""
    run = free_run(
        trace, pipeline=pipeline, rules=rules, orchestrator=orchestrator, timers=timers
    )
    events = trace.events

    def rec_ident(p: int) -> str:
        if p < 0:
            return "-"
        ev = events[p]
        return f"#{p}" if not is_decision(ev) else f"({event_tag(ev)} of {ev.request_id})"  # type: ignore[union-attr]

    new_events = list(run.log.read())

    def new_ident(p: int) -> str:
        if p < 0:
            return "-"
        kind, what = run.origin[p]
        if kind == "in":
            return f"#{what}"
        ev = new_events[p]
        if kind == "dec":
            return f"({event_tag(ev)} of {ev.request_id})"  # type: ignore[union-attr]
        return f"({kind} {event_tag(ev)})"

    rec = _canon(events, rec_ident)
    new = _canon(new_events, new_ident)
    rec_fold = trace.fold()
    new_fold = run.log.state
    diffs: list[RequestDiff] = []
    differing = 0
    for rid in list(dict.fromkeys([*rec, *new, *rec_fold.requests])):
        a = [line for line, _ in rec.get(rid, [])]
        b = [line for line, _ in new.get(rid, [])]
        lines: list[str] = []
        sm = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
        for op, i1, i2, j1, j2 in sm.get_opcodes():
            if op == "equal":
                continue
            differing += max(i2 - i1, j2 - j1)
            lines.extend(f"- {x}" for x in a[i1:i2])
            lines.extend(f"+ {x}" for x in b[j1:j2])
        diffs.append(
            RequestDiff(
                request_id=rid,
                recorded_outcome=_outcome(rec_fold.requests.get(rid)),
                new_outcome=_outcome(new_fold.requests.get(rid)),
                lines=lines,
            )
        )
    return Counterfactual(
        run=run,
        recorded_decisions=sum(len(v) for v in rec.values()),
        new_decisions=sum(len(v) for v in new.values()),
        differing=differing,
        requests=diffs,
    )


def _outcome(rs: RequestState | None) -> str:
    if rs is None:
        return "absent"
    return rs.status + (f" ({rs.reason})" if rs.reason else "")

