"""Drive and counterfactual: the real orchestrator against recorded inputs.

A changed decision rule must be caught at the first differing event, with
a report that names its position, both events and what led to them."""

from __future__ import annotations

import msgspec
import pytest

from omnix.events.types import Routed
from omnix.orchestrator.decide import RULES_VERSION, Orchestrator
from omnix.orchestrator.placement import Placement
from omnix.replay.counterfactual import counterfactual
from omnix.replay.drive import Divergence, drive

from .conftest import queued_chain, trace_of


async def test_drive_reproduces_every_decision(busy):
    t = trace_of(busy, None)
    res = drive(t)
    assert res.ok and res.digest == t.digest
    assert res.decisions == t.decisions and res.inputs + res.decisions == len(t.events)
    # The replayed log is the recording, byte for byte.
    from omnix.events.codec import encode_event

    assert [encode_event(e) for e in res.log.read()] == [encode_event(e) for e in t.events]


def _prefer_highest(self, state, stage):
    """A changed rule: the most loaded-or-highest replica instead of the least loaded."""
    best = -1
    for rep in self.replicas[stage]:
        ws = state.workers.get(f"{stage}/{rep}")
        if ws is not None and ws.alive and self.load.get(ws.worker_id, 0) < ws.capacity:
            best = rep
    return best


async def test_a_changed_rule_names_the_first_differing_event(busy, monkeypatch):
    t = trace_of(busy, ["r1"])
    first_to_talker1 = next(
        ev for ev in t.events if isinstance(ev, Routed) and ev.stage == "talker" and ev.replica == 1
    )
    first_talker = next(ev for ev in t.events if isinstance(ev, Routed) and ev.stage == "talker")
    assert first_talker.replica == 0  # least loaded, ties to the lowest index
    monkeypatch.setattr(Placement, "pick", _prefer_highest)
    with pytest.raises(Divergence) as err:
        drive(t)
    d = err.value
    assert d.position == first_talker.pos < first_to_talker1.pos
    assert d.expected == first_talker
    assert isinstance(d.actual, Routed) and d.actual.replica == 1
    assert msgspec.structs.replace(d.actual, replica=0) == d.expected
    assert d.context.kind == "different"
    assert d.context.trigger.pos == d.expected.cause
    assert d.context.cause_chain[0].pos == d.expected.cause
    report = d.report()
    assert f"divergence at position {d.position}" in report
    assert "differs in: replica: 0 vs 1" in report
    assert "expected (recorded)" in report and "actual   (replayed)" in report
    assert "RULES_VERSION" in report
    # Non-raising form for tools.
    res = drive(t, raise_on_divergence=False)
    assert not res.ok and res.divergence.position == d.position
    with pytest.raises(Divergence):
        res.check()


async def test_a_changed_edge_setting_is_caught_and_explained(busy):
    t = trace_of(busy, ["r0"])
    edges = list(t.pipeline.edges)
    edges[1] = msgspec.structs.replace(edges[1], every=4)
    other = msgspec.structs.replace(t.pipeline, edges=tuple(edges))
    res = drive(t, pipeline=other, raise_on_divergence=False)
    d = res.divergence
    assert d is not None and d.context.kind == "missing"
    assert isinstance(d.expected, Routed) and d.expected.stage == "code2wav" and d.actual is None
    assert "different pipeline config" in d.report()


async def test_extra_decision_is_reported(busy, monkeypatch):
    t = trace_of(busy, ["r3"])
    original = Orchestrator.react

    def react(self, ev, state):
        out = original(self, ev, state)
        if type(ev).__name__ == "StageStarted" and ev.stage == "talker":
            from omnix.events.types import CancelRequested

            out.append(
                CancelRequested(
                    request_id=ev.request_id, ts_ns=ev.ts_ns, reason="deadline", cause=ev.pos
                )
            )
        return out

    monkeypatch.setattr(Orchestrator, "react", react)
    d = drive(t, raise_on_divergence=False).divergence
    assert d.context.kind == "extra" and d.actual.reason == "deadline"
    assert "made a decision the recording does not have" in d.report()


async def test_rules_newer_than_this_omnix_are_refused(busy):
    t = trace_of(busy, ["r0"])
    t.rules_version = RULES_VERSION + 1
    with pytest.raises(ValueError, match="newer than this omnix"):
        drive(t)


async def test_old_rules_are_passed_to_the_orchestrator(busy):
    seen = []

    def factory(pipeline, rules):
        seen.append(rules)
        return Orchestrator(pipeline, rules=rules)

    t = trace_of(busy, ["r0"])
    assert drive(t, orchestrator=factory).ok and seen == [t.rules_version]


async def test_counterfactual_lists_what_changes_and_what_becomes_illegal(busy):
    t = trace_of(busy, ["r3"])
    same = counterfactual(t)
    assert same.same and same.differing == 0
    edges = list(t.pipeline.edges)
    edges[1] = msgspec.structs.replace(edges[1], every=1)
    cf = counterfactual(t, pipeline=msgspec.structs.replace(t.pipeline, edges=tuple(edges)))
    assert cf.differing > 0 and cf.new_decisions > cf.recorded_decisions
    r3 = next(rd for rd in cf.requests if rd.request_id == "r3")
    assert any(line.startswith("+ routed -> code2wav/0") for line in r3.lines)
    assert any(line.startswith("- routed -> code2wav/0") for line in r3.lines)
    report = cf.report(t)
    assert "differ" in report and "request r3" in report


async def test_counterfactual_drops_inputs_that_become_illegal():
    omni = await queued_chain()
    t = trace_of(omni, None)
    # With a queue of 0, r1 and r2 are refused: their recorded outputs
    # cannot be applied and are listed.
    stages = tuple(
        msgspec.structs.replace(st, max_queue=0) if st.name == "thinker" else st
        for st in t.pipeline.stages
    )
    cf = counterfactual(t, pipeline=msgspec.structs.replace(t.pipeline, stages=stages))
    outcomes = {rd.request_id: (rd.recorded_outcome, rd.new_outcome) for rd in cf.requests}
    assert outcomes["r1"] == ("finished", "rejected (overloaded)")
    assert cf.run.dropped and all(
        d.event.request_id in ("r1", "r2", "r4", "r5") for d in cf.run.dropped
    )
    assert "inputs dropped as illegal" in cf.report(t)
