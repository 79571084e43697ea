"""Fault injection at exact positions, with timers in virtual time, and the
invariants every fault run must keep."""

from __future__ import annotations

import pytest

from omnix.events.types import (
    Admitted,
    Chunk,
    DeadlineExpired,
    Finished,
    RequestSpec,
    Routed,
    StageFinished,
    WorkerJoined,
    WorkerLost,
)
from omnix.replay.faults import FaultError, FaultSpec, check_invariants, inject, parse_fault
from omnix.testing.sim import start_sim

from ..orchestrator.conftest import omni_like
from .conftest import trace_of


async def one_request(deadline_ms: int = 0, **overrides: str):
    omni, sim = await start_sim(omni_like(**overrides))
    spec = RequestSpec(prompt="hi", outputs=("text", "audio"), seed=1, deadline_ms=deadline_ms)
    omni.submit(spec, request_id="r1")
    sim.run_until_idle()
    return trace_of(omni, ["r1"])


def test_fault_syntax():
    assert parse_fault("worker-lost@40") == FaultSpec("worker-lost", 40)
    assert parse_fault("worker-lost@40:talker/1") == FaultSpec("worker-lost", 40, "talker/1")
    assert parse_fault("slow-stage@12:talker:250") == FaultSpec("slow-stage", 12, "talker", 250.0)
    assert parse_fault("cancel@7:r9") == FaultSpec("cancel", 7, "r9")
    assert str(parse_fault("slow-stage@12:talker:250")) == "slow-stage@12:talker:250"
    for bad in (
        "worker-lost",
        "lost@3",
        "slow-stage@3:talker",
        "slow-stage@3:talker:x",
        "worker-lost@3:talker",
    ):
        with pytest.raises(FaultError, match="cannot read fault"):
            parse_fault(bad)


async def test_worker_lost_mid_stream_migrates_the_stage_where_its_retry_allows():
    t = await one_request(talker="replicas = 2")
    ev = next(e for e in t.events if isinstance(e, Chunk) and e.stage == "talker" and e.index == 1)
    res = inject(t, [f"worker-lost@{ev.pos}"])
    assert res.ok, res.report(t)
    log = list(res.run.log.read())
    (lost,) = [e for e in log if isinstance(e, WorkerLost)]
    (cont,) = [e for e in log if isinstance(e, Routed) and e.resume]
    assert (cont.stage, cont.replica, cont.resume, cont.cause) == ("talker", 1, 2, lost.pos)
    # The recording's later talker outputs stand in for the continuation's.
    moved = [e for e in log if isinstance(e, Chunk) and e.stage == "talker" and e.pos > cont.pos]
    assert moved and moved[0].index == 2 and all(e.replica == 1 for e in moved)
    assert ("r1", "finished", "finished") in res.outcomes
    report = res.report(t)
    assert "migrated" in report and "CONTINUES after chunk 1" in report
    assert "all invariants hold" in report


async def test_worker_lost_mid_stream_fails_the_request_and_silences_the_worker():
    t = await one_request(talker="retry = false")
    ev = next(e for e in t.events if isinstance(e, Chunk) and e.stage == "talker" and e.index == 1)
    res = inject(t, [f"worker-lost@{ev.pos}"])
    assert res.ok, res.report(t)
    log = list(res.run.log.read())
    (lost,) = [e for e in log if isinstance(e, WorkerLost)]
    assert lost.worker_id == "talker/0" and lost.reason == "injected" and lost.ts_ns == ev.ts_ns
    end = log[-1] if log[-1].request_id == "r1" else None
    assert end is not None and type(end).__name__ == "Failed" and end.reason == "stage_lost"
    assert end.cause == lost.pos
    assert all(
        d.reason == "its worker was lost (injected fault)"
        for d in res.run.dropped
        if getattr(d.event, "stage", "") == "talker"
    )
    assert ("r1", "finished", "failed (stage_lost)") in res.outcomes
    report = res.report(t)
    assert "worker talker/0 is lost right after" in report and "all invariants hold" in report


async def test_worker_lost_before_output_retries_elsewhere_and_finishes():
    # Two thinkers with retry: losing thinker/0 right after routing retries
    # on thinker/1; the recording's thinker outputs stand in for its own.
    t = await one_request(thinker="replicas = 2\nretry = true\ntimeout_s = 3")
    routed = next(e for e in t.events if isinstance(e, Routed) and e.stage == "thinker")
    res = inject(t, [f"worker-lost@{routed.pos}"])
    assert res.ok, res.report(t)
    log = list(res.run.log.read())
    retries = [e for e in log if isinstance(e, Routed) and e.stage == "thinker"]
    assert [(r.replica, r.resume) for r in retries] == [(0, 0), (1, 0)]
    assert not res.run.timer_fired
    assert ("r1", "finished", "finished") in res.outcomes


async def test_worker_lost_with_no_replica_left_times_out_waiting_for_one():
    t = await one_request(thinker="timeout_s = 3")
    ev = next(e for e in t.events if isinstance(e, Chunk) and e.stage == "thinker" and e.index == 2)
    res = inject(t, [f"worker-lost@{ev.pos}"])
    assert res.ok, res.report(t)
    (fired,) = res.run.timer_fired
    assert isinstance(fired, DeadlineExpired) and fired.scope == "thinker"
    assert ("r1", "finished", "failed (no_replica)") in res.outcomes


async def test_cancel_at_a_position_ends_with_acknowledged_aborts():
    t = await one_request()
    ev = next(e for e in t.events if isinstance(e, Chunk) and e.stage == "code2wav")
    res = inject(t, [f"cancel@{ev.pos}"])
    assert res.ok, res.report(t)
    assert ("r1", "finished", "cancelled (client)") in res.outcomes
    acked = {(e.stage, e.finish_reason) for e in res.run.synthesized}
    assert acked == {("thinker", "aborted"), ("talker", "aborted"), ("code2wav", "aborted")}
    log = list(res.run.log.read())
    cancel = next(e for e in log if type(e).__name__ == "CancelRequested")
    assert not [e for e in log if isinstance(e, Routed) and e.pos > cancel.pos]


async def test_a_stalled_stage_times_out_and_a_deadline_cancels():
    t = await one_request(talker="timeout_s = 0.5")
    res = inject(t, ["slow-stage@0:talker:800"])
    assert res.ok, res.report(t)
    assert ("r1", "finished", "failed (stage_timeout)") in res.outcomes
    # A short stall within the timeout changes timing, not the outcome.
    small = inject(t, ["slow-stage@0:talker:100"])
    assert ("r1", "finished", "finished") in small.outcomes, small.report(t)
    # The whole run takes ~30 ms of virtual time; a 100 ms deadline holds
    # until the thinker stalls 200 ms, then the timer cancels the request.
    t = await one_request(deadline_ms=100)
    assert inject(t, []).outcomes == [("r1", "finished", "finished")]
    res = inject(t, ["slow-stage@10:thinker:200"])
    assert res.ok, res.report(t)
    assert ("r1", "finished", "cancelled (deadline)") in res.outcomes
    (fired,) = [e for e in res.run.timer_fired if e.scope == "request"]
    assert fired.ts_ns - t.events[3].ts_ns == 100_000_000


async def test_every_position_of_a_recorded_run_survives_every_fault():
    t = await one_request()
    n = len(t.events)
    start = next(e.pos for e in t.events if isinstance(e, Admitted))
    for p in range(start, n):
        for spec in (f"cancel@{p}", f"worker-lost@{p}:talker/0", f"worker-lost@{p}:thinker/0"):
            res = inject(t, [spec])
            assert res.ok, res.report(t)


async def test_fault_specs_that_do_not_fit_the_trace_are_refused():
    t = await one_request()
    with pytest.raises(FaultError, match="outside the trace"):
        inject(t, ["cancel@9999"])
    with pytest.raises(FaultError, match="names no worker"):
        inject(t, ["worker-lost@3"])  # Admitted
    with pytest.raises(FaultError, match="no worker 'talker/5'"):
        inject(t, ["worker-lost@5:talker/5"])
    with pytest.raises(FaultError, match="belongs to no request"):
        inject(t, ["cancel@0"])  # WorkerJoined
    with pytest.raises(FaultError, match="no stage 'vocoder'"):
        inject(t, ["slow-stage@5:vocoder:10"])


def test_invariant_checker_finds_violations():
    j = WorkerJoined(pos=0, worker_id="a/0", stage="a", replica=0, engine="x", capacity=1)
    adm = Admitted(pos=1, request_id="r", pipeline="p", spec=RequestSpec(prompt="x"))
    r0 = Routed(pos=2, request_id="r", stage="a", replica=0, seq=0, sources=(1,), last=True)
    lost = WorkerLost(pos=3, worker_id="a/0", stage="a", replica=0, reason="x")
    late = Chunk(pos=4, request_id="r", stage="a", replica=0, index=0, modality="text", text="x")
    fin = Finished(pos=5, request_id="r")
    after = StageFinished(pos=6, request_id="r", stage="a", replica=0, chunks=1)
    again = Finished(pos=7, request_id="r")
    v = check_invariants([j, adm, r0, lost, late, fin, after, again])
    rules = sorted({x.rule for x in v})
    assert rules == ["lost-worker-silent", "nothing-after-terminal", "one-terminal"]
    assert check_invariants([j, adm, r0], require_terminal=True)[0].detail == "never ended"
    assert check_invariants([j, adm, r0], require_terminal=False) == []
