"""The stage runtime: worker processes, replicas, liveness, credits, over ZMQ.

Owns: ``StageRuntime``, the orchestrator's only handle on stage workers.  It
binds one ROUTER endpoint, spawns ``replicas`` worker processes per stage
(or waits for hand-started ones), and turns what workers say into events
(``StageStarted``, ``Chunk``, ``Progress``, ``StageFinished``,
``StageFailed``, ``WorkerJoined``, ``WorkerLost``) handed to ``emit``.  This
module holds the whole's lifecycle (build its parts from its options,
bind, start, wait until ready, shutdown) and its public interface; the
parts live beside it, each owning one concern:

* ``options.py``: ``RuntimeOptions``, every knob beside the pipeline, typed;
* ``endpoint.py``: the workers endpoint it binds (private ipc, tcp, Ray's);
* ``losses.py``: what losing a replica means (``WorkerLost``, a restart, or
  a start-up error);
* ``slots.py``: the record of each replica (state, credits, requests);
* ``spawner.py``: worker processes, their environment, restarts with backoff;
  or, with ``placement="ray"``, ``ray_launcher.py``: each replica a Ray
  actor running the same worker, restarted by Ray (``launcher.py`` is
  the interface both give the runtime);
* ``handshake.py``: HELLO -> WELCOME -> READY, tokens, refusals;
* ``liveness.py``: heartbeats and the periodic check that judges silence;
* ``credits.py``: ``send``/``abort``/``release``, never more than
  ``capacity`` requests in flight on a replica;
* ``wire.py``: the send path (work batched per loop turn, aborts after it);
* ``records.py``: worker records into events;
* ``profile_calls.py``: starting and stopping the workers' profilers;
* ``scaling.py``: carrying out ``Scaled`` events (start a replica, drain
  one and record that it left).

Does not own decisions: which replica gets a request, what happens to
requests on a lost worker (fail or retry), queueing beyond credits, time
outs of stages: those are the orchestrator's, made from the events this
emits.

Threading and re-entrancy: everything runs on the event loop thread that
called ``start()``.  ``emit`` is only ever called from the loop's own
callbacks (socket readable, process exited, liveness tick), never from
inside ``send``/``abort``/``release``, so the orchestrator may call those
from its event listeners without being re-entered.

Liveness: a spawned worker is watched by pidfd (a ``kill -9`` is seen in
milliseconds); every worker sends heartbeats, and silence for
``lost_after_s`` makes a ready worker lost (``liveness.py`` says how a
loading or a starved one is judged).

Start-up: a spawned replica that dies before it is ready is restarted with
backoff, during ``start()`` too, up to ``start_attempts`` failed starts in
a row; then ``start()`` fails naming how its process ended and the last
lines it wrote (its own INFO log lines left out; ``losses.py`` records
why).

Which stages the runtime spawns is ``spawn`` (all, none or some); the
others wait for ``omnix worker --connect``.  With ``worker_token`` every
HELLO must carry it; a tcp endpoint that is not loopback-only requires one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from omnix.events.blobs import BlobStore
from omnix.events.types import Event, Scaled, WorkerLost
from omnix.pipelines.config import PipelineConfig, engine_kind
from omnix.pipelines.engines import engine_preload
from omnix.stages.credits import Credits
from omnix.stages.endpoint import ray_endpoint, workers_endpoint
from omnix.stages.errors import (
    CapacityExceeded,
    ReplicaUnavailable,
    RuntimeConfigError,
    StageRuntimeError,
    WorkerStartError,
)
from omnix.stages.gpus import gpu_plan
from omnix.stages.handshake import Handshake
from omnix.stages.launcher import Launcher, ReplicaProcess, server_namespace
from omnix.stages.liveness import Liveness
from omnix.stages.losses import Losses
from omnix.stages.options import DEFAULT_SHUTDOWN_GRACE_S, DEFAULT_START_ATTEMPTS, RuntimeOptions
from omnix.stages.placement import pin_process, runtime_plan
from omnix.stages.profile_calls import ProfileCalls, ProfileReport
from omnix.stages.records import deliver
from omnix.stages.scaling import ReplicaScaling, check_scaling
from omnix.stages.slots import Slot, SlotTable, not_ready_message
from omnix.stages.spawner import Spawner, kill_all
from omnix.stages.wire import Wire
from omnix.transport import messages as m
from omnix.transport.inbox import Inbox, Route
from omnix.transport.sockets import make_router, remove_endpoint_dir
from omnix.transport.work import WorkItem

if TYPE_CHECKING:
    from omnix.stages.ray_launcher import RayLauncher

__all__ = [
    "DEFAULT_SHUTDOWN_GRACE_S",
    "DEFAULT_START_ATTEMPTS",
    "CapacityExceeded",
    "ProfileReport",
    "ReplicaUnavailable",
    "RuntimeConfigError",
    "RuntimeOptions",
    "StageRuntime",
    "StageRuntimeError",
    "WorkerStartError",
]

log = logging.getLogger("omnix.runtime")


class StageRuntime:
    """Runs a pipeline's stage workers.  See the module docstring and docs/runtime.md."""

    def __init__(
        self,
        pipeline: PipelineConfig,
        emit: Callable[[Event], None],
        blobs: BlobStore,
        options: RuntimeOptions | None = None,
    ) -> None:
        """``options``: how it runs its workers (``RuntimeOptions``; None: the defaults)."""
        if options is None:
            options = RuntimeOptions()
        elif not isinstance(options, RuntimeOptions):
            raise TypeError(
                f"options must be a RuntimeOptions (omnix.stages.options), not "
                f"{type(options).__name__}"
            )
        self.options = options
        self.pipeline = pipeline
        self._emit_fn = emit
        self.blobs = blobs
        self.heartbeat_interval_s = options.heartbeat_interval_s
        self.lost_after_s = options.lost_after_s
        self.start_timeout_s = options.start_timeout_s
        self.restart = options.restart
        # The stages whose workers this runtime starts (and restarts); the
        # others wait for `omnix worker --connect`.
        self.spawned_stages = _spawned_stages(pipeline, options.spawn)
        check_scaling(pipeline, self.spawned_stages)
        self.worker_token = options.worker_token or None
        # A replica spawned but not READY within this is killed (and restarted).
        self.load_timeout_s = (
            options.start_timeout_s if options.load_timeout_s is None else options.load_timeout_s
        )
        self.start_attempts = options.start_attempts
        self.worker_env = dict(options.worker_env)
        self.python = options.python
        self.forward_worker_output = options.forward_worker_output
        # stage name or worker id ("stage/replica") -> CPU list ("1", "2-3"); opt-in pinning
        self.worker_cpus = dict(options.worker_cpus)
        spawned_here = options.placement == "spawn"  # else Ray places the workers
        # vLLM engine cores on CPUs of their own, the rest elsewhere
        # (placement.py); worker_cpus and VLLM_CPU_OMP_THREADS_BIND win.
        self.cpu_plan = (
            runtime_plan(pipeline, options.vllm_cpu_placement, self.worker_env, self.worker_cpus)
            if spawned_here
            else None  # on other hosts' CPUs
        )
        self.pin_server = options.pin_server
        # The GPUs each spawned replica sees (its stage's devices); a device
        # this machine lacks is refused here, before any worker starts.
        self.worker_gpus = gpu_plan(pipeline, self.spawned_stages if spawned_here else ())
        self.shutdown_grace_s = options.shutdown_grace_s
        # Where workers write profiler traces (DIR/<stage>/<replica>); None:
        # profiling is off and PROFILE is never sent.
        self.profile_dir = (
            Path(options.profile_dir).resolve() if options.profile_dir is not None else None
        )
        self._ray: RayLauncher | None = None
        endpoint = options.endpoint
        if not spawned_here:
            endpoint = self._join_ray(options.ray_address, endpoint)
        self._endpoint, self._tmpdir = workers_endpoint(endpoint, self.worker_token)
        self._build_parts()
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sock: zmq.Socket[bytes] | None = None
        self._inbox: Inbox | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._started = False
        self._closed = False
        self._finalizer = weakref.finalize(self, kill_all, self._spawner.procs, self._tmpdir)

    def _build_parts(self) -> None:
        self._slots = SlotTable(self.pipeline)
        self._wire = Wire(self._lose)
        self._credits = Credits(self._slots, self._wire, self._emit)
        self._handshake = Handshake(
            self.pipeline,
            self._slots,
            self._wire,
            spawned_stages=self.spawned_stages,
            worker_token=self.worker_token,
            heartbeat_interval_s=self.heartbeat_interval_s,
            lost_after_s=self.lost_after_s,
            profile_dir=self.profile_dir,
            emit=self._emit,
            changed=self._changed_state,
        )
        self._liveness = Liveness(
            self._slots,
            self._wire,
            heartbeat_interval_s=self.heartbeat_interval_s,
            lost_after_s=self.lost_after_s,
            load_timeout_s=self.load_timeout_s,
            lose=self._lose,
        )
        self._spawner: Launcher = self._ray or Spawner(
            python=self.python,
            worker_token=self.worker_token,
            worker_env=self.worker_env,
            worker_cpus=self.worker_cpus,
            cpu_plan=self.cpu_plan,
            worker_gpus=self.worker_gpus,
            forward_worker_output=self.forward_worker_output,
            on_exit=self._on_proc_exit,
            closed=lambda: self._closed,
            preload=self._preload(),
        )
        self._profiles = ProfileCalls(self.pipeline, self._slots, self._wire)
        self._scaling = ReplicaScaling(
            self._slots,
            self._wire,
            self._spawner,
            emit=self._emit,
            changed=self._changed_state,
            running=lambda: self._started and not self._closed,
            grace_s=self.shutdown_grace_s,
        )
        self._losses = Losses(
            self._slots,
            self._spawner,
            self._scaling,
            restart=self.restart,
            start_attempts=self.start_attempts,
            emit=self._emit,
            changed=self._changed_state,
            closed=lambda: self._closed,
        )

    def _preload(self) -> tuple[str, ...]:
        """What the spawned workers' zygote imports (none: no zygote)."""
        if not self.options.fork_workers:
            return ()
        kinds = (
            engine_kind(st.engine) for st in self.pipeline.stages if st.name in self.spawned_stages
        )
        return engine_preload(kinds)

    def _join_ray(self, address: str, endpoint: str | None) -> str:
        """``placement="ray"``: join the cluster and check it can hold the
        stages (``RuntimeConfigError`` otherwise), before anything binds;
        the workers endpoint the cluster's nodes reach."""
        from omnix.stages.ray_launcher import RayLauncher

        self._ray = RayLauncher(
            pipeline=self.pipeline,
            spawned_stages=self.spawned_stages,
            address=address,
            namespace=server_namespace(self.pipeline.name, os.getpid()),
            worker_token=self.worker_token,
            worker_env=self.worker_env,
            on_exit=self._on_proc_exit,
            closed=lambda: self._closed,
        )
        try:
            endpoint = ray_endpoint(endpoint, self._ray.node_ip)
        except BaseException:
            self._ray.disconnect()
            raise
        # Ray hands it to the actors: the workers endpoint stays guarded by
        # omnix's own token whatever the Ray cluster allows.
        self.worker_token = self._ray.worker_token = self.worker_token or secrets.token_hex(16)
        return endpoint

    # -- public API ---------------------------------------------------------
    @property
    def endpoint(self) -> str:
        """What ``omnix worker --connect`` uses (tcp port 0 is resolved after start)."""
        return self._endpoint

    def ready_replicas(self, stage: str) -> int:
        return sum(1 for s in self._slots.stage(stage) if s.state == "ready")

    def capacity(self, stage: str, replica: int) -> int:
        """The replica's credit count (0 unless ready)."""
        s = self._slots.get(stage, replica)
        return s.capacity if s.state == "ready" else 0

    def engines(self) -> list[tuple[str, int, m.Ready]]:
        """(stage, replica, what its READY said) of every ready replica."""
        return [
            (s.stage, s.replica, s.ready)
            for s in self._slots.all()
            if s.ready is not None and s.state == "ready"
        ]

    def in_flight(self, stage: str, replica: int) -> int:
        """Requests started on the replica and not yet finished/failed/lost."""
        return len(self._slots.get(stage, replica).active)

    def spawn_env(self, stage: str, replica: int) -> dict[str, str]:
        """The environment a spawned worker of ``stage``/``replica`` gets
        (before its per-incarnation token and parent pid)."""
        return self._spawner.spawn_env(stage, replica)

    async def start(self, wait: bool | None = None) -> None:
        """Bind, spawn the workers of ``spawned_stages`` and (by default,
        when it spawns any) wait until those are ready.

        Hand-started workers (the other stages) join whenever they come
        (``WorkerJoined`` says so; ``wait_ready()`` waits for them): with
        ``spawn=False`` the runtime binds and returns.  Raises
        ``WorkerStartError`` naming the replica that did not come up and why.
        """
        if self._started:
            raise StageRuntimeError("StageRuntime.start() was already called")
        if self._closed:
            raise StageRuntimeError("StageRuntime was shut down; build a new one")
        self._started = True
        self._bind()
        try:
            await self._spawner.prepare()  # Ray: the stages' placement groups
        except BaseException:
            await self.shutdown()
            raise
        for slot in self._slots.all():
            if slot.stage in self.spawned_stages and slot.wanted:
                self._spawner.spawn(slot)
        if wait is None:
            wait = bool(self.spawned_stages)
        if wait:
            self._losses.starting = True
            try:
                await self._wait(
                    self.start_timeout_s,
                    [s for s in self._slots.all() if s.stage in self.spawned_stages and s.wanted],
                )
            except BaseException:
                await self.shutdown()
                raise
            finally:
                self._losses.starting = False

    def _bind(self) -> None:
        """Bind the workers' endpoint and start reading it and judging liveness."""
        loop = self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        if self.pin_server and self.cpu_plan is not None:
            # Before the ZMQ context, so its I/O thread is pinned too.
            pin_process(self.cpu_plan.frontend)
        self._ctx = zmq.Context()
        self._sock, self._endpoint = make_router(self._ctx, self._endpoint)
        self._inbox = Inbox(
            loop,
            self._sock,
            m.SERVER_BOUND,
            self._routes(),
            routed=True,
            log=log,
            unknown_hint="a newer worker?",
        )
        self._wire.attach(loop, self._sock, self._inbox)
        self._spawner.loop = loop
        self._scaling.loop = loop
        self._spawner.endpoint = self._endpoint
        self._liveness.start(loop)
        names = list(self._slots.by_stage)
        by_hand = [n for n in names if n not in self.spawned_stages]
        log.info(
            "workers endpoint %s; spawned here: %s%s",
            self._endpoint,
            ", ".join(n for n in names if n in self.spawned_stages) or "none",
            f"; waiting for {', '.join(by_hand)}: omnix worker --connect {self._endpoint} --stage NAME"
            f"{' --worker-token TOKEN' if self.worker_token else ''}"
            if by_hand
            else "",
        )

    async def wait_ready(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until every replica of every stage is ready (of a stage
        that scales, those it runs now)."""
        await self._wait(timeout, [s for s in self._slots.all() if s.wanted])

    async def _wait(self, timeout: float | None, slots: list[Slot]) -> None:  # noqa: ASYNC109
        assert self._changed is not None, "call start() first"
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._losses.errors:
                raise WorkerStartError("\n".join(self._losses.errors))
            missing = [s for s in slots if s.state != "ready"]
            if not missing:
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WorkerStartError(
                    not_ready_message(missing, timeout or 0, self.spawned_stages, self._endpoint)
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    def send(self, work: WorkItem) -> None:
        """Send ``work`` to its replica now (non-blocking); see ``Credits.send``."""
        self._credits.send(work)

    def abort(self, request_id: str, stage: str, replica: int) -> None:
        """Ask the replica to stop ``request_id`` (``Credits.abort``)."""
        self._credits.abort(request_id, stage, replica)

    def release(self, request_id: str) -> None:
        """Forget ``request_id`` (call after its terminal event); see ``Credits.release``."""
        self._credits.release(request_id)

    async def profile(
        self, action: m.ProfileAction, stages: Iterable[str], timeout_s: float = 120.0
    ) -> list[ProfileReport]:
        """Start or stop the profiler of every ready replica of ``stages``
        (``ProfileCalls.call``); ``RuntimeConfigError`` when profiling is off."""
        if self.profile_dir is None:
            raise RuntimeConfigError("profiling is off: start the server with --profile-dir DIR")
        return await self._profiles.call(action, stages, timeout_s)

    async def shutdown(self) -> None:
        """Stop every worker; idempotent.  Afterwards no child process remains."""
        if self._closed:
            return
        self._closed = True
        self._liveness.stop()
        if self._inbox is not None:
            # Stop reading now: an unread, still-registered ZMQ FD stays
            # readable and would spin the loop while workers exit.
            self._inbox.close()
        slots = self._slots.all()
        # A worker still loading its engine runs no request and cannot stop
        # before its load ends (a vLLM load takes 15-30 s on CPU): it gets
        # no grace.  Ctrl-C during start-up then takes seconds, not a load.
        loading = {
            s.proc.pid for s in slots if s.state in ("starting", "joining") and s.proc is not None
        }
        for slot in slots:
            self._stop_slot(slot)
        self._slots.unbind_all()
        await self._spawner.stop_all(loading, self.shutdown_grace_s)
        if self._sock is not None:
            self._sock.close(0)
        if self._ctx is not None:
            self._ctx.term()
        remove_endpoint_dir(self._tmpdir)
        self._finalizer.detach()
        if self._changed is not None:
            self._changed.set()

    def _stop_slot(self, slot: Slot) -> None:
        """Tell ``slot``'s worker to stop and forget its requests (shutdown)."""
        if slot.restart_handle is not None:
            slot.restart_handle.cancel()
        slot.outbox.clear()  # the worker is told to stop; queued work would be dropped there
        if slot.identity is not None and self._sock is not None:
            self._wire.send_raw(slot.identity, m.SHUTDOWN, m.Shutdown("server shutdown"))
        if slot.state == "ready":
            self._emit(
                WorkerLost(
                    worker_id=slot.worker_id,
                    stage=slot.stage,
                    replica=slot.replica,
                    reason="shutdown",
                )
            )
        slot.state = "down"
        slot.active.clear()

    # -- losing a replica (losses.py) ------------------------------------------------
    def _lose(self, slot: Slot, reason: str, detail: str = "", *, restart: bool = True) -> None:
        """The slot's worker is gone (or disowned): ``Losses.lose``."""
        self._losses.lose(slot, reason, detail, restart=restart)

    def _on_proc_exit(self, proc: ReplicaProcess) -> None:
        self._losses.on_proc_exit(proc)

    # -- scaling (docs/runtime.md, "Scaling"; the parts: scaling.py) ------------
    def scale(self, ev: Scaled) -> None:
        """Carry out a ``Scaled`` start or drain (``ReplicaScaling.scale``)."""
        self._scaling.scale(ev)

    # -- receiving ------------------------------------------------------------
    def _routes(self) -> list[Route[Any]]:
        """What each message a worker sends is handed to (see ``Inbox``)."""
        return [
            Route(m.OUTPUTS, list[m.Record], self._on_outputs),
            Route(m.HEARTBEAT, m.Heartbeat, self._liveness.on_heartbeat),
            Route(m.HELLO, m.Hello, self._handshake.on_hello),
            Route(m.READY, m.Ready, self._handshake.on_ready),
            Route(m.START_FAILED, m.StartFailed, self._losses.on_start_failed),
            Route(m.GOODBYE, m.Goodbye, self._losses.on_goodbye),
            Route(m.PROFILED, m.Profiled, self._profiles.on_profiled),
        ]

    def _on_outputs(self, identity: bytes, records: list[m.Record]) -> None:
        slot = self._slots.by_identity.get(identity)
        if slot is not None:
            slot.last_seen = time.monotonic()
            deliver(slot, records, self.blobs, self._emit, self._credits.returned)
            if slot.draining:
                self._scaling.leave_if_idle(slot)

    def _emit(self, ev: Event) -> None:
        try:
            self._emit_fn(ev)
        except Exception:
            # emit must not raise (contract); if it does, keep serving.
            log.exception("emit(%s) raised; event dropped", type(ev).__name__)

    def _changed_state(self) -> None:
        if self._changed is not None:
            self._changed.set()


def _spawned_stages(pipeline: PipelineConfig, spawn: bool | Iterable[str]) -> frozenset[str]:
    """The stages named by ``spawn`` (all, none or a list); an unknown name is an error."""
    names = [st.name for st in pipeline.stages]
    if spawn is True or spawn is False:
        return frozenset(names if spawn else ())
    spawned = set(spawn)
    if unknown := sorted(spawned - set(names)):
        raise RuntimeConfigError(
            f"spawn names {', '.join(map(repr, unknown))}, which pipeline {pipeline.name!r} "
            f"does not have (stages: {', '.join(names)})"
        )
    return frozenset(spawned)
