"""Workers forked warm by a zygote: real processes, real sockets.

A forked worker is the zygote's child in a session of its own, with the
environment, CPUs and output pipe it was given, and its exit status
(code or signal) comes back; runtimes alike share one zygote, and an idle
one goes when one of another kind starts; a zygote killed with SIGKILL takes its
workers down and says so, and the runtime then starts them cold; a zygote
dies with the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from omnix.pipelines.config import CodecArgs, PipelineConfig, StageConfig
from omnix.stages.worker_cli import CPUS_ENV
from omnix.stages.worker_process import EXIT_NO_SERVER
from omnix.stages.zygote import Zygote, acquire_zygote, release_zygote, zygote_env

from ..waiting import wait_until_blocking
from .conftest import pid_alive

#: A worker that waits for a server nobody runs, then exits EXIT_NO_SERVER.
LONELY = ("--connect", "tcp://127.0.0.1:9", "--stage", "x", "--reconnect-for", "0")


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


@pytest.fixture
def zygote():
    z = Zygote(sys.executable, (), zygote_env(os.environ))
    assert z.wait_ready(60)
    yield z
    z.close()


def test_a_forked_worker_has_its_own_session_environment_cpus_and_output(zygote) -> None:
    cpu = max(os.sched_getaffinity(0))
    # Pinned once by the CPUs it is given, once by its environment (the
    # worker reads --cpus from it): each must reach the child.
    given = {"cpus": [cpu]}, {"env": {CPUS_ENV: str(cpu)}}
    for how in given:
        r, w = os.pipe()
        env = {**os.environ, **how.get("env", {})}
        proc = zygote.fork((*LONELY, "--hello-timeout", "30"), env, w, how.get("cpus", ()))
        os.close(w)
        try:
            wait_until_blocking(
                lambda pid=proc.pid: os.sched_getaffinity(pid) == {cpu}, "its CPUs", 10.0
            )
            fields = _stat(proc.pid)
            assert int(fields[1]) == zygote.pid  # its parent
            assert int(fields[3]) == proc.pid  # the leader of its own session
        finally:
            os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
        os.close(r)


def test_a_forked_workers_exit_code_and_output_come_back(zygote) -> None:
    r, w = os.pipe()
    proc = zygote.fork((*LONELY, "--hello-timeout", "0.2"), dict(os.environ), w)
    os.close(w)
    assert proc.wait(30) == EXIT_NO_SERVER
    with os.fdopen(r, "rb") as out:
        said = out.read().decode()
    assert "no answer from a stage runtime at tcp://127.0.0.1:9" in said


def test_a_killed_zygote_takes_its_workers_down_and_says_so() -> None:
    z = Zygote(sys.executable, (), zygote_env(os.environ))
    assert z.wait_ready(60)
    r, w = os.pipe()
    proc = z.fork((*LONELY, "--hello-timeout", "60"), dict(os.environ), w)
    os.close(w)
    os.close(r)
    os.kill(z.proc.pid, signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL
    wait_until_blocking(lambda: not pid_alive(proc.pid), "the worker gone", 10.0)
    assert z.dead


def test_a_zygote_dies_with_the_process_that_started_it(tmp_path) -> None:
    script = textwrap.dedent(
        """
        import os, sys
        from omnix.stages.zygote import Zygote, zygote_env
        z = Zygote(sys.executable, (), zygote_env(os.environ))
        assert z.wait_ready(60)
        print(z.proc.pid, flush=True)
        os._exit(0)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    pid = int(out.stdout.split()[0])
    wait_until_blocking(lambda: not pid_alive(pid), "the zygote gone", 10.0)


def test_runtimes_alike_share_a_zygote_and_one_of_another_kind_closes_the_idle_one() -> None:
    env = zygote_env(os.environ)
    first = acquire_zygote(sys.executable, (), {**env, "PYTEST_CURRENT_TEST": "a"})
    # Another test's runtime: pytest's variable is no reason for a zygote of its own.
    same = acquire_zygote(sys.executable, (), {**env, "PYTEST_CURRENT_TEST": "b"})
    assert same is first and first.users == 2
    release_zygote(same)
    release_zygote(first)
    assert first.wait_ready(60) and not first.dead  # idle, kept for the next runtime like it
    busy = acquire_zygote(sys.executable, (), {**env, "OMNIX_TEST_KIND": "busy"})
    wait_until_blocking(lambda: first.dead, "the idle zygote closed", 10.0)
    wait_until_blocking(lambda: first.proc.poll() is not None, "its process gone", 10.0)
    other = acquire_zygote(sys.executable, (), {**env, "OMNIX_TEST_KIND": "other"})
    assert other is not busy and not busy.dead  # in use: kept
    for z in (busy, other):
        release_zygote(z)
        assert z.wait_ready(60)


@pytest.mark.asyncio(loop_scope="session")
async def test_a_runtime_forks_its_workers_warm_and_starts_them_cold_once_the_zygote_is_killed(
    harness_factory, tiny_models
) -> None:
    pipeline = PipelineConfig(
        name="test",
        stages=(StageConfig(name="code2wav", engine=CodecArgs(model=tiny_models.code2wav)),),
    )
    h = harness_factory(pipeline, lost_after_s=10.0, start_timeout_s=120.0)
    await h.rt.start()
    (warm,) = h.joined_pids()
    zygote = h.rt._spawner.zygote
    assert zygote is not None and int(_stat(warm)[1]) == zygote.pid
    os.kill(zygote.proc.pid, signal.SIGKILL)
    await h.wait_for(lambda: len(h.joined_pids()) == 2, 120, "the worker back")
    cold = h.joined_pids()[-1]
    assert int(_stat(cold)[1]) == os.getpid()  # a fresh Python, started by this process
    assert not pid_alive(warm)
