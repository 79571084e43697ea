"""How the stage runtime starts its replicas' workers: one interface, two placements.

Owns the ``Launcher`` protocol (what the runtime asks of whatever starts
worker processes: ``spawn`` a replica, restart one after a loss by its
policy, ``stop`` one for good, ``stop_all`` at shutdown) over the
``slots.ReplicaProcess`` handles it gives each slot.  Two implement it:

* ``spawner.Spawner`` (``placement = "spawn"``, the default): local child
  processes, restarted by omnix with backoff;
* ``ray_launcher.RayLauncher`` (``placement = "ray"``): one Ray actor per
  replica that runs the same worker process on a node of a Ray cluster;
  Ray restarts a replica that died (its actor), omnix only hands the new
  incarnation its token.

Either way the worker is the ordinary ``python -m omnix.stages.worker_cli``
and joins through the handshake with its incarnation token and the worker
token; losses are judged by the runtime (``runtime.py``'s ``lose``,
``liveness.py``).  Does not own what a loss means, nor the handshake.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Protocol

from omnix.stages.slots import ReplicaProcess, Slot

__all__ = ["Launcher", "ReplicaProcess", "server_namespace"]


def server_namespace(pipeline: str, pid: int) -> str:
    """The Ray namespace of the server of ``pipeline`` in process ``pid``
    on this host: its replicas' actors are named there."""
    return f"omnix-{pipeline}-{socket.gethostname()}-{pid}"


class Launcher(Protocol):
    """What starts, restarts and stops the workers of the spawned stages."""

    #: where workers connect (set by the runtime once its socket is bound)
    endpoint: str
    loop: asyncio.AbstractEventLoop | None
    #: the local processes it started (the runtime's finalizer kills them); none under Ray
    procs: list[Any]

    async def prepare(self) -> None:
        """Before the first ``spawn``: reserve what the replicas need
        (Ray: the stages' placement groups); ``RuntimeConfigError`` when
        that cannot be done."""

    def spawn(self, slot: Slot) -> None:
        """Start ``slot``'s worker with a fresh incarnation token: sets
        ``slot.proc``, ``expected_token``, ``state = "starting"``,
        ``started_at``.  A no-op once the runtime is closed."""

    def schedule_restart(self, slot: Slot) -> None:
        """``slot``'s worker was lost and the runtime wants it back: by
        this launcher's policy (local: a new process after a backoff; Ray:
        the actor Ray restarts gets a new token)."""

    def stop(self, slot: Slot) -> None:
        """``slot`` leaves for good (scaled down): end its worker now if it
        still runs and never restart it; call after the runtime forgot it
        (``state = "down"``)."""

    def spawn_env(self, stage: str, replica: int) -> dict[str, str]:
        """The environment a spawned worker gets (before its tokens)."""

    async def stop_all(self, loading: set[int], grace_s: float) -> None:
        """Shutdown: give running workers ``grace_s`` to exit (none for the
        pids in ``loading``), then end them; nothing it started remains."""
