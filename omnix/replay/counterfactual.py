"""Counterfactuals: which recorded decisions change under another config or rules.

Owns: ``counterfactual`` (a free run of the recorded inputs compared with
the recording, request by request, decision by decision) and its report.

Does not own the run itself (``freerun.py``), the strict drive
(``drive.py``) or presentation of single events (``show.py``).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import assert_never

from omnix.events.reducer import RequestState
from omnix.events.types import (
    Cancelled,
    CancelRequested,
    DecisionEvent,
    Event,
    Failed,
    Finished,
    Routed,
    Scaled,
    event_tag,
)
from omnix.pipelines.config import PipelineConfig
from omnix.replay.drive import OrchestratorFactory
from omnix.replay.freerun import FreeRun, free_run
from omnix.trace import Trace, is_decision
from omnix.traceview.show import describe

__all__ = ["Counterfactual", "RequestDiff", "counterfactual"]


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
            out.append(
                f"inputs dropped as illegal under the new decisions ({len(self.run.dropped)}):"
            )
            for d in self.run.dropped[:50]:
                out.append(f"  {describe(d.event, t0)}  -- {d.reason}")
            if len(self.run.dropped) > 50:
                out.append(f"  ... and {len(self.run.dropped) - 50} more")
        if self.same:
            out.append("no decision differs: this change does not alter the recorded case")
        return "\n".join(out) + "\n"


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
    run = free_run(trace, pipeline=pipeline, rules=rules, orchestrator=orchestrator, timers=timers)
    events = trace.events

    def rec_ident(p: int) -> str:
        if p < 0:
            return "-"
        ev = events[p]
        if is_decision(ev):
            return f"({event_tag(ev)} of {_about(ev)})"
        return f"#{p}"

    new_events = list(run.log.read())

    def new_ident(p: int) -> str:
        if p < 0:
            return "-"
        kind, what = run.origin[p]
        if kind == "in":
            return f"#{what}"
        ev = new_events[p]
        if kind == "dec":
            assert is_decision(ev), "the orchestrator appends decisions only"
            return f"({event_tag(ev)} of {_about(ev)})"
        return f"({kind} {event_tag(ev)})"

    rec = _canon(events, rec_ident)
    new = _canon(new_events, new_ident)
    rec_fold = trace.fold()
    new_fold = run.log.state
    diffs: list[RequestDiff] = []
    differing = 0
    for rid in list(dict.fromkeys([*rec, *new, *rec_fold.requests])):
        a = rec.get(rid, [])
        b = new.get(rid, [])
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


def _canon(events: list[Event], ident: Callable[[int], str]) -> dict[str, list[str]]:
    """Per request, its decisions as position-free lines: references to
    inputs become their recorded positions, to decisions their ordinal."""
    per: dict[str, list[str]] = {}
    for ev in events:
        if not is_decision(ev):
            continue
        match ev:
            case Routed():
                src = " ".join(ident(p) for p in ev.sources)
                line = (
                    f"routed -> {ev.stage}/{ev.replica} seq={ev.seq} sources=[{src}]"
                    f"{' last' if ev.last else ''} cause={ident(ev.cause)}"
                )
            case Failed():
                line = f"failed {ev.reason} stage={ev.stage} cause={ident(ev.cause)} {ev.message!r}"
            case Finished():
                line = f"finished cause={ident(ev.cause)}"
            case CancelRequested() | Cancelled():
                line = f"{event_tag(ev)} {ev.reason} cause={ident(ev.cause)}"
            case Scaled():
                # About a stage, not a request: listed under the stage.
                line = f"scaled {ev.stage}/{ev.replica} {ev.op} {ev.reason} cause={ident(ev.cause)}"
                per.setdefault(f"scaling of {ev.stage}", []).append(line)
                continue
            case _:
                assert_never(ev)
        per.setdefault(ev.request_id, []).append(line)
    return per


def _about(ev: DecisionEvent) -> str:
    """What a decision is about: its request, or a scaled stage."""
    return f"scaling of {ev.stage}" if type(ev) is Scaled else ev.request_id


def _outcome(rs: RequestState | None) -> str:
    if rs is None:
        return "absent"
    return rs.status + (f" ({rs.reason})" if rs.reason else "")
