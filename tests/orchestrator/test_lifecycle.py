"""Cancellation, failure, loss, retries, deadlines and backpressure: every
request ends with exactly one terminal event and leaves nothing behind."""

from __future__ import annotations

import pytest

from omnix.events.types import (
    STAGE_EVENT_TYPES,
    TERMINAL_TYPES,
    Cancelled,
    CancelRequested,
    Chunk,
    DeadlineExpired,
    Failed,
    Finished,
    Rejected,
    RequestSpec,
    Routed,
    WorkerLost,
)
from omnix.testing.sim import start_sim

from .conftest import omni_like

SPEC = RequestSpec(prompt="hi", outputs=("text", "audio"))


def terminals(omni, rid):
    return [ev for ev in omni.log.events_for(rid) if isinstance(ev, TERMINAL_TYPES)]


def assert_released(omni, sim, rid):
    """No state left behind for ``rid`` outside the log."""
    assert rid not in omni.orchestrator.live_requests
    assert rid not in omni.dispatcher._specs
    assert not [k for k in sim._execs if k[0] == rid]
    assert rid in sim.released
    assert omni.timer.armed == 0
    for stage in omni.graph.stage_names:
        assert omni.orchestrator.queue_length(stage) == 0
        for rep in range(omni.pipeline.stage(stage).replicas):
            assert omni.orchestrator.load(stage, rep) == 0


def assert_nothing_after_terminal(omni, rid):
    evs = omni.log.events_for(rid)
    ends = [i for i, ev in enumerate(evs) if isinstance(ev, TERMINAL_TYPES)]
    assert len(ends) == 1
    assert ends[0] == len(evs) - 1


async def baseline_length(cfg) -> int:
    omni, sim = await start_sim(cfg)
    omni.submit(SPEC, request_id="r1")
    sim.run_until_idle()
    return omni.log.next_pos


async def test_cancel_at_every_position_of_a_recorded_run(omni_cfg):
    n = await baseline_length(omni_cfg)
    admitted_at = 3  # three WorkerJoined events come first
    outcomes = set()
    for k in range(admitted_at, n):
        omni, sim = await start_sim(omni_cfg)
        active_at_cancel: list[tuple[str, int]] = []

        def inject(ev, k=k, omni=omni, active=active_at_cancel):
            if ev.pos == k:
                rs = omni.state("r1")
                if rs is not None and not rs.terminal:
                    active.extend((st.name, st.replica) for st in rs.active_stages())
                omni.cancel("r1")

        omni.log.add_listener(inject)
        omni.submit(SPEC, request_id="r1")
        sim.run_until_idle()

        ends = terminals(omni, "r1")
        assert len(ends) == 1, f"cancel after pos {k}: {ends}"
        assert_nothing_after_terminal(omni, "r1")
        outcomes.add(type(ends[0]))
        if isinstance(ends[0], Cancelled):
            evs = omni.log.events_for("r1")
            cancel = next(e for e in evs if isinstance(e, CancelRequested))
            # Nothing is routed once the cancel is in the log.
            assert not [e for e in evs if isinstance(e, Routed) and e.pos > cancel.pos]
            aborted = {(s, r) for (_, s, r) in sim.aborts}
            # Every stage active when the cancel landed got its abort.
            rs_at_cancel = {(s, r) for (s, r) in active_at_cancel}
            assert rs_at_cancel <= aborted | _finished_stages(omni, "r1")
        assert_released(omni, sim, "r1")
    assert outcomes == {Cancelled, Finished}


def _finished_stages(omni, rid):
    rs = omni.state(rid)
    return {(st.name, st.replica) for st in rs.stages if st.status == "finished"}


async def test_cancel_reaches_every_active_stage_and_ends_after_acks(omni_cfg):
    omni, sim = await start_sim(omni_cfg)
    omni.submit(SPEC, request_id="r1")
    while not any(
        isinstance(e, Chunk) and e.stage == "code2wav" for e in omni.log.events_for("r1")
    ):
        assert sim.step()
    active = {(st.name, st.replica) for st in omni.state("r1").active_stages()}
    assert active == {("thinker", 0), ("talker", 0), ("code2wav", 0)}
    assert omni.cancel("r1", "disconnect")
    assert omni.state("r1").status == "cancelling"
    sim.run_until_idle()
    assert {(s, r) for (_, s, r) in sim.aborts} == active
    (end,) = terminals(omni, "r1")
    assert isinstance(end, Cancelled) and end.reason == "disconnect"
    assert all(st.status == "aborted" for st in omni.state("r1").stages)
    assert_released(omni, sim, "r1")
    assert not omni.cancel("r1")  # already over: nothing appended


async def test_stage_failure_fails_the_request_and_aborts_the_others():
    cfg = omni_like(
        talker='engine = { kind = "scripted", chunks_per_piece = 3, delay_ms = 1, output_modality = "codec", fail_at = 4 }'
    )
    omni, sim = await start_sim(cfg)
    omni.submit(SPEC, request_id="r1")
    sim.run_until_idle()
    (end,) = terminals(omni, "r1")
    assert isinstance(end, Failed) and end.reason == "stage_error" and end.stage == "talker"
    assert "scripted failure" in end.message
    assert {s for (_, s, _) in sim.aborts} == {"thinker", "code2wav"}
    assert_nothing_after_terminal(omni, "r1")
    assert_released(omni, sim, "r1")


async def test_lost_worker_fails_its_requests_with_the_loss_as_cause():
    omni, sim = await start_sim(omni_like(thinker="retry = false"))
    omni.submit(SPEC, request_id="r1")
    for _ in range(10):
        sim.step()
    sim.kill("thinker", 0)
    sim.run_until_idle()
    lost = next(e for e in omni.log.read() if isinstance(e, WorkerLost))
    (end,) = terminals(omni, "r1")
    assert isinstance(end, Failed) and end.reason == "stage_lost" and end.cause == lost.pos
    assert end.pos == lost.pos + 1  # decided in the same cascade, no wait
    assert_released(omni, sim, "r1")


async def test_lost_worker_before_output_retries_on_another_replica():
    cfg = omni_like(thinker="replicas = 2\nretry = true")
    omni, sim = await start_sim(cfg)
    omni.submit(SPEC, request_id="r1")
    sim.step()  # admitted, routed to thinker/0; nothing produced yet
    sim.kill("thinker", 0)
    sim.run_until_idle()
    routes = [
        e for e in omni.log.events_for("r1") if isinstance(e, Routed) and e.stage == "thinker"
    ]
    assert [(r.replica, r.seq) for r in routes] == [(0, 0), (1, 0)]
    assert isinstance(terminals(omni, "r1")[0], Finished)
    assert omni.state("r1").stage("thinker").attempt == 2


async def test_request_deadline_cancels_with_reason_deadline(omni_cfg):
    omni, sim = await start_sim(omni_cfg)
    omni.submit(
        RequestSpec(prompt="hi", outputs=("text", "audio"), deadline_ms=10), request_id="r1"
    )
    sim.run_until_idle()
    evs = omni.log.events_for("r1")
    exp = next(e for e in evs if isinstance(e, DeadlineExpired))
    req = next(e for e in evs if isinstance(e, CancelRequested))
    assert exp.scope == "request" and req.reason == "deadline" and req.cause == exp.pos
    assert exp.ts_ns - evs[0].ts_ns == 10_000_000
    (end,) = terminals(omni, "r1")
    assert isinstance(end, Cancelled) and end.reason == "deadline"
    assert_released(omni, sim, "r1")


async def test_a_silent_stage_times_out_instead_of_hanging():
    cfg = omni_like(
        talker='timeout_s = 0.5\nengine = { kind = "scripted", chunks_per_piece = 3, delay_ms = 1, output_modality = "codec", hang_at = 2 }'
    )
    omni, sim = await start_sim(cfg)
    omni.submit(SPEC, request_id="r1")
    sim.run_until_idle()
    (end,) = terminals(omni, "r1")
    assert isinstance(end, Failed) and end.reason == "stage_timeout" and end.stage == "talker"
    last_talker = max(
        e.ts_ns
        for e in omni.log.events_for("r1")
        if isinstance(e, STAGE_EVENT_TYPES) and e.stage == "talker"
    )
    assert end.ts_ns - last_talker == 500_000_000
    assert_released(omni, sim, "r1")


async def test_output_of_an_armed_request_costs_the_timer_no_due_time_computation():
    # A stage's output only pushes its inactivity timeout later, so the timer
    # skips it (computing due times per streamed token would be a quarter of
    # the server's work);
    # the stage still times out exactly timeout_s after its last output.
    cfg = omni_like(
        talker='timeout_s = 0.5\nengine = { kind = "scripted", chunks_per_piece = 3, delay_ms = 1, output_modality = "codec", hang_at = 2 }'
    )
    omni, sim = await start_sim(cfg)
    seen: list[str] = []
    due_times = omni.orchestrator.due_times

    def spy(rid, state):
        seen.append(type(omni.log.get(omni.log.next_pos - 1)).__name__)
        return due_times(rid, state)

    omni.orchestrator.due_times = spy
    omni.submit(SPEC, request_id="r1")
    sim.run_until_idle()
    assert any(isinstance(e, Chunk) for e in omni.log.events_for("r1"))
    assert "Chunk" not in seen and "Routed" in seen
    (end,) = terminals(omni, "r1")
    assert isinstance(end, Failed) and end.reason == "stage_timeout" and end.stage == "talker"
    last_talker = max(
        e.ts_ns
        for e in omni.log.events_for("r1")
        if isinstance(e, STAGE_EVENT_TYPES) and e.stage == "talker"
    )
    assert end.ts_ns - last_talker == 500_000_000


async def test_unacknowledged_aborts_end_after_the_abort_timeout(omni_cfg):
    omni, sim = await start_sim(omni_cfg, abort_delay_ms=60_000)
    omni.submit(SPEC, request_id="r1")
    for _ in range(5):
        sim.step()
    omni.cancel("r1")
    sim.run_until_idle()
    evs = omni.log.events_for("r1")
    exp = next(e for e in evs if isinstance(e, DeadlineExpired))
    (end,) = terminals(omni, "r1")
    assert exp.scope == "abort" and isinstance(end, Cancelled) and end.cause == exp.pos
    cancel = next(e for e in evs if isinstance(e, CancelRequested))
    assert end.ts_ns - cancel.ts_ns == int(omni.pipeline.abort_timeout_s * 1e9)


async def test_full_queue_refuses_admission_and_queued_requests_run_in_order():
    cfg = omni_like(
        thinker='max_queue = 2\nengine = { kind = "scripted", chunks_per_piece = 3, delay_ms = 1, capacity = 1 }'
    )
    omni, sim = await start_sim(cfg)
    results = [omni.submit(RequestSpec(prompt="x"), request_id=f"r{i}") for i in range(4)]
    assert [type(r).__name__ for r in results] == ["Admitted", "Admitted", "Admitted", "Rejected"]
    assert isinstance(results[3], Rejected) and results[3].reason == "overloaded"
    assert omni.orchestrator.queue_length("thinker") == 2
    sim.run_until_idle()
    starts = [e.request_id for e in omni.log.read() if isinstance(e, Routed)]
    assert starts == ["r0", "r1", "r2"]
    assert all(omni.state(f"r{i}").status == "finished" for i in range(3))
    assert omni.state("r3").status == "rejected"
    # The worker never held more than its capacity of 1.
    running = 0
    for e in omni.log.read():
        if isinstance(e, Routed) and e.seq == 0:
            running += 1
        elif type(e).__name__ == "StageFinished":
            running -= 1
        assert running <= 1


async def test_no_ready_replica_refuses_admission(omni_cfg):
    omni, sim = await start_sim(omni_cfg)
    sim.kill("talker", 0)
    rej = omni.submit(SPEC, request_id="r1")
    assert isinstance(rej, Rejected) and rej.reason == "not_ready" and "talker" in rej.message
    # A text-only request does not need the talker and is admitted.
    assert type(omni.submit(RequestSpec(prompt="x"), request_id="r2")).__name__ == "Admitted"


@pytest.mark.parametrize("when", [0, 7, 30])
async def test_shutdown_ends_every_request(omni_cfg, when):
    omni, sim = await start_sim(omni_cfg)
    omni.submit(SPEC, request_id="r1")
    for _ in range(when):
        sim.step()
    omni.cancel("r1", "shutdown")
    sim.run_until_idle()
    (end,) = terminals(omni, "r1")
    assert isinstance(end, Cancelled) and end.reason == "shutdown"
    assert_released(omni, sim, "r1")
