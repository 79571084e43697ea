"""The stage runtime's worker processes: spawn, restart, stop.

Owns: ``Spawner``.  It starts one ``omnix.stages.worker_cli`` process per
replica of the stages the runtime spawns (forked by a zygote that imported
their engines' modules once, ``zygote.py``, when it has any to import;
else, or when the zygote is gone, a fresh Python), with the environment a worker
runs in (``spawn_env``: one OpenMP thread, this omnix on ``PYTHONPATH``, the
CPUs the placement gives it, the GPUs its stage's ``devices`` give it, a fresh incarnation token, the parent's pid,
the shared worker token), reports a process's exit (``on_exit``), restarts
a replica with backoff by how many starts failed in a row, and at shutdown
gives running workers a grace to exit, then SIGTERM, then SIGKILL.  Every
process it ever started is in ``procs``, for the runtime's finalizer.

Implements ``launcher.Launcher`` (the default placement, ``spawn``);
``ray_launcher.RayLauncher`` is the other.  ``worker_environ`` is the
environment every worker starts from, whoever starts it.

Does not own what an exit means (``runtime.py``'s ``lose``), the
handshake, nor a process's own watching and output (``procs.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Mapping

import omnix
from omnix.stages.placement import ENGINE_CPUS_ENV, CpuPlan
from omnix.stages.procs import Start, WorkerProcess, popen
from omnix.stages.slots import Slot
from omnix.stages.worker_cli import CPUS_ENV
from omnix.stages.worker_process import AUTH_ENV, PARENT_ENV, TOKEN_ENV
from omnix.stages.zygote import (
    ForkedProcess,
    Zygote,
    ZygoteGone,
    acquire_zygote,
    release_zygote,
    zygote_env,
)
from omnix.transport.sockets import remove_endpoint_dir

log = logging.getLogger("omnix.runtime")

_RESTART_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 5.0, 10.0)  # by consecutive failed starts


class Spawner:
    def __init__(
        self,
        *,
        python: str,
        worker_token: str | None,
        worker_env: dict[str, str],
        worker_cpus: dict[str, str],
        cpu_plan: CpuPlan | None,
        worker_gpus: dict[str, str],
        forward_worker_output: bool,
        on_exit: Callable[[WorkerProcess], None],
        closed: Callable[[], bool],
        preload: tuple[str, ...] = (),
    ) -> None:
        self.python = python
        #: what the workers' zygote imports (``engines.engine_preload``); none: no zygote
        self.preload = preload
        self.zygote: Zygote | None = None
        self.worker_token = worker_token
        self.worker_env = worker_env
        self.worker_cpus = worker_cpus
        self.cpu_plan = cpu_plan
        #: worker id -> its CUDA_VISIBLE_DEVICES (``gpus.gpu_plan``)
        self.worker_gpus = worker_gpus
        self.forward_worker_output = forward_worker_output
        self._on_exit = on_exit
        self._closed = closed
        self.endpoint = ""  # set once the runtime's socket is bound
        self.loop: asyncio.AbstractEventLoop | None = None
        self.procs: list[WorkerProcess] = []  # every process ever spawned (for the finalizer)

    def spawn(self, slot: Slot) -> None:
        slot.restart_handle = None
        if self._closed():
            return
        assert self.loop is not None
        token = secrets.token_hex(8)
        env = self.spawn_env(slot.stage, slot.replica)
        env.update(incarnation_env(token, self.worker_token))
        env[PARENT_ENV] = str(os.getpid())
        if not self.worker_token:
            env.pop(AUTH_ENV, None)
        argv = [
            self.python,
            "-m",
            "omnix.stages.worker_cli",
            "--connect",
            self.endpoint,
            "--stage",
            slot.stage,
            "--replica",
            str(slot.replica),
        ]
        proc = WorkerProcess(
            self._starter(argv, env),
            slot.worker_id,
            self.loop,
            self._on_exit,
            forward_output=self.forward_worker_output,
        )
        self.procs[:] = [p for p in self.procs if p.returncode is None]
        self.procs.append(proc)
        slot.proc = proc
        slot.expected_token = token
        slot.state = "starting"
        slot.pid = proc.pid
        slot.started_at = time.monotonic()
        log.debug("spawned %s as pid %d", slot.worker_id, proc.pid)

    def spawn_env(self, stage: str, replica: int) -> dict[str, str]:
        """The environment a spawned worker of ``stage``/``replica`` gets
        (before its per-incarnation token and parent pid)."""
        wid = f"{stage}/{replica}"
        env = worker_environ(os.environ, self.worker_env)
        cpus = self.worker_cpus.get(wid) or self.worker_cpus.get(stage)
        plan = self.cpu_plan
        if plan is not None and wid in plan.engines:
            cpus = plan.frontend
            env[ENGINE_CPUS_ENV] = plan.engines[wid]
        if cpus:
            env[CPUS_ENV] = cpus
        if wid in self.worker_gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.worker_gpus[wid]
        return env

    def schedule_restart(self, slot: Slot) -> None:
        assert self.loop is not None
        delay = _RESTART_BACKOFF_S[min(slot.failures, len(_RESTART_BACKOFF_S) - 1)]
        if delay:
            log.warning(
                "restarting %s in %.1f s (%d failed starts in a row)",
                slot.worker_id,
                delay,
                slot.failures,
            )
        slot.restart_handle = self.loop.call_later(delay, self.spawn, slot)

    def _starter(self, argv: list[str], env: dict[str, str]) -> Start:
        """Forked by the zygote when it is there, else a fresh Python."""
        cold = popen(argv, env)
        zygote = self.zygote
        if zygote is None:
            return cold

        def start(out_fd: int) -> subprocess.Popen[bytes] | ForkedProcess:
            if not zygote.dead:
                try:
                    # Its parent is the zygote, which dies with this process.
                    forked_env = {**env, PARENT_ENV: str(zygote.pid)}
                    cpus = sorted(os.sched_getaffinity(0))
                    return zygote.fork(argv[3:], forked_env, out_fd, cpus)
                except ZygoteGone as exc:
                    log.warning("%s; starting workers in a fresh Python", exc)
            return cold(out_fd)

        return start

    async def prepare(self) -> None:
        """Nothing to reserve: local processes.  With modules to preload,
        the workers' zygote (shared by this process's runtimes) imports
        them before the first worker starts; one that cannot means cold
        starts, said once."""
        if not self.preload:
            return
        env = zygote_env(worker_environ(os.environ, self.worker_env))
        zygote = acquire_zygote(self.python, self.preload, env)
        if await asyncio.to_thread(zygote.wait_ready, 300.0):
            self.zygote = zygote
        else:
            release_zygote(zygote)
            log.warning("the workers' zygote did not start; starting workers in a fresh Python")

    def stop(self, slot: Slot) -> None:
        """``slot`` leaves for good: no restart; its process gets SIGTERM
        now and SIGKILL 2 s later if it still runs."""
        if slot.restart_handle is not None:
            slot.restart_handle.cancel()
            slot.restart_handle = None
        proc = slot.proc
        if not isinstance(proc, WorkerProcess) or proc.returncode is not None:
            return
        proc.terminate()
        if self.loop is not None:
            self.loop.call_later(2.0, _kill_if_running, proc)

    async def stop_all(self, loading: set[int], grace_s: float) -> None:
        """Wait up to ``grace_s`` for the running workers to exit (those
        whose pid is in ``loading`` get none: a worker still loading its
        engine cannot stop before its load ends), then SIGTERM, then
        SIGKILL; afterwards no child process remains."""
        procs = [p for p in self.procs if p.returncode is None]
        await _exited([p for p in procs if p.pid not in loading], grace_s)
        procs = [p for p in procs if p.poll() is None]
        for p in procs:
            if p.pid in loading:
                log.info(
                    "worker %s (pid %d) is still loading its engine; terminating", p.label, p.pid
                )
            else:
                log.warning(
                    "worker %s (pid %d) did not exit within %.1f s of shutdown; terminating",
                    p.label,
                    p.pid,
                    grace_s,
                )
            p.terminate()
        stuck = await _exited(procs, 2.0)
        for p in stuck:
            p.kill()
        await _exited(stuck, 5.0)
        for p in self.procs:
            p.poll()
            p.kill()  # any grandchildren left in its group
            p.close()
        if self.zygote is not None:
            release_zygote(self.zygote)
            self.zygote = None


def _kill_if_running(proc: WorkerProcess) -> None:
    if proc.returncode is None:
        proc.kill()


def worker_environ(environ: Mapping[str, str], overrides: Mapping[str, str]) -> dict[str, str]:
    """The environment a worker starts from on any host: ``environ`` (the
    server's, or a Ray node's) with one OpenMP thread, unbuffered output,
    this omnix first on ``PYTHONPATH`` and no inherited engine placement,
    then ``overrides`` (the runtime's ``worker_env``)."""
    env = dict(environ)
    # torch's thread pool and the streaming loop fight for a small
    # machine's cores (docs/runtime.md); worker_env may override it.
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    root = os.path.dirname(os.path.dirname(os.path.abspath(omnix.__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop(ENGINE_CPUS_ENV, None)  # only the plan (or worker_env) places an engine
    env.update(overrides)
    return env


def incarnation_env(token: str, worker_token: str | None) -> dict[str, str]:
    """What tells one started worker who it is: its incarnation token, and
    the shared worker token when the server has one."""
    env = {TOKEN_ENV: token}
    if worker_token:
        env[AUTH_ENV] = worker_token
    return env


async def _exited(procs: list[WorkerProcess], seconds: float) -> list[WorkerProcess]:
    """Wait up to ``seconds`` for all of ``procs`` to exit; those still running."""
    deadline = time.monotonic() + seconds
    while procs and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        procs = [p for p in procs if p.poll() is None]
    return procs


def kill_all(procs: list[WorkerProcess], tmpdir: str | None) -> None:
    """Finalizer: a runtime dropped without shutdown() still leaves no child
    (and no socket directory)."""
    for p in procs:
        with contextlib.suppress(Exception):
            p.kill()
            p.wait_blocking(2.0)
    remove_endpoint_dir(tmpdir)
