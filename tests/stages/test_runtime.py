"""StageRuntime with real worker processes and sockets (scripted engines only)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time

import numpy as np
import psutil
import pytest
import zmq

from omnix.engines.scripted import FAIL_START_ENV, JOURNAL_ENV
from omnix.events.blobs import MemoryBlobStore
from omnix.events.types import (
    Chunk,
    Progress,
    StageFailed,
    StageFinished,
    StageParams,
    WorkerJoined,
    WorkerLost,
)
from omnix.pipelines.config import ScriptedArgs
from omnix.stages.options import RuntimeOptions
from omnix.stages.runtime import (
    CapacityExceeded,
    ReplicaUnavailable,
    StageRuntime,
    WorkerStartError,
)
from omnix.transport import messages as m
from omnix.transport.codec import FrameEncoder
from omnix.transport.sockets import make_dealer, readable, recv_parts
from omnix.transport.work import InputPiece, WorkItem

from ..waiting import wait_until
from .conftest import pid_alive, scripted_pipeline


def _finished(h, rid):
    return h.of(StageFinished, rid) or h.of(StageFailed, rid)


async def test_replicas_join_and_stream_outputs(harness_factory):
    h = harness_factory(
        scripted_pipeline(
            text=(ScriptedArgs(chunks_per_piece=3), 2),
            audio=(ScriptedArgs(chunks_per_piece=2, output_modality="audio"), 1),
        )
    )
    await h.rt.start()
    joined = h.of(WorkerJoined)
    assert sorted(e.worker_id for e in joined) == ["audio/0", "text/0", "text/1"]
    assert all(e.engine == "scripted" and e.capacity == 8 and e.pid > 0 for e in joined)
    assert h.rt.ready_replicas("text") == 2 and h.rt.ready_replicas("audio") == 1
    h.send("a", "text", 0, (InputPiece(text="x"),), last=False)
    h.send("b", "text", 1)
    h.send("c", "audio", 0, params=StageParams(num_inference_steps=2))
    h.send("a", "text", 0, (InputPiece(text="y"),), last=True)  # streamed input
    for rid in "abc":
        await h.wait_for(lambda rid=rid: _finished(h, rid), what=f"{rid} finished")
    assert h.illegal == []
    assert h.kinds("b") == ["StageStarted", "Chunk", "Chunk", "Chunk", "StageFinished"]
    assert [c.text for c in h.of(Chunk, "a")] == [f"t{n} " for n in range(6)]
    fin = h.of(StageFinished, "a")[0]
    assert (fin.chunks, fin.finish_reason, fin.prompt_tokens, fin.output_tokens) == (
        6,
        "stop",
        2,
        6,
    )
    # Progress outputs are events of their own and do not count as chunks.
    assert h.kinds("c") == [
        "StageStarted",
        "Progress",
        "Progress",
        "Chunk",
        "Chunk",
        "StageFinished",
    ]
    assert [(p.step, p.total) for p in h.of(Progress, "c")] == [(1, 2), (2, 2)]
    blob = h.of(Chunk, "c")[1].blob
    assert blob is not None and blob.dtype == "<f4"
    assert np.array_equal(h.blobs.get_array(blob), np.full(240, 1, np.float32))
    assert h.rt.in_flight("text", 0) == 0


async def test_kill_9_mid_stream_is_lost_within_bound_and_replica_rejoins(harness_factory):
    h = harness_factory(
        scripted_pipeline(s=(ScriptedArgs(chunks_per_piece=500, delay_ms=5), 1)),
        heartbeat_interval_s=0.25,
        lost_after_s=1.0,
    )
    await h.rt.start()
    pid = h.joined_pids()[0]
    h.send("r", "s")
    await h.wait_for(lambda: len(h.of(Chunk, "r")) >= 3, what="3 chunks")
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    await h.wait_for(lambda: h.of(WorkerLost), what="WorkerLost")
    t_lost = next(t for t, e in h.events if isinstance(e, WorkerLost))
    assert t_lost - t_kill < h.rt.lost_after_s
    lost = h.of(WorkerLost)[0]
    assert (lost.worker_id, lost.stage, lost.replica) == ("s/0", "s", 0)
    assert "SIGKILL" in lost.reason
    # The reducer marked the request's stage lost; the worker sent nothing more.
    assert h.log.state.requests["r"].stage("s").status == "lost"
    n_events = len(h.for_request("r"))
    assert h.kinds("r")[-1] == "Chunk" and not _finished(h, "r")
    # It restarts and rejoins under the same worker id with a new process.
    await h.wait_for(lambda: len(h.of(WorkerJoined)) == 2, what="rejoin")
    rejoined = h.of(WorkerJoined)[1]
    assert rejoined.worker_id == "s/0" and rejoined.pid != pid and not pid_alive(pid)
    assert h.log.state.workers["s/0"].incarnation == 2
    h.send("r2", "s", params=StageParams(max_tokens=2))
    await h.wait_for(lambda: _finished(h, "r2"), what="r2 on the new worker")
    assert h.of(StageFinished, "r2")[0].finish_reason == "length"
    assert len(h.for_request("r")) == n_events and h.illegal == []


async def test_silent_worker_is_lost_by_heartbeat_and_replaced(harness_factory):
    h = harness_factory(
        scripted_pipeline(s=(ScriptedArgs(), 1)), heartbeat_interval_s=0.2, lost_after_s=1.0
    )
    await h.rt.start()
    pid = h.joined_pids()[0]
    t_stop = time.monotonic()
    os.kill(pid, signal.SIGSTOP)  # alive, but silent: only heartbeats can tell
    await h.wait_for(lambda: h.of(WorkerLost), timeout=5, what="WorkerLost")
    t_lost = next(t for t, e in h.events if isinstance(e, WorkerLost))
    assert t_lost - t_stop <= h.rt.lost_after_s + 0.15  # the bound, plus loop scheduling slack
    assert "no heartbeat" in h.of(WorkerLost)[0].reason
    await h.wait_for(lambda: len(h.of(WorkerJoined)) == 2, what="replacement")
    await h.wait_for(lambda: not pid_alive(pid), timeout=3, what="the stopped worker killed")


async def test_abort_reaches_engine_and_acknowledges_once(harness_factory, tmp_path):
    journal = tmp_path / "journal.jsonl"
    h = harness_factory(
        scripted_pipeline(s=(ScriptedArgs(chunks_per_piece=1000, delay_ms=5), 1)),
        worker_env={JOURNAL_ENV: str(journal)},
    )
    await h.rt.start()
    h.send("r", "s", last=False)
    await h.wait_for(lambda: len(h.of(Chunk, "r")) >= 2, what="2 chunks")
    h.rt.abort("r", "s", 0)
    h.rt.abort("r", "s", 0)  # a second abort is a no-op
    await h.wait_for(lambda: _finished(h, "r"), what="abort ack")
    fin = h.of(StageFinished, "r")
    assert len(fin) == 1 and fin[0].finish_reason == "aborted"
    assert fin[0].chunks == len(h.of(Chunk, "r"))
    n = len(h.for_request("r"))
    # Late pieces for the aborted request are dropped, an abort for a request
    # that no longer runs is ignored: nothing more arrives for it.
    h.rt.send(WorkItem("r", "s", 0, 1, True, (InputPiece(text="late"),)))
    h.rt.abort("r", "s", 0)
    h.send("other", "s", params=StageParams(max_tokens=1))
    await h.wait_for(lambda: _finished(h, "other"), what="other finished")
    assert len(h.for_request("r")) == n and h.kinds("r")[-1] == "StageFinished"
    lines = [json.loads(ln) for ln in journal.read_text().splitlines()]
    assert {"event": "abort", "request_id": "r"}.items() <= next(
        ln for ln in lines if ln["event"] == "abort"
    ).items()
    assert [ln["request_id"] for ln in lines if ln["event"] == "generate"] == ["r", "other"]
    assert h.illegal == []


async def test_capacity_is_guarded_and_credits_return(harness_factory):
    h = harness_factory(
        scripted_pipeline(s=(ScriptedArgs(chunks_per_piece=3, capacity=2, hang_at=1), 1))
    )
    await h.rt.start()
    h.send("a", "s")
    h.send("b", "s")
    assert h.rt.in_flight("s", 0) == 2 and h.rt.capacity("s", 0) == 2
    with pytest.raises(CapacityExceeded, match="capacity 2"):
        h.rt.send(WorkItem("c", "s", 0, 0, True, (InputPiece(text="x"),)))
    with pytest.raises(KeyError, match="no stage 'nope'"):
        h.rt.send(WorkItem("c", "nope", 0, 0, True, ()))
    await h.wait_for(lambda: len(h.of(Chunk)) == 2, what="both hang after one chunk")
    h.rt.abort("a", "s", 0)
    await h.wait_for(lambda: _finished(h, "a"), what="a aborted")
    assert h.rt.in_flight("s", 0) == 1
    h.send("c", "s")  # the credit came back
    h.rt.release("b")  # a terminal decision without an abort: aborted, and silenced
    await h.wait_for(lambda: h.rt.in_flight("s", 0) == 1, what="b's credit back")
    assert h.kinds("b") == ["StageStarted", "Chunk"]
    assert h.illegal == []


async def test_engine_failure_fails_request_worker_lives_on(harness_factory):
    h = harness_factory(scripted_pipeline(s=(ScriptedArgs(chunks_per_piece=4, fail_at=2), 1)))
    await h.rt.start()
    h.send("r", "s")
    await h.wait_for(lambda: _finished(h, "r"))
    assert h.kinds("r") == ["StageStarted", "Chunk", "Chunk", "StageFailed"]
    assert "scripted failure at output 2" in h.of(StageFailed, "r")[0].message
    h.send("r2", "s", params=StageParams(max_tokens=1))
    await h.wait_for(lambda: _finished(h, "r2"))
    assert h.kinds("r2")[-1] == "StageFinished" and not h.of(WorkerLost)


@pytest.mark.parametrize(("fault", "retry"), [("fail_at", True), ("refuse_at", False)])
async def test_an_engine_value_error_is_reported_as_the_requests_own_input(
    harness_factory, fault, retry
):
    """A ValueError from the engine is the request's own input refused:
    its StageFailed says not to continue elsewhere; any other error may."""
    h = harness_factory(scripted_pipeline(s=(ScriptedArgs(chunks_per_piece=4, **{fault: 1}), 1)))
    await h.rt.start()
    h.send("r", "s")
    await h.wait_for(lambda: _finished(h, "r"))
    (failed,) = h.of(StageFailed, "r")
    assert failed.retry is retry


async def test_no_restart_makes_replica_unavailable(harness_factory):
    h = harness_factory(
        scripted_pipeline(s=(ScriptedArgs(chunks_per_piece=100, crash_at=1), 1)), restart=False
    )
    before = {c.pid for c in psutil.Process().children()}
    await h.rt.start()
    h.send("r", "s")  # the engine kills its worker at output 1
    await h.wait_for(lambda: h.of(WorkerLost), what="WorkerLost")
    assert "exited with code 1" in h.of(WorkerLost)[0].reason
    # Output 0 and the crash happen in one loop turn: the unsent batch dies with it.
    assert h.kinds("r") == []
    assert h.rt.ready_replicas("s") == 0
    with pytest.raises(ReplicaUnavailable, match="not ready"):
        h.rt.send(WorkItem("r2", "s", 0, 0, True, ()))
    # An absence has no event to wait for.  A restart would spawn its process
    # at once (a worker that was ready restarts with no backoff), so a short
    # window shows one; a join, which takes a start-up, may not show in it.
    await asyncio.sleep(0.3)
    assert len(h.of(WorkerJoined)) == 1
    assert not [p for p in {c.pid for c in psutil.Process().children()} - before if pid_alive(p)]


async def test_heartbeats_flow_while_engine_load_blocks(harness_factory):
    h = harness_factory(
        scripted_pipeline(s=(ScriptedArgs(start_delay_ms=1200), 1)),
        heartbeat_interval_s=0.1,
        lost_after_s=0.5,
    )
    await h.rt.start()  # the load blocks the worker's loop 3x longer than the bound
    assert h.rt.ready_replicas("s") == 1 and not h.of(WorkerLost)


async def test_start_failure_names_the_stage_with_exit_code_and_output(harness_factory, tmp_path):
    fake = tmp_path / "fakepython"
    fake.write_text("#!/bin/sh\necho 'boom: cannot load weights' >&2\nexit 3\n")
    fake.chmod(0o755)
    h = harness_factory(scripted_pipeline(talker=(ScriptedArgs(), 1)), python=str(fake))
    with pytest.raises(WorkerStartError) as ei:
        await h.rt.start()
    msg = str(ei.value)
    assert (
        "stage 'talker' replica 0" in msg
        and "exited with code 3" in msg
        and "boom: cannot load weights" in msg
    )
    # A worker that starts but whose engine cannot load says so in the error.
    h3 = harness_factory(
        scripted_pipeline(decoder=(ScriptedArgs(), 1)),
        worker_env={FAIL_START_ENV: "no weights at /models/x"},
    )
    with pytest.raises(WorkerStartError) as ei:
        await h3.rt.start()
    msg = str(ei.value)
    assert (
        "stage 'decoder' replica 0 could not load its engine" in msg
        and "no weights at /models/x" in msg
    )


async def test_shutdown_twice_leaves_no_child(harness_factory):
    h = harness_factory(
        scripted_pipeline(
            a=(ScriptedArgs(chunks_per_piece=10_000, delay_ms=1), 2), b=(ScriptedArgs(), 1)
        )
    )
    # Other tests' session-scoped servers may own children too: only what
    # this runtime started must be gone.
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    await h.rt.start()
    pids = h.joined_pids()
    assert len(pids) == 3 and all(pid_alive(p) for p in pids)
    h.send("busy", "a")  # shut down with a request in flight
    await h.wait_for(lambda: h.of(Chunk, "busy"))
    await h.rt.shutdown()
    await h.rt.shutdown()
    assert not any(pid_alive(p) for p in pids)
    assert {c.pid for c in psutil.Process().children(recursive=True)} <= before
    assert sorted(e.reason for e in h.of(WorkerLost)) == ["shutdown"] * 3
    assert h.rt.ready_replicas("a") == 0


async def _shut_down_slow_closer(harness_factory, tmp_path, close_delay_ms: float, grace_s: float):
    """Start one worker whose engine takes ``close_delay_ms`` to close, shut
    the runtime down with ``grace_s``: (its pid, seconds the shutdown took,
    the engine's journal)."""
    journal = tmp_path / "journal.jsonl"
    h = harness_factory(
        scripted_pipeline(s=(ScriptedArgs(close_delay_ms=close_delay_ms), 1)),
        worker_env={JOURNAL_ENV: str(journal)},
        shutdown_grace_s=grace_s,
    )
    await h.rt.start()
    (pid,) = h.joined_pids()
    t0 = time.monotonic()
    await h.rt.shutdown()
    events = (
        [json.loads(ln)["event"] for ln in journal.read_text().splitlines()]
        if journal.exists()
        else []
    )
    return pid, time.monotonic() - t0, events


async def test_a_worker_slow_to_close_gets_the_grace_to_exit_by_itself(
    harness_factory, tmp_path, caplog
):
    # vLLM's teardown takes seconds; a worker that is busy closing its
    # engine must not be signalled while it does (nor warned about).
    pid, _, journal = await _shut_down_slow_closer(harness_factory, tmp_path, 1500, grace_s=6.0)
    assert not pid_alive(pid)
    assert journal[-1] == "close"
    assert "did not exit" not in caplog.text


async def test_a_worker_that_outlasts_the_grace_is_terminated_then_killed(
    harness_factory, tmp_path, caplog
):
    pid, took, journal = await _shut_down_slow_closer(
        harness_factory, tmp_path, 60_000, grace_s=0.3
    )
    # the grace, then SIGTERM: the stopping worker exits at once (SIGKILL 2 s later otherwise)
    assert took < 6.0
    assert not pid_alive(pid)
    assert "close" not in journal
    assert (
        f"worker s/0 (pid {pid}) did not exit within 0.3 s of shutdown; terminating" in caplog.text
    )


async def test_shutdown_during_start_up_does_not_wait_for_a_loading_engine(harness_factory, caplog):
    # start_delay_ms blocks the worker's loop as a model load does; the
    # grace (10 s by default) is for workers that drain, not for a load.
    caplog.set_level(logging.DEBUG, logger="omnix.runtime")
    h = harness_factory(scripted_pipeline(s=(ScriptedArgs(start_delay_ms=30_000), 1)))
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    starting = asyncio.create_task(h.rt.start())
    # Welcomed: the worker has its config and is loading its engine.
    await wait_until(lambda: "welcomed s/0" in caplog.text, "the worker's hello", timeout=30)
    (pid,) = {c.pid for c in psutil.Process().children()} - before
    t0 = time.monotonic()
    starting.cancel()  # what omnix serve does on Ctrl-C while it starts
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert time.monotonic() - t0 < 5.0  # SIGTERM, 2 s, SIGKILL
    assert not pid_alive(pid)
    assert f"worker s/0 (pid {pid}) is still loading its engine; terminating" in caplog.text
    assert "did not exit" not in caplog.text


def test_shutdown_grace_must_not_be_negative():
    with pytest.raises(ValueError, match="shutdown_grace_s=-1"):
        StageRuntime(
            scripted_pipeline(s=(ScriptedArgs(), 1)),
            lambda ev: None,
            MemoryBlobStore(),
            RuntimeOptions(shutdown_grace_s=-1),
        )


async def test_a_second_signal_stops_a_closing_worker_at_once(harness_factory):
    # Ctrl-C on a hand-started worker whose engine takes long to close,
    # then Ctrl-C again: it exits now (128 + SIGINT), not after the close.
    h = harness_factory(
        scripted_pipeline(s=(ScriptedArgs(close_delay_ms=60_000), 1)),
        endpoint="tcp://127.0.0.1:0",
        spawn=False,
    )
    await h.rt.start()
    cmd = [sys.executable, "-m", "omnix.cli", "worker", "--connect", h.rt.endpoint, "--stage", "s"]
    worker = await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE)
    try:
        await h.rt.wait_ready(20)
        worker.send_signal(signal.SIGINT)
        async with asyncio.timeout(5):
            while b"stopping: received SIGINT" not in await worker.stderr.readline():
                pass
        # An absence has no event to wait for: the first signal must not end
        # the worker (its engine takes 60 s to close); a short window shows an exit.
        await asyncio.sleep(0.2)
        assert worker.returncode is None and not h.of(WorkerLost)  # closing its engine
        worker.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(worker.communicate(), 5)
        assert worker.returncode == 128 + signal.SIGINT
        assert b"SIGINT again: exiting now" in err
    finally:
        if worker.returncode is None:
            worker.kill()
        await worker.wait()


async def test_hand_started_worker_joins_over_tcp(harness_factory):
    h = harness_factory(
        scripted_pipeline(s=(ScriptedArgs(chunks_per_piece=2), 1)),
        endpoint="tcp://127.0.0.1:0",
        spawn=False,
        heartbeat_interval_s=0.2,
        lost_after_s=1.0,
    )
    await h.rt.start()  # spawn=False: binds and returns
    assert h.rt.endpoint.startswith("tcp://127.0.0.1:") and not h.rt.endpoint.endswith(":0")
    cmd = [sys.executable, "-m", "omnix.cli", "worker", "--connect", h.rt.endpoint, "--stage", "s"]
    worker = await asyncio.create_subprocess_exec(*cmd)
    try:
        await h.rt.wait_ready(20)
        joined = h.of(WorkerJoined)[0]
        assert (joined.worker_id, joined.pid) == ("s/0", worker.pid)
        h.send("r", "s")
        await h.wait_for(lambda: _finished(h, "r"))
        assert [c.text for c in h.of(Chunk, "r")] == ["t0 ", "t1 "]
        # A second worker for the single replica is refused and says why.
        extra = await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(extra.communicate(), 20)
        assert extra.returncode == 2 and b"replicas of stage 's' have workers" in err
        # Not our child: only heartbeats can tell it died.
        t_kill = time.monotonic()
        worker.kill()
        await h.wait_for(lambda: h.of(WorkerLost), timeout=5, what="WorkerLost")
        t_lost = next(t for t, e in h.events if isinstance(e, WorkerLost))
        assert t_lost - t_kill <= h.rt.lost_after_s + 0.15
        assert "no heartbeat" in h.of(WorkerLost)[0].reason
        assert h.rt.ready_replicas("s") == 0
    finally:
        if worker.returncode is None:
            worker.kill()
        await worker.wait()


async def test_worker_cpus_pins_the_worker_and_its_threads(harness_factory):
    cpus = sorted(os.sched_getaffinity(0))
    h = harness_factory(
        scripted_pipeline(s=(ScriptedArgs(), 1)), worker_cpus={"s/0": str(cpus[-1])}
    )
    await h.rt.start()
    proc = psutil.Process(h.joined_pids()[0])
    threads = [t.id for t in proc.threads()]
    assert len(threads) >= 3  # main, ZMQ I/O, heartbeat
    assert all(os.sched_getaffinity(tid) == {cpus[-1]} for tid in threads)


_OWNER = """
import asyncio, sys
from omnix.events.blobs import MemoryBlobStore
from omnix.events.types import WorkerJoined
from omnix.pipelines.config import PipelineConfig, ScriptedArgs, StageConfig
from omnix.stages.options import RuntimeOptions
from omnix.stages.runtime import StageRuntime

async def main():
    evs = []
    p = PipelineConfig(name="p", stages=(StageConfig(name="s", engine=ScriptedArgs(), replicas=2),))  # 2: both must go
    rt = StageRuntime(p, evs.append, MemoryBlobStore(), RuntimeOptions(heartbeat_interval_s=0.2, lost_after_s=1.0))
    await rt.start()
    print(" ".join(str(e.pid) for e in evs if isinstance(e, WorkerJoined)), flush=True)
    await asyncio.sleep(60)  # serving, until the test kills it (bounded, should the test not)

asyncio.run(main())
"""


async def test_workers_die_with_a_killed_server():
    owner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _OWNER, stdout=asyncio.subprocess.PIPE
    )
    try:
        line = await asyncio.wait_for(owner.stdout.readline(), 30)
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        owner.kill()  # no shutdown(), no finalizer: only the workers can notice
        await owner.wait()
        await wait_until(lambda: not any(pid_alive(p) for p in pids), "orphaned workers to exit")
        assert not any(pid_alive(p) for p in pids), "orphaned workers"
    finally:
        if owner.returncode is None:
            owner.kill()
            await owner.wait()


async def test_work_sent_in_one_loop_turn_leaves_as_one_message_and_aborts_follow_it(
    harness_factory,
):
    # A raw worker: it sees every message the runtime sends.
    h = harness_factory(scripted_pipeline(s=(ScriptedArgs(), 1)), spawn=False)
    await h.rt.start()
    ctx = zmq.Context()
    sock = make_dealer(ctx, h.rt.endpoint, b"wraw")
    enc, dec = FrameEncoder(), m.decoders(m.WORKER_BOUND)

    async def recv() -> tuple[bytes, object]:
        await wait_until(lambda: readable(sock), "a message from the runtime")
        mtype, body, aux = recv_parts(sock)
        return mtype, dec[mtype].decode(body, aux)

    try:
        sock.send_multipart(
            enc.encode(m.HELLO, m.Hello(m.PROTOCOL_VERSION, "s", -1, os.getpid(), "raw"))
        )
        assert (await recv())[0] == m.WELCOME
        sock.send_multipart(enc.encode(m.READY, m.Ready("raw", "scripted", 8)))
        await h.wait_for(lambda: h.rt.ready_replicas("s") == 1)
        for rid in ("a", "b", "c"):  # one burst, as concurrent admissions make it
            h.send(rid, "s")
        mtype, items = await recv()
        assert mtype == m.WORK and [w.request_id for w in items] == ["a", "b", "c"]
        # An abort in the same turn as new work never overtakes it.
        h.send("d", "s")
        h.rt.abort("d", "s", 0)
        assert [
            (t, [w.request_id for w in msg] if t == m.WORK else msg)
            for t, msg in [await recv(), await recv()]
        ] == [(m.WORK, ["d"]), (m.ABORT, m.Abort("d"))]
    finally:
        sock.close(0)
        ctx.term()
