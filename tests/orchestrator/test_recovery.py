"""Taking over a log: a fresh orchestrator shown an earlier process's log
stands where that process's orchestrator stood, and the losses a restart
records end the requests that were running."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from omnix.events.blobs import BlobStore
from omnix.events.types import (
    TERMINAL_TYPES,
    Event,
    Failed,
    Finished,
    RequestSpec,
    Routed,
    WorkerJoined,
    WorkerLost,
)
from omnix.orchestrator.decide import Orchestrator
from omnix.orchestrator.recovery import RESTART_REASON, RecoveryError, recover, restart_inputs
from omnix.pipelines.config import PipelineConfig
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


async def test_restart_losses_migrate_the_running_requests_to_the_restarted_workers() -> None:
    cfg = omni_like()
    omni, sim = await start_sim(cfg)
    rid = omni.submit(SPEC).request_id
    for _ in range(6):
        sim.step()
    assert not omni.state(rid).terminal  # type: ignore[union-attr]
    delivered = {st.name: st.chunks for st in omni.state(rid).stages}  # type: ignore[union-attr]
    assert delivered["thinker"] > 0
    # The previous process died with its workers: nothing of theirs runs on.
    for ex in sim._execs.values():
        ex.done = True
    lost = restart_inputs(omni.log.state)
    assert [ev.worker_id for ev in lost] == sorted(w for w in omni.log.state.workers)
    assert {ev.reason for ev in lost} == {RESTART_REASON}
    for ev in lost:
        omni.sequencer.emit(ev)
    assert all(isinstance(ev, WorkerLost) for ev in lost)
    assert not omni.state(rid).terminal  # type: ignore[union-attr]  # waits for a replica
    for ev in lost:  # the restarted server's workers join
        omni.sequencer.emit(
            WorkerJoined(
                worker_id=ev.worker_id,
                stage=ev.stage,
                replica=ev.replica,
                engine="scripted",
                capacity=8,
            )
        )
    sim.run_until_idle()
    evs = omni.log.events_for(rid)
    assert not [ev for ev in evs if isinstance(ev, Failed)]
    assert isinstance(evs[-1], Finished)
    # Each stage's last execution continues after the chunks it had delivered.
    resumed = {ev.stage: ev.resume for ev in evs if isinstance(ev, Routed) and ev.seq == 0}
    assert resumed["thinker"] == delivered["thinker"]
    for stage, k in resumed.items():
        assert k == delivered.get(stage, 0)
    assert omni.state(rid).stage("thinker").attempt == 2  # type: ignore[union-attr]


async def test_restart_losses_fail_a_request_whose_stage_does_not_retry() -> None:
    cfg = omni_like(thinker="retry = false")
    omni, sim = await start_sim(cfg)
    rid = omni.submit(SPEC).request_id
    for _ in range(6):
        sim.step()
    for ev in restart_inputs(omni.log.state):
        omni.sequencer.emit(ev)
    sim.run_until_idle()
    ends = [ev for ev in omni.log.events_for(rid) if isinstance(ev, Failed)]
    assert len(ends) == 1 and RESTART_REASON in ends[0].message


async def test_a_restart_fails_requests_older_than_it_resumes() -> None:
    from omnix.api import Omni
    from omnix.events.clock import ManualClock
    from omnix.testing.sim import SimRuntime

    cfg = omni_like()
    omni, sim = await start_sim(cfg)
    old = omni.submit(SPEC).request_id
    for _ in range(4):
        sim.step()
    clock = omni.clock
    assert isinstance(clock, ManualClock)
    clock.advance(200 * 10**9)
    recent = omni.submit(SPEC).request_id
    sim.step()
    clock.advance(200 * 10**9)  # old: 400 s, recent: 200 s

    def simulate(
        pipeline: PipelineConfig, emit: Callable[[Event], None], blobs: BlobStore
    ) -> SimRuntime:
        return SimRuntime(pipeline, emit, blobs, clock)

    again = Omni(
        cfg,
        log=omni.log,
        clock=clock,
        runtime_factory=simulate,
        virtual_time=True,
        resume_within_s=300,
    )
    sim2 = again.runtime
    assert isinstance(sim2, SimRuntime)
    sim2.timer = again.timer
    await again.start()
    sim2.run_until_idle()
    ends = {
        rid: [e for e in again.log.events_for(rid) if isinstance(e, TERMINAL_TYPES)]
        for rid in (old, recent)
    }
    (failed,) = ends[old]
    assert isinstance(failed, Failed) and failed.reason == "not_resumed"
    (done,) = ends[recent]
    assert isinstance(done, Finished)
