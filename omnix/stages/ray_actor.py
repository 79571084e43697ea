"""One replica on a Ray node: the actor that runs its ordinary worker process.

Owns ``ReplicaActor``, the class the Ray launcher (``ray_launcher.py``)
makes an actor of, one per replica, named ``omnix-{stage}-{replica}``.  Its
only job is to run ``python -m omnix.stages.worker_cli --connect ENDPOINT
--stage S --replica N`` with the environment the launcher hands it (the
worker token and a fresh incarnation token among it) on top of its own
node's (Ray's ``CUDA_VISIBLE_DEVICES`` included), and to report when that
process ends: ``run`` returns its exit code when it ended cleanly (told to
shut down); any other end takes the actor down with it, so that Ray, the
one owner of restarts under this placement, restarts the replica (on
another node when its node is gone).  The worker watches the actor as its
parent and exits when the actor is gone.

Imports no Ray: the launcher wraps this class with ``ray.remote``.  Does
not own the worker (``worker_cli.py``) nor what an exit means
(``runtime.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys

from omnix.stages.worker_process import PARENT_ENV


class ReplicaActor:
    def __init__(self, label: str) -> None:
        self.label = label
        self._proc: asyncio.subprocess.Process | None = None
        self._stopping = False

    async def run(self, args: list[str], env: dict[str, str]) -> int:
        """Run the worker with ``args`` (after ``-m omnix.stages.worker_cli``)
        and ``env`` over this node's environment until it exits."""
        from omnix.stages.spawner import worker_environ

        await self._end_worker()  # a worker of an earlier run still here: never two
        full = worker_environ(os.environ, env)
        full[PARENT_ENV] = str(os.getpid())  # the worker exits when this actor is gone
        proc = self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "omnix.stages.worker_cli",
            *args,
            env=full,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own group: killpg reaches an engine's processes
        )
        rc = await proc.wait()
        _killpg(proc.pid, signal.SIGKILL)  # whatever it started dies with it
        if proc is not self._proc:
            return rc  # ended by a later run (which replaced it)
        if rc != 0 and not self._stopping:
            how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
            print(
                f"[{self.label}] worker process {proc.pid} {how}; ending this actor so that Ray "
                "restarts the replica",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)  # an unexpected death: Ray restarts the actor (max_restarts)
        return rc

    def where(self) -> dict[str, str | int]:
        """Where this replica runs: its Ray node, this actor's pid, its worker's pid, its GPUs."""
        import ray

        proc = self._proc
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "actor_pid": os.getpid(),
            "worker_pid": proc.pid if proc is not None and proc.returncode is None else 0,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        }

    async def stop(self) -> None:
        """The replica leaves (shutdown, scaled down): end the worker, no restart."""
        self._stopping = True
        await self._end_worker()

    async def _end_worker(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        _killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            await proc.wait()


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
