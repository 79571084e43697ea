"""A restart reads the log from the last idle point, not from position 0,
and works on a log whose ended requests retention released.

``recover_log`` shows the orchestrator the worker events before the last
idle point ahead of the oldest request in flight, then the log from there,
checked decision by decision; it must reach exactly the bookkeeping the
live orchestrator has (after every step of a simulated run).  Where
retention released a request inside that stretch, the requests in flight
are adopted bare and reported unresumable (the server fails them).
"""

from __future__ import annotations

import asyncio

from omnix.api import Omni
from omnix.events.retention import Retention, RetentionPolicy
from omnix.events.types import RequestSpec
from omnix.orchestrator.decide import Orchestrator
from omnix.orchestrator.recovery import recover_log
from omnix.pipelines.validate import parse_pipeline
from omnix.testing.pipelines import scripted_omni_toml
from omnix.testing.serving import InProcessRuntime
from omnix.testing.sim import start_sim
from tests.waiting import wait_until

from .conftest import omni_like
from .test_recovery import bookkeeping

SPEC = RequestSpec(prompt="hi", outputs=("text", "audio"))


async def test_recover_log_matches_the_live_orchestrator_after_every_step() -> None:
    cfg = omni_like(talker="replicas = 2", thinker="max_queue = 4")
    omni, sim = await start_sim(cfg)
    starts = set()
    for wave in range(3):
        for _ in range(4):
            omni.submit(SPEC)
        steps = 0
        while sim.step():
            steps += 1
            fresh = Orchestrator(cfg)
            rec = recover_log(fresh, omni.log)
            assert rec.unresumable == ()
            assert bookkeeping(fresh) == bookkeeping(omni.orchestrator), f"wave {wave} step {steps}"
            starts.add(rec.start)
    # Idle between waves: later restarts start past the first wave.
    assert max(starts) > 0
    fresh = Orchestrator(cfg)
    rec = recover_log(fresh, omni.log)
    assert rec.start == len(omni.log)  # nothing in flight: workers only
    assert rec.shown < len(omni.log)


async def test_recover_log_on_a_log_retention_released_from() -> None:
    cfg = omni_like(talker="replicas = 2", thinker="max_queue = 8")
    omni, sim = await start_sim(cfg)
    ret = Retention(
        omni.log,
        RetentionPolicy(window_s=None, max_requests=1, max_bytes=None),
        omni.blobs,
        append=omni.sequencer.append,
    )
    exact = bare = 0
    for k in range(40):
        if k < 24:  # never idle: each admitted while others run
            omni.submit(SPEC)
        sim.step()
        fresh = Orchestrator(cfg)
        rec = recover_log(fresh, omni.log)
        if rec.unresumable:
            bare += 1
            assert set(rec.unresumable) == set(omni.orchestrator.live_requests)
            assert set(fresh.live_requests) == set(rec.unresumable)
            # Adopted bare: no load, no queue place held.
            stages = fresh.graph.stage_names
            assert all(fresh.queue_length(s) == 0 for s in stages)
            assert all(fresh.load(s, r) == 0 for s in stages for r in range(2))
        else:
            exact += 1
            assert bookkeeping(fresh) == bookkeeping(omni.orchestrator)
    sim.run_until_idle()
    assert ret.released_total > 0
    assert exact > 0 and bare > 0, (exact, bare)
    fresh = Orchestrator(cfg)
    rec = recover_log(fresh, omni.log)
    assert rec.unresumable == () and bookkeeping(fresh) == bookkeeping(omni.orchestrator)


PIPELINE = scripted_omni_toml(
    "restart-omni",
    thinker='engine = { kind = "scripted", chunks_per_piece = 3, delay_ms = 1, capacity = 2 }\nmax_queue = 100',
    talker='engine = { kind = "scripted", chunks_per_piece = 2, delay_ms = 1, output_modality = "codec" }',
)


async def _ready(omni: Omni) -> None:
    await wait_until(lambda: all(omni.ready().values()), "ready replicas")


async def test_a_log_dir_server_restarts_after_retention_released_requests(tmp_path) -> None:
    """40 concurrent requests with two kept: the restarted server takes the
    log over (it used to refuse it: the released requests' decisions could
    not be re-derived) and serves again."""
    cfg = parse_pipeline(PIPELINE, "toml")
    policy = RetentionPolicy(window_s=None, max_requests=2, max_bytes=None)
    omni = Omni(cfg, log_dir=tmp_path, runtime_factory=InProcessRuntime, retention=policy)
    await omni.start()
    await _ready(omni)
    await asyncio.gather(*(omni.generate(RequestSpec(prompt=f"p{k}", seed=k)) for k in range(40)))
    assert omni.retention is not None and omni.retention.released_total >= 30
    await omni.shutdown()

    again = Omni(cfg, log_dir=tmp_path, runtime_factory=InProcessRuntime, retention=policy)
    try:
        await again.start()
        # Nothing was in flight: only the worker events were shown.
        assert again.recovered_events < 20
        await _ready(again)
        res = await again.generate(RequestSpec(prompt="after", seed=1))
        assert res.ok
    finally:
        await again.shutdown()


async def test_a_restart_fails_the_requests_it_cannot_resume() -> None:
    """The server ends each unresumable request (``not_resumed``), once,
    and its orchestrator holds nothing after."""
    from omnix.testing.sim import SimRuntime

    cfg = omni_like(talker="replicas = 2", thinker="max_queue = 8")
    omni, sim = await start_sim(cfg)
    ret = Retention(
        omni.log,
        RetentionPolicy(window_s=None, max_requests=1, max_bytes=None),
        omni.blobs,
        append=omni.sequencer.append,
    )
    for k in range(40):
        if k < 24:
            omni.submit(SPEC)
        sim.step()
        if recover_log(Orchestrator(cfg), omni.log).unresumable:
            break
    live = omni.orchestrator.live_requests
    assert live
    # The first server "dies": its effects stop; the log stays.
    log = omni.log
    log.remove_listener(omni.dispatcher)
    log.remove_listener(omni.timer)
    omni.timer.close()
    ret.close()

    def simulate(pipeline, emit, blobs):
        return SimRuntime(pipeline, emit, blobs, sim.clock)

    again = Omni(
        cfg, log=log, blobs=omni.blobs, clock=sim.clock, runtime_factory=simulate, virtual_time=True
    )
    await again.start()
    try:
        for rid in live:
            rs = log.state.requests[rid]
            assert rs.status == "failed" and rs.reason == "not_resumed", rs
        assert again.orchestrator.live_requests == ()
        assert again.sequencer.refused_decisions == 0 and again.sequencer.refused_inputs == 0
    finally:
        await again.shutdown(grace_s=0)
