"""Start-up that survives a busy machine: slow loads are not deaths, a
replica that dies while starting is restarted, and when it keeps dying the
error says how.  Then hand-started workers: the shared worker token."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from omnix.events.blobs import MemoryBlobStore
from omnix.events.types import Chunk, StageFinished, WorkerJoined, WorkerLost
from omnix.pipelines.config import ScriptedArgs
from omnix.stages.options import RuntimeOptions
from omnix.stages.runtime import RuntimeConfigError, StageRuntime, WorkerStartError

from .conftest import pid_alive, scripted_pipeline


def _fake_python(tmp_path, body: str):
    """A stand-in for the worker's interpreter: runs ``body`` (sh), which
    may ``exec "$REAL" "$@"`` to start the real worker."""
    fake = tmp_path / "fakepython"
    fake.write_text(f'#!/bin/sh\nREAL="{sys.executable}"\nMARK="{tmp_path}/crashed"\n{body}\n')
    fake.chmod(0o755)
    return str(fake)


async def test_a_hand_started_worker_slow_to_load_keeps_its_heartbeats(harness_factory):
    # A worker we did not spawn has only heartbeats; its load blocks its
    # event loop (time.sleep in start(), as a model load does) 3x longer
    # than the bound.  Its heartbeat thread must keep it alive.
    h = harness_factory(
        scripted_pipeline(s=(ScriptedArgs(start_delay_ms=1500), 1)),
        spawn=False,
        endpoint="tcp://127.0.0.1:0",
        heartbeat_interval_s=0.1,
        lost_after_s=0.5,
    )
    await h.rt.start()
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "omnix.cli", "worker", "--connect", h.rt.endpoint, "--stage", "s"
    )
    try:
        await h.rt.wait_ready(30)
        assert not h.of(WorkerLost) and len(h.of(WorkerJoined)) == 1
    finally:
        worker.kill()
        await worker.wait()


async def test_a_spawned_worker_slow_to_load_is_not_lost_until_its_load_timeout(harness_factory):
    h = harness_factory(
        scripted_pipeline(s=(ScriptedArgs(start_delay_ms=60_000), 1)),
        heartbeat_interval_s=0.1,
        lost_after_s=0.5,
        load_timeout_s=2.5,
        start_attempts=1,
    )
    t0 = time.monotonic()
    with pytest.raises(WorkerStartError) as ei:
        await h.rt.start()
    # Loading far beyond the heartbeat bound, yet only the load timeout ended it.
    assert time.monotonic() - t0 >= 2.5
    assert "stage 's' replica 0 did not come up" in str(ei.value)
    assert "did not finish loading its engine within 2 s" in str(ei.value)


async def test_a_replica_that_crashes_once_while_starting_is_restarted(
    harness_factory, tmp_path, caplog
):
    python = _fake_python(
        tmp_path,
        (
            'if [ ! -e "$MARK" ]; then touch "$MARK"; echo "first start: out of memory" >&2; exit 7; fi\n'
            'exec "$REAL" "$@"'
        ),
    )
    h = harness_factory(scripted_pipeline(s=(ScriptedArgs(chunks_per_piece=2), 1)), python=python)
    await h.rt.start()
    assert h.rt.ready_replicas("s") == 1 and len(h.of(WorkerJoined)) == 1 and not h.of(WorkerLost)
    assert (
        "s/0 failed to start: worker process" in caplog.text and "exited with code 7" in caplog.text
    )
    h.send("r", "s")
    await h.wait_for(lambda: h.of(StageFinished, "r"), what="r on the restarted replica")
    assert [c.text for c in h.of(Chunk, "r")] == ["t0 ", "t1 "]


async def test_a_replica_that_always_crashes_fails_start_up_naming_the_cause(
    harness_factory, tmp_path
):
    python = _fake_python(
        tmp_path,
        (
            'echo "loading weights from /models/talker" >&2\n'
            'echo "RuntimeError: CUDA out of memory" >&2\n'
            # the worker's own log lines say nothing about the death: left out
            'echo "2026-12-04 17:00:00,123 INFO worker[talker/0] omnix.worker: worker talker/0 ready" >&2\n'
            "exit 3"
        ),
    )
    h = harness_factory(
        scripted_pipeline(talker=(ScriptedArgs(), 1)), python=python, start_attempts=3
    )
    with pytest.raises(WorkerStartError) as ei:
        await h.rt.start()
    msg = str(ei.value)
    assert "stage 'talker' replica 0 did not come up (3 failed starts in a row)" in msg
    assert "exited with code 3 before it was ready" in msg
    assert msg.rstrip().endswith("RuntimeError: CUDA out of memory")
    assert "INFO worker[" not in msg


async def test_a_replica_killed_by_a_signal_while_starting_says_which(harness_factory, tmp_path):
    python = _fake_python(tmp_path, 'echo "about to die" >&2\nkill -9 $$')
    h = harness_factory(scripted_pipeline(s=(ScriptedArgs(), 1)), python=python, start_attempts=2)
    with pytest.raises(
        WorkerStartError, match=r"(?s)2 failed starts in a row.*was killed by SIGKILL.*about to die"
    ):
        await h.rt.start()


async def test_a_ready_replica_lost_while_others_load_is_restarted(harness_factory):
    # The reported failure: code2wav was ready, went silent while the
    # other stages loaded, and start-up then waited forever for it.
    h = harness_factory(
        scripted_pipeline(fast=(ScriptedArgs(), 1), slow=(ScriptedArgs(start_delay_ms=3000), 1)),
        heartbeat_interval_s=0.1,
        lost_after_s=0.5,
    )
    starting = asyncio.create_task(h.rt.start())
    await h.wait_for(lambda: h.of(WorkerJoined), timeout=20, what="fast joined")
    (pid,) = h.joined_pids()
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.wait_for(starting, 30)
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert [e.worker_id for e in h.of(WorkerLost)] == ["fast/0"]
    assert sorted(e.worker_id for e in h.of(WorkerJoined)) == ["fast/0", "fast/0", "slow/0"]
    assert h.rt.ready_replicas("fast") == 1 and h.rt.ready_replicas("slow") == 1


# -- the worker token ---------------------------------------------------------------


def test_a_public_tcp_endpoint_requires_a_worker_token():
    p = scripted_pipeline(s=(ScriptedArgs(), 1))
    with pytest.raises(RuntimeConfigError, match="--worker-token or OMNIX_WORKER_TOKEN"):
        StageRuntime(
            p,
            lambda ev: None,
            MemoryBlobStore(),
            RuntimeOptions(endpoint="tcp://0.0.0.0:0", spawn=False),
        )
    with pytest.raises(RuntimeConfigError, match="'nope', which pipeline 'test' does not have"):
        StageRuntime(p, lambda ev: None, MemoryBlobStore(), RuntimeOptions(spawn=["s", "nope"]))
    for private in ("tcp://127.0.0.1:0", "tcp://127.0.0.2:0", "tcp://localhost:0", "tcp://[::1]:0"):
        StageRuntime(
            p, lambda ev: None, MemoryBlobStore(), RuntimeOptions(endpoint=private, spawn=False)
        )


@pytest.fixture
def two_hosts():
    """(the address the server binds, the address a worker connects to, a
    command prefix that runs the worker "on the other host").

    Two network namespaces joined by a veth pair when this machine lets us
    (root, iproute2); else two loopback addresses (the server on every
    interface, the worker through 127.0.0.2)."""
    ns = f"omnixw{os.getpid()}"
    host_if, ns_if = f"ox{os.getpid() % 100000}a", f"ox{os.getpid() % 100000}b"
    octet = os.getpid() % 250 + 1
    server_ip, worker_ip = f"10.217.{octet}.1", f"10.217.{octet}.2"
    setup = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if],
        ["ip", "link", "set", ns_if, "netns", ns],
        ["ip", "addr", "add", f"{server_ip}/30", "dev", host_if],
        ["ip", "link", "set", host_if, "up"],
        ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{worker_ip}/30", "dev", ns_if],
        ["ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up"],
        ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
    ]
    ok = os.geteuid() == 0
    for cmd in setup if ok else []:
        try:
            subprocess.run(cmd, check=True, capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            ok = False
            break
    try:
        if ok:
            yield server_ip, server_ip, ["ip", "netns", "exec", ns]
        else:
            yield "0.0.0.0", "127.0.0.2", []
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


async def test_workers_on_another_host_need_the_worker_token(harness_factory, two_hosts, caplog):
    bind, connect, on_other_host = two_hosts
    h = harness_factory(
        scripted_pipeline(s=(ScriptedArgs(chunks_per_piece=2), 1)),
        spawn=False,
        endpoint=f"tcp://{bind}:0",
        worker_token="s3cret",
    )
    await h.rt.start()
    port = h.rt.endpoint.rsplit(":", 1)[1]
    endpoint = f"tcp://{connect}:{port}"

    async def worker(*extra: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
        env = {k: v for k, v in os.environ.items() if k != "OMNIX_WORKER_TOKEN"} | (env or {})
        return await asyncio.create_subprocess_exec(
            *on_other_host,
            sys.executable,
            "-m",
            "omnix.cli",
            "worker",
            "--connect",
            endpoint,
            "--stage",
            "s",
            "--hello-timeout",
            "20",
            *extra,
            env=env,
            stderr=asyncio.subprocess.PIPE,
        )

    for extra, why in (
        ((), "this server requires a worker token"),
        (("--worker-token", "guess"), "wrong worker token"),
    ):
        refused = await worker(*extra)
        _, err = await asyncio.wait_for(refused.communicate(), 30)
        lines = err.decode().strip().splitlines()
        assert refused.returncode == 2, err
        assert why in lines[-1] and "--worker-token or OMNIX_WORKER_TOKEN" in lines[-1]
        assert "refused a worker (stage 's', pid " in caplog.text
        assert why in caplog.text
    good = await worker(env={"OMNIX_WORKER_TOKEN": "s3cret"})
    try:
        await h.rt.wait_ready(30)
        h.send("r", "s")
        await h.wait_for(lambda: h.of(StageFinished, "r"), what="r on the other host")
        assert [c.text for c in h.of(Chunk, "r")] == ["t0 ", "t1 "]
    finally:
        good.kill()
        await good.wait()
