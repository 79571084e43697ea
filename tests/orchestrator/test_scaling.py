"""Scaling decisions on the simulator: a stage with ``replicas = {min, max}``
starts a replica when its queue stays up, drains one when it stays idle
long enough (log time), never flaps, and never loses a request; the
decisions are a function of the log, so a fresh orchestrator and a
trace's window re-derive them exactly."""

from __future__ import annotations

import itertools

import pytest

from omnix.events.types import TERMINAL_TYPES, Finished, RequestSpec, Routed, Scaled, WorkerLost
from omnix.orchestrator.decide import Orchestrator
from omnix.orchestrator.recovery import recover
from omnix.orchestrator.scaling import ScaleRefused
from omnix.replay.drive import drive
from omnix.testing.sim import start_sim
from omnix.trace import export_trace, read_trace

from .conftest import omni_like

SPEC = RequestSpec(prompt="hi", outputs=("text", "audio"))
TALKER = 'engine = { kind = "scripted", chunks_per_piece = 3, delay_ms = 5, output_modality = "codec", capacity = 1 }'
S = 1_000_000_000


def scaling(up_after: int = 2, down_after_s: float = 0.05, lo: int = 1, hi: int = 3):
    rng = f"replicas = {{ min = {lo}, max = {hi}, up_after = {up_after}, down_after_s = {down_after_s} }}"
    return omni_like(talker=f"{rng}\n{TALKER}")


def scaled(omni) -> list[Scaled]:
    return [ev for ev in omni.log.read() if type(ev) is Scaled]


def ops(omni) -> list[tuple[int, str, str]]:
    return [(ev.replica, ev.op, ev.reason) for ev in scaled(omni)]


def assert_all_finished_once(omni, rids):
    for rid in rids:
        ends = [ev for ev in omni.log.events_for(rid) if isinstance(ev, TERMINAL_TYPES)]
        assert len(ends) == 1 and type(ends[0]) is Finished, (rid, ends)


async def burst(n: int, cfg=None, start: int = 0):
    omni, sim = await start_sim(cfg or scaling())
    rids = [f"r{start + i}" for i in range(n)]
    for rid in rids:
        omni.submit(SPEC, request_id=rid)
    sim.run_until_idle()
    return omni, sim, rids


async def test_a_queue_that_stays_up_starts_replicas_one_at_a_time_up_to_max():
    omni, _sim, rids = await burst(8)
    assert_all_finished_once(omni, rids)
    starts = [ev for ev in scaled(omni) if ev.op == "start"]
    assert [(ev.replica, ev.reason, ev.replicas) for ev in starts] == [
        (1, "queue", 2),
        (2, "queue", 3),
    ]
    log = list(omni.log.read())
    # A start is a decision caused by a sample (an admission or a stage's
    # end), and the second waits for the first to join.
    for ev in starts:
        assert ev.cause >= 0 and ev.ts_ns == log[ev.cause].ts_ns
    joined_1 = next(
        e.pos for e in log if type(e).__name__ == "WorkerJoined" and e.worker_id == "talker/1"
    )
    assert starts[0].pos < joined_1 < starts[1].pos
    # The new replicas took work.
    assert {e.replica for e in log if type(e) is Routed and e.stage == "talker"} == {0, 1, 2}


async def test_the_first_samples_with_a_queue_start_nothing():
    # up_after = 5: the burst's queue must be seen five samples in a row.
    cfg = scaling(up_after=5)
    omni, _sim, _ = await burst(3, cfg)
    assert ops(omni) == []  # two waiting requests never make five samples
    omni, _sim, _ = await burst(8, cfg)
    assert [op for op in ops(omni) if op[1] == "start"]


async def test_drain_waits_for_log_time_takes_no_new_work_and_the_replica_leaves():
    omni, _sim, rids = await burst(8)
    drains = [ev for ev in scaled(omni) if ev.op == "drain"]
    assert drains and all(ev.reason == "idle" and ev.cause >= 0 for ev in drains)
    # Every drain, not only the first, waits down_after_s of log time after
    # the stage's last start or drain before it.
    changes = [ev for ev in scaled(omni) if ev.op in ("start", "drain")]
    for d in drains:
        before = [ev for ev in changes if ev.pos < d.pos]
        assert before, d
        assert d.ts_ns - before[-1].ts_ns >= 0.05 * S, (d, before[-1])
    log = list(omni.log.read())
    for d in drains:
        rep = d.replica
        # No new request (seq 0) goes to a drained replica.
        assert not [
            e
            for e in log[d.pos :]
            if type(e) is Routed and e.stage == "talker" and e.replica == rep and e.seq == 0
        ]
        left = [
            e for e in log[d.pos :] if type(e) is Scaled and e.op == "left" and e.replica == rep
        ]
        assert len(left) == 1 and left[0].reason == "drained" and left[0].cause == -1
        assert not omni.log.state.workers[f"talker/{rep}"].alive
    assert not [e for e in log if type(e) is WorkerLost]
    # Highest first, down to min.
    assert [d.replica for d in drains] == [2, 1]
    assert omni.orchestrator.scaler.members("talker") == (0,)
    assert_all_finished_once(omni, rids)


async def test_a_replica_still_starting_is_not_drained_for_idleness_until_it_joins():
    # A slow start: the burst is over long before the new replica joins.
    omni, sim = await start_sim(scaling(up_after=1, down_after_s=0.05, hi=2))
    sim.start_delay_ns = 10 * S
    rids = [f"r{i}" for i in range(4)]
    for rid in rids:
        omni.submit(SPEC, request_id=rid)

    def finished() -> bool:
        return all(any(isinstance(e, TERMINAL_TYPES) for e in omni.log.events_for(r)) for r in rids)

    while not finished():
        assert sim.step()
    assert [op for op in ops(omni) if op[1] != "left"] == [(1, "start", "queue")]
    assert "talker/1" not in omni.log.state.workers  # not joined yet
    orch = omni.orchestrator
    # Idle, long past down_after_s: still no drain while talker/1 starts.
    assert orch.idle_scale(omni.log.state, sim.clock.now_ns() + S) == []
    sim.run_until_idle()  # talker/1 joins
    assert omni.log.state.workers["talker/1"].alive
    (drain,) = orch.idle_scale(omni.log.state, sim.clock.now_ns() + S)
    omni.sequencer.append(drain)
    sim.run_until_idle()
    assert ops(omni)[1:] == [(1, "drain", "idle"), (1, "left", "drained")]
    assert_all_finished_once(omni, rids)


async def test_steady_load_within_capacity_does_not_flap():
    omni, sim = await start_sim(scaling(down_after_s=0.5))
    for i in range(40):
        omni.submit(SPEC, request_id=f"s{i}")
        sim.run_until_idle()  # one at a time: the talker never queues
    assert ops(omni) == []
    # A burst scales up; more bursts inside down_after_s never drain.
    rids = []
    for wave in range(3):
        for i in range(6):
            rid = f"b{wave}-{i}"
            rids.append(rid)
            omni.submit(SPEC, request_id=rid)
        for _ in range(200):
            sim.step()
    sim.run_until_idle()
    changes = [op for op in ops(omni) if op[1] != "left"]
    starts = [c for c in changes if c[1] == "start"]
    drains = [c for c in changes if c[1] == "drain"]
    assert len(starts) <= 2 and len(drains) <= len(starts)
    # Nothing drains within down_after_s of the last start.
    evs = scaled(omni)
    for a, b in itertools.pairwise(evs):
        if a.op == "start" and b.op == "drain":
            assert b.ts_ns - a.ts_ns >= 0.5 * S
    assert_all_finished_once(omni, rids)


async def test_an_idle_server_drains_when_its_clock_says_so():
    # The burst ends within down_after_s of the last start: no sample
    # drains; the server's sweep asks with the clock's reading instead.
    omni, sim, _rids = await burst(8, scaling(down_after_s=1.0))
    assert [op for op in ops(omni) if op[1] == "drain"] == []
    orch = omni.orchestrator
    last = max(e.ts_ns for e in scaled(omni))
    assert orch.idle_scale(omni.log.state, last + S // 2) == []  # not yet
    drained = []
    for _ in range(3):
        sim.clock.advance(S)
        evs = orch.idle_scale(omni.log.state, sim.clock.now_ns())
        assert len(evs) <= 1  # one a stage per down_after_s
        for ev in evs:
            drained.append(omni.sequencer.append(ev))
        sim.run_until_idle()
    assert [(e.replica, e.op, e.reason, e.cause) for e in drained] == [
        (2, "drain", "idle", -1),
        (1, "drain", "idle", -1),
    ]
    assert [op[:2] for op in ops(omni) if op[1] == "left"] == [(2, "left"), (1, "left")]
    assert drive(read_trace(export_trace(omni.log, omni.blobs, omni.pipeline, None))).ok


async def test_the_log_explains_every_scale_decision():
    # Two bursts: the same replicas start, drain and leave twice (each joins
    # a second time), then a late request.
    omni, sim, _rids = await burst(8)
    for wave in ("w2", "late"):
        sim.clock.advance(2 * S)
        for i in range(8 if wave == "w2" else 1):
            omni.submit(SPEC, request_id=f"{wave}-{i}")
        sim.run_until_idle()
    cfg = omni.pipeline
    assert [op for op in ops(omni) if op[1] == "left"] == [
        (1, "left", "drained"),
        (2, "left", "drained"),
    ] * 2
    assert omni.log.state.workers["talker/1"].incarnation == 2
    # A fresh orchestrator shown the log makes the same decisions...
    fresh = Orchestrator(cfg)
    recover(fresh, omni.log.read())
    assert fresh.scaler.members("talker") == omni.orchestrator.scaler.members("talker")
    # ...and replay drives the whole log, and windows that start after
    # scaling (the Scaled events before them come with them), with zero
    # divergence.
    whole = read_trace(export_trace(omni.log, omni.blobs, cfg, None))
    assert drive(whole).ok
    for rid in ("r3", "w2-3", "late-0"):
        window = read_trace(export_trace(omni.log, omni.blobs, cfg, [rid]))
        assert drive(window).ok, rid


async def test_a_count_set_by_hand_is_the_same_event_and_checked():
    omni, sim = await start_sim(scaling(hi=4))
    evs = omni.scale("talker", 3)
    assert [(e.replica, e.op, e.reason, e.replicas, e.cause) for e in evs] == [
        (1, "start", "admin", 2, -1),
        (2, "start", "admin", 3, -1),
    ]
    assert omni.scale("talker", 3) == []
    sim.run_until_idle()
    assert omni.ready()["talker"] == 3
    (drain,) = omni.scale("talker", 2)
    assert (drain.replica, drain.op) == (2, "drain")
    assert omni.ready()["talker"] == 2  # out of routing at once
    for stage, n, status, code in [
        ("nope", 2, 404, "unknown_stage"),
        ("thinker", 2, 409, "fixed_replicas"),
        ("talker", 0, 400, "out_of_range"),
        ("talker", 5, 400, "out_of_range"),
    ]:
        with pytest.raises(ScaleRefused) as err:
            omni.scale(stage, n)
        assert (err.value.status, err.value.code) == (status, code)
    # Replica 2 has not left yet: it counts toward max.
    with pytest.raises(ScaleRefused) as err:
        omni.scale("talker", 4)
    assert err.value.code == "replicas_draining"
    sim.run_until_idle()
    assert [e.op for e in scaled(omni)][-1] == "left"
    assert len(omni.scale("talker", 4)) == 2
    sim.run_until_idle()
    assert omni.ready()["talker"] == 4
    assert drive(read_trace(export_trace(omni.log, omni.blobs, omni.pipeline, None))).ok


async def test_a_restarted_server_goes_back_to_min():
    omni, sim = await start_sim(scaling(hi=3))
    omni.scale("talker", 3)
    sim.run_until_idle()
    orch = omni.orchestrator
    for ev in (
        WorkerLost(worker_id=f"talker/{r}", stage="talker", replica=r, reason="server restarted")
        for r in range(3)
    ):
        omni.sequencer.append(ev)
    evs = orch.scaler.restart(omni.log.state)
    assert [(e.replica, e.op, e.reason, e.replicas) for e in evs] == [
        (2, "drain", "restart", 2),
        (1, "drain", "restart", 1),
    ]
    for ev in evs:
        omni.sequencer.append(ev)
    assert orch.scaler.members("talker") == (0,) and orch.scaler.draining("talker") == ()


async def test_a_server_restarted_on_its_log_starts_min_and_scales_again(tmp_path):
    from omnix.api import Omni
    from omnix.testing.serving import InProcessRuntime

    cfg = scaling(up_after=1000, down_after_s=600)
    async with Omni(cfg, log_dir=tmp_path, runtime_factory=InProcessRuntime) as omni:
        omni.scale("talker", 3)
        await omni.wait_ready(every_replica=True, timeout=10)
        assert omni.ready()["talker"] == 3
        assert (await omni.generate(SPEC)).ok
    async with Omni(cfg, log_dir=tmp_path, runtime_factory=InProcessRuntime) as again:
        await again.wait_ready(every_replica=True, timeout=10)
        scaler = again.orchestrator.scaler
        assert scaler.members("talker") == (0,) and again.ready()["talker"] == 1
        restart = [e for e in again.log.read() if type(e) is Scaled and e.reason == "restart"]
        assert [(e.replica, e.op) for e in restart] == [(2, "drain"), (1, "drain")]
        assert len(again.scale("talker", 2)) == 1
        await again.wait_ready(every_replica=True, timeout=10)
        assert again.ready()["talker"] == 2
        assert (await again.generate(SPEC)).ok


async def test_a_drained_replica_finishes_its_requests_there_then_leaves():
    omni, sim = await start_sim(scaling(up_after=1000, down_after_s=600))
    omni.scale("talker", 3)
    sim.run_until_idle()
    rids = [f"d{i}" for i in range(6)]
    for rid in rids:
        omni.submit(SPEC, request_id=rid)
    while not omni.log.state.requests_on("talker/2"):
        assert sim.step()
    on_2 = omni.log.state.requests_on("talker/2")
    (drain,) = omni.scale("talker", 2)
    assert drain.replica == 2
    sim.run_until_idle()
    assert_all_finished_once(omni, rids)
    log = list(omni.log.read())
    (left,) = [e for e in log if type(e) is Scaled and e.op == "left"]
    for rid in on_2:
        talker = [e for e in omni.log.events_for(rid) if getattr(e, "stage", "") == "talker"]
        # Every piece and chunk of it stayed on replica 2, and it ended before the replica left.
        assert {e.replica for e in talker} == {2}
        assert talker[-1].pos < left.pos
    later = [
        e for e in log[drain.pos :] if type(e) is Routed and e.stage == "talker" and e.seq == 0
    ]
    assert later and all(e.replica != 2 for e in later)
