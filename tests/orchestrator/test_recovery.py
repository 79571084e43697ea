"""Taking over a log: a fresh orchestrator shown an earlier process's log
stands where that process's orchestrator stood, and the losses a restart
records end the requests that were running."""

from __future__ import annotations

import pytest

from omnix.events.types import Failed, RequestSpec, WorkerLost
from omnix.orchestrator.decide import Orchestrator
from omnix.orchestrator.recovery import RESTART_REASON, RecoveryError, recover, restart_inputs
from omnix.testing.sim import start_sim

from .conftest import omni_like

SPEC = RequestSpec(prompt="hi", outputs=("text", "audio"))


def bookkeeping(orch: Orchestrator) -> tuple[object, ...]:
    stages = orch.graph.stage_names
    return (
        orch.live_requests,
        {s: orch.queue_length(s) for s in stages},
        {s: orch.ready_replicas(s) for s in stages},
        {(s, r): orch.load(s, r) for s in stages for r in range(2)},
    )


async def test_recovery_rebuilds_the_orchestrator_after_every_step() -> None:
    cfg = omni_like(talker="replicas = 2", thinker="max_queue = 4")
    omni, sim = await start_sim(cfg)
    for _ in range(5):
        omni.submit(SPEC)
    steps = 0
    while sim.step():
        steps += 1
        fresh = Orchestrator(cfg)
        shown = recover(fresh, omni.log.read())
        assert shown == len(omni.log)
        assert bookkeeping(fresh) == bookkeeping(omni.orchestrator), f"after step {steps}"
    assert steps > 20


async def test_recovery_refuses_a_log_its_rules_do_not_reproduce() -> None:
    omni, sim = await start_sim(omni_like())
    omni.submit(SPEC)
    sim.run_until_idle()
    other = Orchestrator(omni_like(edge_talker="every = 5"))
    with pytest.raises(RecoveryError, match="cannot be resumed"):
        recover(other, omni.log.read())


async def test_restart_losses_end_the_requests_that_were_running() -> None:
    cfg = omni_like()
    omni, sim = await start_sim(cfg)
    rid = omni.submit(SPEC).request_id
    for _ in range(6):
        sim.step()
    assert not omni.state(rid).terminal  # type: ignore[union-attr]
    lost = restart_inputs(omni.log.state)
    assert [ev.worker_id for ev in lost] == sorted(w for w in omni.log.state.workers)
    assert {ev.reason for ev in lost} == {RESTART_REASON}
    for ev in lost:
        omni.sequencer.emit(ev)
    sim.run_until_idle()
    ends = [ev for ev in omni.log.events_for(rid) if isinstance(ev, Failed)]
    assert len(ends) == 1 and RESTART_REASON in ends[0].message
    assert all(isinstance(ev, WorkerLost) for ev in lost)
