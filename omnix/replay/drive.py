"""Drive: the real orchestrator against a trace's recorded inputs, strictly.

Owns: ``drive`` (strict replay: every decision must come out byte for byte
as recorded, else a ``Divergence`` naming the first differing event, the
cascade that produced it and the inputs before it, as Temporal's replayer
reports non-determinism), its result and report, and the orchestrator
factory every replay mode builds its orchestrator with.

Does not own lenient replay under other configs, rules or faults
(``freerun.py``), the comparison of such a run with the recording
(``counterfactual.py``), the decisions (``omnix.orchestrator.decide``), the
append loop (``Sequencer``), the fault vocabulary and invariants
(``faults.py``) or presentation (``show.py``).

No models, workers, sockets or asyncio: a ``MemoryLog`` on a
``ManualClock``, an ``Orchestrator`` and a ``Sequencer``.  Inputs are fed in
recorded order with their recorded ``ts_ns``; admissions go through
``Sequencer.submit`` because admitting is itself a decision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import assert_never

import msgspec

from omnix.events.clock import ManualClock
from omnix.events.log import MemoryLog
from omnix.events.reducer import Fold, IllegalTransition, RequestState, fold
from omnix.events.types import (
    Admitted,
    Cancelled,
    CancelRequested,
    Chunk,
    DeadlineExpired,
    Event,
    Failed,
    Finished,
    InputAppended,
    Progress,
    Rejected,
    Released,
    RequestEvent,
    Routed,
    Scaled,
    SessionChanged,
    StageFailed,
    StageFinished,
    StageStarted,
    WorkerJoined,
    WorkerLost,
    event_tag,
)
from omnix.orchestrator.decide import RULES_VERSION, Orchestrator
from omnix.orchestrator.sequencer import Sequencer
from omnix.pipelines.config import PipelineConfig
from omnix.trace import Trace, is_decision
from omnix.traceview.show import describe

__all__ = [
    "Divergence",
    "DivergenceContext",
    "DriveResult",
    "OrchestratorFactory",
    "default_orchestrator",
    "drive",
]

OrchestratorFactory = Callable[[PipelineConfig, int], Orchestrator]


def default_orchestrator(pipeline: PipelineConfig, rules: int) -> Orchestrator:
    return Orchestrator(pipeline, rules=rules)


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
    return f"{rs.request_id} {rs.status}" + (
        f"; stages: {stages}" if stages else "; no stage routed"
    )


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

#: (position, expected, actual, kind, trigger position) -> the divergence
_Diverge = Callable[[int, Event | None, Event | None, str, int], Divergence]


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
    orch = (orchestrator or default_orchestrator)(cfg, rv)
    log = MemoryLog(ManualClock(0))
    seq = Sequencer(log, orch)
    stored = log._events  # the replayed events; read in place on the hot path
    events = trace.events
    n = len(events)
    inputs = decisions = 0
    i = 0
    div: Divergence | None = None
    diverge: _Diverge = partial(
        _divergence, trace, log, rv, cfg is not trace.pipeline, context_inputs
    )

    while i < n:
        ev = events[i]
        if is_decision(ev):
            # A recorded decision with no input before it in this cascade:
            # the previous cascade stopped short of it.
            div = diverge(i, ev, None, "missing", _input_before(events, i))
            break
        inputs += 1
        div = _feed(seq, ev, i, events, stored, diverge)
        if div is None:
            j, div = _compare_cascade(i, events, stored, diverge)
        if div is not None:
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


def _compare_cascade(
    i: int, events: list[Event], stored: list[Event], diverge: _Diverge
) -> tuple[int, Divergence | None]:
    """Compare the decisions the input ``events[i]`` caused (replayed, in
    ``stored`` from ``i + 1``) with the recorded ones after it; the index
    of the next recorded input, or the divergence."""
    n = len(events)
    after = len(stored)
    j = k = i + 1
    while j < n:
        nxt = events[j]
        if not is_decision(nxt):
            break
        if k >= after:
            return j, diverge(j, nxt, None, "missing", i)
        act = stored[k]
        if _encode(act) != _encode(nxt):
            return j, diverge(j, nxt, act, "different", i)
        j += 1
        k += 1
    if k < after:
        return j, diverge(k, events[j] if j < n else None, stored[k], "extra", i)
    return j, None


def _feed(
    seq: Sequencer,
    ev: Event,
    i: int,
    events: list[Event],
    stored: list[Event],
    diverge: _Diverge,
) -> Divergence | None:
    """Append the recorded input ``events[i]`` (an admission through
    ``submit``, which decides it) and its cascade; the divergence, if the
    admission came out otherwise or the reducer refused something."""
    if type(ev) is Admitted or type(ev) is Rejected:
        got = seq.submit(ev.request_id, ev.spec, ev.ts_ns)
        if type(got) is not type(ev) or _encode(got) != _encode(ev):
            return diverge(i, ev, got, "admission", i)
        return None
    try:
        seq.append(ev)
    except IllegalTransition as exc:
        if len(stored) > i:
            # The input went in; a decision of its cascade was refused:
            # the orchestrator decided something illegal.
            at = exc.event.pos
            div = diverge(at, events[at] if at < len(events) else None, exc.event, "refused", i)
        else:
            div = diverge(i, ev, None, "refused", i)
        div.context.refusal = str(exc)
        return div
    return None


def _input_before(events: list[Event], i: int) -> int:
    j = i - 1
    while j > 0 and is_decision(events[j]):
        j -= 1
    return max(j, 0)


def _divergence(
    trace: Trace,
    log: MemoryLog,
    rules: int,
    pipeline_changed: bool,
    n_inputs: int,
    pos: int,
    expected: Event | None,
    actual: Event | None,
    kind: str,
    trigger_pos: int,
) -> Divergence:
    events = trace.events
    trigger = events[trigger_pos] if 0 <= trigger_pos < len(events) else None
    # The cascade as recorded and as replayed.
    recorded: list[Event] = []
    j = trigger_pos + 1
    while j < len(events) and is_decision(events[j]):
        recorded.append(events[j])
        j += 1
    produced: list[Event] = (
        [ev for ev in log.read(trigger_pos + 1) if is_decision(ev)] if trigger else []
    )
    # Causes of the expected event (else the actual one), through the recording.
    chain: list[Event] = []
    probe = expected if expected is not None else actual
    seen: set[int] = set()
    while probe is not None:
        c = _cause(probe)
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
    rid = _request_id(expected) or _request_id(actual)
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


def _cause(ev: Event) -> int:
    """The position of the event that led to ``ev`` (-1: none recorded)."""
    match ev:
        case Routed() | CancelRequested() | Cancelled() | Failed() | Finished() | Scaled():
            return ev.cause
        case (
            Admitted()
            | Rejected()
            | StageStarted()
            | Progress()
            | Chunk()
            | StageFinished()
            | StageFailed()
            | DeadlineExpired()
            | WorkerJoined()
            | WorkerLost()
            | Released()
            | SessionChanged()
            | InputAppended()
        ):
            return -1  # no cause field: an input, or the worker's own
        case _:
            assert_never(ev)


def _request_id(ev: Event | None) -> str | None:
    return ev.request_id if isinstance(ev, RequestEvent) else None
