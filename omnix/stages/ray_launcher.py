"""The ``ray`` placement: each replica a Ray actor that runs its worker.

Owns ``RayLauncher`` (``launcher.Launcher`` over a Ray cluster) and
``RayReplica`` (the handle a slot keeps of one incarnation).  Each replica
of a spawned stage is an actor ``omnix-{stage}-{replica}`` in the server's
namespace (``ray_actor.ReplicaActor``), in its stage's placement group
(``ray_cluster.reserve``) with the stage's ``placement`` resources; its
``run`` call starts the ordinary worker with the worker token and a fresh
incarnation token, and its end is reported to the runtime like a local
process's exit.

One owner for restarts: an actor whose worker died unexpectedly dies with
it and Ray restarts it (``max_restarts``, on another node when its node is
gone; its placement group's bundle moves there).  The runtime still judges
the loss (the actor's end, or heartbeats) and migrates the replica's
requests as always; its restart policy here starts no process: it hands
the actor Ray restarted (or restarts, the call waits for it) a new
incarnation token.  When Ray gives up (``max_restarts`` reached) the
replica stays down.

Replicas beyond a stage's placement group (added by scaling) are placed by
the stage's resources alone.  Does not own the cluster (``ray_cluster.py``)
nor what a loss means (``runtime.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from omnix.pipelines.config import PipelineConfig
from omnix.pipelines.placement import stage_placement
from omnix.stages import ray_cluster
from omnix.stages.launcher import ReplicaProcess
from omnix.stages.ray_actor import ReplicaActor
from omnix.stages.slots import Slot
from omnix.stages.spawner import incarnation_env, worker_environ

log = logging.getLogger("omnix.runtime")

_ReplicaActor = ray.remote(ReplicaActor)
#: the server's settings its workers follow wherever they run (the rest of
#: a worker's environment is its node's): where the models are
_FORWARDED = ("OMNIX_MODEL_DIR",)
_RESERVE_TIMEOUT_S = 60.0


def _forwarded() -> dict[str, str]:
    """What of this server's environment its workers take along (read at
    each start: ``omnix serve`` sets the model folder after the runtime is
    built)."""
    return {k: os.environ[k] for k in _FORWARDED if k in os.environ}


def actor_name(stage: str, replica: int) -> str:
    return f"omnix-{stage}-{replica}"


class RayReplica:
    """One incarnation of a replica's worker, run by its actor."""

    def __init__(self, slot: Slot, actor: Any, args: list[str], env: dict[str, str]) -> None:
        self.label = slot.worker_id
        self.slot = slot
        self.actor = actor
        self.args = args
        self.env = env
        self.pid = 0  # its HELLO says (slot.pid); the process runs on some node
        self.tail: deque[str] = deque(maxlen=1)
        self._rc: int | None = None
        self._why = ""

    @property
    def returncode(self) -> int | None:
        return self._rc

    def poll(self) -> int | None:
        return self._rc  # its end is reported by the actor call (RayLauncher._ended)

    def kill(self) -> None:
        """End this incarnation: kill the actor and let Ray restart it (a
        silent worker must not come back next to its replacement)."""
        if self._rc is None:
            ray.kill(self.actor, no_restart=False)

    def describe_exit(self) -> str:
        return self._why or f"replica {self.label} is running"

    def last_output(self, n: int = 12) -> str:
        return "    (its output is in the Ray actor's log, forwarded to the server's stderr)"


class RayLauncher:
    """Replicas as Ray actors; see the module docstring."""

    def __init__(
        self,
        *,
        pipeline: PipelineConfig,
        spawned_stages: frozenset[str],
        address: str,
        namespace: str,
        worker_token: str | None,
        worker_env: dict[str, str],
        on_exit: Callable[[ReplicaProcess], None],
        closed: Callable[[], bool],
    ) -> None:
        self.pipeline = pipeline
        self.stages = [st for st in pipeline.stages if st.name in spawned_stages]
        self.namespace = namespace
        self.worker_token = worker_token
        self.worker_env = worker_env
        self._on_exit = on_exit
        self._closed = closed
        self.loop: asyncio.AbstractEventLoop | None = None
        self.endpoint = ""
        self.procs: list[Any] = []  # no local processes (the runtime's finalizer has none)
        self._owns_connection = ray_cluster.connect(address, namespace)
        try:
            ray_cluster.check_fit(self.stages, ray_cluster.alive_nodes())
        except BaseException:
            self.disconnect()
            raise
        self.node_ip = ray_cluster.node_ip()
        self._groups: dict[str, PlacementGroup] = {}
        self._actors: dict[str, Any] = {}
        self._restarts: dict[str, int] = {}  # worker id -> deaths Ray restarted it from
        self._handles: list[RayReplica] = []
        self._an_end = asyncio.Event()  # set whenever an incarnation's end is reported

    def connect_endpoint(self, bound: str) -> str:
        """Where the actors' workers connect to a socket bound at ``bound``:
        a wildcard host becomes this node's address in the cluster."""
        host, _, port = bound[len("tcp://") :].rpartition(":")
        if host.strip("[]") in ("0.0.0.0", "*", "::", ""):
            return f"tcp://{self.node_ip}:{port}"
        return bound

    async def prepare(self) -> None:
        for st in self.stages:
            self._groups[st.name] = await ray_cluster.reserve(st, _RESERVE_TIMEOUT_S)

    def spawn(self, slot: Slot) -> None:
        slot.restart_handle = None
        if self._closed():
            return
        slot.started_at = time.monotonic()
        actor = self._actors.get(slot.worker_id) or self._create(slot)
        if actor is None:
            # The name is still held by the actor ``stop`` ended (Ray frees
            # it once that one is dead): try again shortly.
            assert self.loop is not None
            slot.state = "starting"
            slot.restart_handle = self.loop.call_later(0.25, self.spawn, slot)
            return
        token = secrets.token_hex(8)
        env = {**_forwarded(), **self.worker_env, **incarnation_env(token, self.worker_token)}
        args = ["--connect", self.connect_endpoint(self.endpoint), "--stage", slot.stage]
        handle = RayReplica(slot, actor, [*args, "--replica", str(slot.replica)], env)
        self._handles = [h for h in self._handles if h.returncode is None] + [handle]
        self._submit(handle)
        slot.proc = handle
        slot.expected_token = token
        slot.state = "starting"
        slot.pid = 0
        log.debug(
            "asked Ray actor %s to run %s", actor_name(slot.stage, slot.replica), slot.worker_id
        )

    def _create(self, slot: Slot) -> Any | None:
        st = slot.config
        p = stage_placement(st)
        group = self._groups.get(slot.stage)
        options: dict[str, Any] = {
            "name": actor_name(slot.stage, slot.replica),
            "namespace": self.namespace,
            "num_cpus": p.num_cpus,
            "num_gpus": p.num_gpus,
            "resources": dict(p.resources),
            "max_restarts": p.max_restarts,
            "max_task_retries": 0,  # a worker's run is never replayed: the runtime asks anew
            "max_concurrency": 4,  # where()/stop() while run() waits for the worker
        }
        if group is not None and slot.replica < group.bundle_count:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=slot.replica
            )
        try:
            actor = _ReplicaActor.options(**options).remote(slot.worker_id)
        except ValueError as exc:
            if "already taken" not in str(exc):
                raise
            return None
        self._actors[slot.worker_id] = actor
        return actor

    def _submit(self, handle: RayReplica) -> None:
        """Ask the actor to run the worker; its end comes back to ``_ended``."""
        loop = self.loop
        assert loop is not None
        future: concurrent.futures.Future[int] = handle.actor.run.remote(
            handle.args, handle.env
        ).future()
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(self._ended, handle, f))

    def _ended(self, handle: RayReplica, future: concurrent.futures.Future[int]) -> None:
        if (
            isinstance(future.exception(), ActorUnavailableError)
            and handle.slot.proc is handle
            and handle.slot.state == "starting"
            and not self._closed()
        ):
            # Asked while Ray restarts the actor (its worker had died, or
            # its node): ask again until it is back.  Its worker never said
            # hello, so nothing was lost; the load timeout bounds the wait.
            assert self.loop is not None
            self.loop.call_later(0.25, self._submit, handle)
            return
        try:
            rc = future.result()
            handle._why = f"worker of {handle.label} exited with code {rc}"
        except RayActorError as exc:
            rc = -9
            self._restarts[handle.label] = self._restarts.get(handle.label, 0) + 1
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            handle._why = f"the Ray actor of {handle.label} died ({first[:200]})"
        except Exception as exc:  # the cluster is gone, or the call could not be made
            rc = -1
            handle._why = f"the Ray actor of {handle.label} failed: {exc}"
        handle._rc = rc
        self._an_end.set()
        self._on_exit(handle)

    def schedule_restart(self, slot: Slot) -> None:
        """Ray restarts the actor; hand its new incarnation a token (the call
        waits while Ray restarts it), unless Ray gave up on it."""
        limit = stage_placement(slot.config).max_restarts
        if limit >= 0 and self._restarts.get(slot.worker_id, 0) > limit:
            log.error(
                "%s: Ray restarted its actor %d times (max_restarts); it stays down",
                slot.worker_id,
                limit,
            )
            return
        self.spawn(slot)

    def stop(self, slot: Slot) -> None:
        """The replica leaves for good: its actor ends without a restart
        (its worker with it); a later ``spawn`` of the slot makes a new one."""
        if slot.restart_handle is not None:
            slot.restart_handle.cancel()
            slot.restart_handle = None
        actor = self._actors.pop(slot.worker_id, None)
        if actor is not None:
            ray.kill(actor, no_restart=True)

    def spawn_env(self, stage: str, replica: int) -> dict[str, str]:
        """The environment over the actor's own node's (shown from this host)."""
        return worker_environ(os.environ, {**_forwarded(), **self.worker_env})

    async def stop_all(self, loading: set[int], grace_s: float) -> None:
        """The runtime told every worker to shut down: wait up to ``grace_s``
        for their actors to report it, then end the actors (no restart),
        release the placement groups and leave the cluster."""
        deadline = time.monotonic() + grace_s
        while any(h.returncode is None for h in self._handles):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._an_end.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._an_end.wait(), left)
        stops = [a.stop.remote() for a in self._actors.values()]
        if stops:
            await asyncio.wait([asyncio.wrap_future(r.future()) for r in stops], timeout=5.0)
        for actor in self._actors.values():
            ray.kill(actor, no_restart=True)
        self._actors.clear()
        ray_cluster.release(self._groups.values())
        self._groups.clear()
        self.disconnect()

    def disconnect(self) -> None:
        """Leave the cluster, when this launcher joined it."""
        if self._owns_connection and ray.is_initialized():
            ray.shutdown()
        self._owns_connection = False

    async def where(self, stage: str, replica: int) -> dict[str, str | int]:
        """Where the replica's actor runs now (``ReplicaActor.where``; waits
        while Ray restarts it)."""
        ref = self._actors[f"{stage}/{replica}"].where.remote()
        return dict(await asyncio.wrap_future(ref.future()))
