"""The stage runtime: worker processes, replicas, liveness, credits, over ZMQ.

Owns: ``StageRuntime``, the orchestrator's only handle on stage workers.  It
binds one ROUTER endpoint, spawns ``replicas`` worker processes per stage
(or waits for hand-started ones), runs the HELLO -> WELCOME -> READY
handshake, sends ``WorkItem``s and aborts, turns worker outputs into
events (``StageStarted``, ``Chunk``, ``Progress``, ``StageFinished``,
``StageFailed``, ``WorkerJoined``, ``WorkerLost``) handed to ``emit``, keeps
per-replica credits (never more than ``capacity`` requests in flight),
detects lost workers and restarts them.

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
milliseconds); every worker, spawned or not, sends heartbeats from a thread
every ``heartbeat_interval_s``; silence for ``lost_after_s`` (minus one
check interval, so the bound holds) makes a *ready* worker lost.  A spawned
worker still loading its engine is judged by its process and by
``load_timeout_s``, not by heartbeats: a load can starve its heartbeat
thread, and slow to load is not dead.  Before judging silence the runtime
reads whatever is queued on its socket, and a check that itself ran late
(this process was starved) judges nobody, so a busy server does not
mistake its own lateness for dead workers.

Start-up: a spawned replica that dies before it is ready is restarted with
backoff, during ``start()`` too, up to ``start_attempts`` failed starts in
a row; then ``start()`` fails naming how its process ended and the last
lines it wrote (its own INFO log lines left out).

Which stages the runtime spawns is ``spawn`` (all, none or some); the
others wait for ``omnix worker --connect``.  With ``worker_token`` every
HELLO must carry it; a tcp endpoint that is not loopback-only requires one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import os
import secrets
import sys
import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import msgspec
import zmq

import omnix
from omnix.events.blobs import BlobStore
from omnix.events.types import (
    Chunk,
    Event,
    Progress,
    StageFailed,
    StageFinished,
    StageStarted,
    WorkerJoined,
    WorkerLost,
)
from omnix.pipelines.config import PipelineConfig, StageConfig
from omnix.stages.placement import (
    BIND_ENV,
    ENGINE_CPUS_ENV,
    CpuPlan,
    available_cpus,
    cpu_plan,
    pin_process,
)
from omnix.stages.procs import WorkerProcess
from omnix.stages.worker import AUTH_ENV, PARENT_ENV, TOKEN_ENV
from omnix.stages.worker_cli import CPUS_ENV
from omnix.transport import messages as m
from omnix.transport.codec import FrameEncoder
from omnix.transport.inbox import Inbox, Route
from omnix.transport.sockets import (
    default_ipc_endpoint,
    make_router,
    remove_endpoint_dir,
    send_frames,
)
from omnix.transport.work import WorkItem

log = logging.getLogger("omnix.runtime")

SlotState = Literal["down", "starting", "joining", "ready"]
# down: no worker; starting: spawned, no HELLO yet; joining: welcomed,
# loading its engine (heartbeats flow); ready: READY received, takes work.

# A worker told to shut down gets this long to exit by itself before SIGTERM
# (then 2 s more before SIGKILL).  vLLM's own teardown takes 2-4 s on a small
# CPU machine: its engine core frees the KV cache and the model, then the
# process exits.  Cutting it short warns for nothing and kills an engine
# core mid-teardown (on ROCm that can leave memory resident).
DEFAULT_SHUTDOWN_GRACE_S = 10.0
_RESTART_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 5.0, 10.0)  # by consecutive failed starts
DEFAULT_START_ATTEMPTS = 3  # failed starts in a row of one replica before start() gives up


async def _exited(procs: list[WorkerProcess], seconds: float) -> list[WorkerProcess]:
    """Wait up to ``seconds`` for all of ``procs`` to exit; those still running."""
    deadline = time.monotonic() + seconds
    while procs and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        procs = [p for p in procs if p.poll() is None]
    return procs


class StageRuntimeError(RuntimeError):
    """Base of the runtime's own errors."""


class WorkerStartError(StageRuntimeError):
    """``start()`` could not bring every replica up."""


class RuntimeConfigError(StageRuntimeError, ValueError):
    """The runtime's options are inconsistent (bad ``spawn`` list, a public
    tcp endpoint without a worker token, ...): raised at construction."""


class ReplicaUnavailable(StageRuntimeError):
    """Work was sent to a replica that is not ready (never joined, or lost)."""


class CapacityExceeded(StageRuntimeError):
    """A new request (seq 0) was sent to a replica with no free credit."""


class _Run:
    """One request on one replica, from its seq 0 until Done/Error or loss."""

    __slots__ = ("aborted", "next_seq", "released")

    def __init__(self) -> None:
        self.next_seq = 1
        self.aborted = False
        self.released = False


class _Slot:
    __slots__ = (
        "active",
        "capacity",
        "config",
        "deferred",
        "engine",
        "expected_token",
        "failures",
        "identity",
        "joined_at",
        "last_failure",
        "last_seen",
        "outbox",
        "pid",
        "proc",
        "replica",
        "restart_handle",
        "stage",
        "started_at",
        "state",
        "token",
        "welcomed_at",
        "worker_id",
    )

    def __init__(self, config: StageConfig, replica: int) -> None:
        self.config = config
        self.stage = config.name
        self.replica = replica
        self.worker_id = f"{config.name}/{replica}"
        self.state: SlotState = "down"
        self.proc: WorkerProcess | None = None
        self.expected_token: str | None = None  # the token of the process we spawned
        self.token: str | None = None  # the welcomed incarnation's token
        self.identity: bytes | None = None
        self.pid = 0
        self.capacity = 0
        self.engine = ""
        self.active: dict[str, _Run] = {}
        # Requests waiting for one of this replica's credits, oldest first:
        # a released request keeps its credit until the worker acknowledges
        # the abort, so the orchestrator (which freed it at the terminal
        # event) may route one request early.  It waits here, never on the
        # worker.
        self.deferred: dict[str, list[WorkItem]] = {}
        # Work sent during this loop turn, not yet on the wire: it leaves as
        # one WORK message at the end of the turn (see StageRuntime._queue).
        self.outbox: list[WorkItem] = []
        self.last_seen = 0.0
        self.started_at = 0.0
        self.joined_at = 0.0
        self.welcomed_at = 0.0
        self.failures = 0  # failed starts in a row (died or gave up before READY)
        self.last_failure = ""  # how the last failed start ended, for start-up errors
        self.restart_handle: asyncio.TimerHandle | None = None

    def where(self) -> str:
        return f"stage {self.stage!r} replica {self.replica}"


class ProfileReport(msgspec.Struct, frozen=True):
    """One replica's answer to a profiler start or stop: ``detail`` is where
    its traces go (start), the file written (stop), or what went wrong."""

    stage: str
    replica: int
    ok: bool
    detail: str


class StageRuntime:
    """Runs a pipeline's stage workers.  See the module docstring and docs/runtime.md."""

    def __init__(
        self,
        pipeline: PipelineConfig,
        emit: Callable[[Event], None],
        blobs: BlobStore,
        *,
        endpoint: str | None = None,
        heartbeat_interval_s: float = 0.5,
        lost_after_s: float = 2.0,
        start_timeout_s: float = 120.0,
        restart: bool = True,
        spawn: bool | Iterable[str] = True,
        worker_token: str | None = None,
        load_timeout_s: float | None = None,
        start_attempts: int = DEFAULT_START_ATTEMPTS,
        worker_env: dict[str, str] | None = None,
        python: str = sys.executable,
        forward_worker_output: bool = True,
        worker_cpus: dict[str, str] | None = None,
        vllm_cpu_placement: Literal["spread", "vllm"] = "spread",
        pin_server: bool = False,
        shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S,
        profile_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if heartbeat_interval_s <= 0 or lost_after_s < 2 * heartbeat_interval_s:
            raise ValueError(
                f"lost_after_s={lost_after_s} must be at least twice heartbeat_interval_s="
                f"{heartbeat_interval_s}: a single late heartbeat must not declare a worker lost"
            )
        self.pipeline = pipeline
        self._emit_fn = emit
        self.blobs = blobs
        self.heartbeat_interval_s = heartbeat_interval_s
        self.lost_after_s = lost_after_s
        self.start_timeout_s = start_timeout_s
        self.restart = restart
        names = [st.name for st in pipeline.stages]
        if spawn is True or spawn is False:
            spawned = set(names) if spawn else set()
        else:
            spawned = set(spawn)
            if unknown := sorted(spawned - set(names)):
                raise RuntimeConfigError(
                    f"spawn names {', '.join(map(repr, unknown))}, which pipeline {pipeline.name!r} "
                    f"does not have (stages: {', '.join(names)})"
                )
        # The stages whose workers this runtime starts (and restarts); the
        # others wait for `omnix worker --connect`.
        self.spawned_stages = frozenset(spawned)
        self.worker_token = worker_token or None
        # A replica spawned but not READY within this is killed (and restarted).
        self.load_timeout_s = start_timeout_s if load_timeout_s is None else load_timeout_s
        if start_attempts < 1:
            raise RuntimeConfigError(f"start_attempts={start_attempts} must be at least 1")
        self.start_attempts = start_attempts
        self.worker_env = dict(worker_env or {})
        self.python = python
        self.forward_worker_output = forward_worker_output
        # stage name or worker id ("stage/replica") -> CPU list ("1", "2-3"); opt-in pinning
        self.worker_cpus = dict(worker_cpus or {})
        # vLLM engine cores on CPUs of their own, their workers (and, with
        # pin_server, this process) on the rest ("spread", see placement.py),
        # or no placement ("vllm": vLLM's and the OS's own choice).
        # worker_cpus and VLLM_CPU_OMP_THREADS_BIND win.
        if vllm_cpu_placement not in ("spread", "vllm"):
            raise ValueError(
                f"vllm_cpu_placement must be 'spread' or 'vllm', not {vllm_cpu_placement!r}"
            )
        self.cpu_plan: CpuPlan | None = None
        if vllm_cpu_placement == "spread" and BIND_ENV not in {**os.environ, **self.worker_env}:
            self.cpu_plan = cpu_plan(pipeline, available_cpus(), set(self.worker_cpus))
        self.pin_server = pin_server
        if shutdown_grace_s < 0:
            raise ValueError(
                f"shutdown_grace_s={shutdown_grace_s} must be >= 0 (seconds a worker gets to exit)"
            )
        self.shutdown_grace_s = shutdown_grace_s
        # Where workers write profiler traces (DIR/<stage>/<replica>); None:
        # profiling is off and PROFILE is never sent.
        self.profile_dir = Path(profile_dir).resolve() if profile_dir is not None else None
        self._profile_waits: dict[str, asyncio.Future[m.Profiled]] = {}  # by worker token
        self._tmpdir: str | None = None
        if endpoint is None:
            endpoint, self._tmpdir = default_ipc_endpoint()
        if self.worker_token is None and not _private_endpoint(endpoint):
            raise RuntimeConfigError(
                f"workers endpoint {endpoint} accepts connections from other hosts: set a shared "
                "worker token (--worker-token or OMNIX_WORKER_TOKEN on the server and on every "
                "worker), or bind a loopback address such as tcp://127.0.0.1:PORT"
            )
        self._endpoint = endpoint
        # Check often enough that silence is judged within the bound.
        self._tick_s = min(heartbeat_interval_s, lost_after_s / 8)
        self._silence_s = lost_after_s - self._tick_s
        self._slots: dict[str, list[_Slot]] = {
            st.name: [_Slot(st, r) for r in range(st.replicas)] for st in pipeline.stages
        }
        self._by_identity: dict[bytes, _Slot] = {}
        self._by_token: dict[str, _Slot] = {}
        self._enc = FrameEncoder()
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sock: zmq.Socket[bytes] | None = None
        self._inbox: Inbox | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self._tick_due = 0.0
        self._tick_skipped = False
        self._changed: asyncio.Event | None = None
        self._unsent: list[_Slot] = []  # slots whose outbox holds work
        self._start_errors: list[str] = []
        self._starting = False
        self._started = False
        self._closed = False
        self._procs: list[WorkerProcess] = []  # every process ever spawned (for the finalizer)
        self._finalizer = weakref.finalize(self, _kill_all, self._procs, self._tmpdir)

    # -- public API ---------------------------------------------------------
    @property
    def endpoint(self) -> str:
        """What ``omnix worker --connect`` uses (tcp port 0 is resolved after start)."""
        return self._endpoint

    def ready_replicas(self, stage: str) -> int:
        return sum(1 for s in self._stage_slots(stage) if s.state == "ready")

    def capacity(self, stage: str, replica: int) -> int:
        """The replica's credit count (0 unless ready)."""
        s = self._slot(stage, replica)
        return s.capacity if s.state == "ready" else 0

    def in_flight(self, stage: str, replica: int) -> int:
        """Requests started on the replica and not yet finished/failed/lost."""
        return len(self._slot(stage, replica).active)

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
        self._tick_due = time.monotonic() + self._tick_s
        self._tick_handle = loop.call_later(self._tick_s, self._tick)
        by_hand = [n for n in self._slots if n not in self.spawned_stages]
        log.info(
            "workers endpoint %s; spawned here: %s%s",
            self._endpoint,
            ", ".join(n for n in self._slots if n in self.spawned_stages) or "none",
            f"; waiting for {', '.join(by_hand)}: omnix worker --connect {self._endpoint} --stage NAME"
            f"{' --worker-token TOKEN' if self.worker_token else ''}"
            if by_hand
            else "",
        )
        for slot in self._all_slots():
            if slot.stage in self.spawned_stages:
                self._spawn(slot)
        if wait is None:
            wait = bool(self.spawned_stages)
        if wait:
            self._starting = True
            try:
                await self._wait(
                    self.start_timeout_s,
                    [s for s in self._all_slots() if s.stage in self.spawned_stages],
                )
            except BaseException:
                await self.shutdown()
                raise
            finally:
                self._starting = False

    async def wait_ready(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until every replica of every stage is ready."""
        await self._wait(timeout, self._all_slots())

    async def _wait(self, timeout: float | None, slots: list[_Slot]) -> None:  # noqa: ASYNC109
        assert self._changed is not None, "call start() first"
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._start_errors:
                raise WorkerStartError("\n".join(self._start_errors))
            missing = [s for s in slots if s.state != "ready"]
            if not missing:
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WorkerStartError(self._not_ready_message(missing, timeout or 0))
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    def send(self, work: WorkItem) -> None:
        """Send ``work`` to its replica now (non-blocking).

        Raises ``ReplicaUnavailable`` if the replica is not ready and
        ``CapacityExceeded`` for a seq-0 item beyond its credits: both are
        orchestrator bugs, reported loudly.  A continuation for a request
        the replica does not run (it ended, was aborted or lost) is dropped.
        """
        slot = self._slot(work.stage, work.replica)
        if slot.state != "ready":
            raise ReplicaUnavailable(
                f"{slot.where()} is not ready ({slot.state}); route only to replicas with a "
                f"WorkerJoined and no later WorkerLost (request {work.request_id})"
            )
        rid = work.request_id
        run = slot.active.get(rid)
        waiting = slot.deferred.get(rid)
        if waiting is not None:
            waiting.append(work)
            return
        if work.seq == 0:
            if run is not None:
                raise StageRuntimeError(
                    f"request {rid} already runs on {slot.where()}; seq 0 sent twice"
                )
            if len(slot.active) >= slot.capacity:
                draining = sum(1 for r in slot.active.values() if r.released)
                if len(slot.active) - draining >= slot.capacity:
                    log.error(
                        "over-capacity send refused: %s has %d/%d in flight",
                        slot.where(),
                        len(slot.active),
                        slot.capacity,
                    )
                    raise CapacityExceeded(
                        f"{slot.where()} has capacity {slot.capacity} and {len(slot.active)} requests "
                        f"in flight; request {rid} must wait for a StageFinished/StageFailed there "
                        "(the orchestrator's queue holds it, not the runtime)"
                    )
                slot.deferred[rid] = [work]
                return
            slot.active[rid] = _Run()
        elif run is None or run.aborted:
            log.debug(
                "dropping piece %d of request %s: not running on %s", work.seq, rid, slot.where()
            )
            return
        else:
            run.next_seq = work.seq + 1
        self._queue(slot, work)

    def abort(self, request_id: str, stage: str, replica: int) -> None:
        """Ask the replica to stop ``request_id``; it answers StageFinished(aborted).

        A no-op when the replica does not run the request (already ended, or
        the replica is lost: its WorkerLost already ended the stage).
        """
        slot = self._slot(stage, replica)
        if slot.deferred.pop(request_id, None) is not None:
            # Never reached the worker: acknowledge for it, after the caller's
            # cascade (emit is never called from inside abort).
            assert self._loop is not None
            self._loop.call_soon(
                self._emit,
                StageFinished(
                    request_id=request_id,
                    stage=stage,
                    replica=replica,
                    chunks=0,
                    finish_reason="aborted",
                ),
            )
            return
        run = slot.active.get(request_id)
        if run is None or run.aborted or slot.state != "ready":
            return
        run.aborted = True
        self._send_to(slot, m.ABORT, m.Abort(request_id))

    def release(self, request_id: str) -> None:
        """Forget ``request_id`` (call after its terminal event).

        If a replica still runs it (a terminal decision without aborts) it
        is aborted, its credit stays taken until the worker acknowledges,
        and no further events are emitted for it.
        """
        for slot in self._all_slots():
            slot.deferred.pop(request_id, None)
            run = slot.active.get(request_id)
            if run is None:
                continue
            run.released = True
            if not run.aborted and slot.state == "ready":
                run.aborted = True
                self._send_to(slot, m.ABORT, m.Abort(request_id))

    async def shutdown(self) -> None:
        """Stop every worker; idempotent.  Afterwards no child process remains."""
        if self._closed:
            return
        self._closed = True
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        if self._inbox is not None:
            # Stop reading now: an unread, still-registered ZMQ FD stays
            # readable and would spin the loop while workers exit.
            self._inbox.close()
        slots = self._all_slots()
        # A worker still loading its engine runs no request and cannot stop
        # before its load ends (a vLLM load takes 15-30 s on CPU): it gets
        # no grace.  Ctrl-C during start-up then takes seconds, not a load.
        loading = {
            s.proc.pid for s in slots if s.state in ("starting", "joining") and s.proc is not None
        }
        for slot in slots:
            if slot.restart_handle is not None:
                slot.restart_handle.cancel()
            slot.outbox.clear()  # the worker is told to stop; queued work would be dropped there
            if slot.identity is not None and self._sock is not None:
                with contextlib.suppress(zmq.ZMQError):
                    self._sock.send_multipart(
                        self._enc.encode(m.SHUTDOWN, m.Shutdown("server shutdown"), slot.identity)
                    )
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
        self._by_identity.clear()
        self._by_token.clear()
        procs = [p for p in self._procs if p.returncode is None]
        await _exited([p for p in procs if p.pid not in loading], self.shutdown_grace_s)
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
                    self.shutdown_grace_s,
                )
            p.terminate()
        stuck = await _exited(procs, 2.0)
        for p in stuck:
            p.kill()
        await _exited(stuck, 5.0)
        for p in self._procs:
            p.poll()
            p.kill()  # any grandchildren left in its group
            p.close()
        if self._sock is not None:
            self._sock.close(0)
        if self._ctx is not None:
            self._ctx.term()
        remove_endpoint_dir(self._tmpdir)
        self._finalizer.detach()
        if self._changed is not None:
            self._changed.set()

    # -- slots --------------------------------------------------------------
    def _stage_slots(self, stage: str) -> list[_Slot]:
        try:
            return self._slots[stage]
        except KeyError:
            raise KeyError(
                f"pipeline {self.pipeline.name!r} has no stage {stage!r} "
                f"(stages: {', '.join(self._slots)})"
            ) from None

    def _slot(self, stage: str, replica: int) -> _Slot:
        slots = self._stage_slots(stage)
        if not 0 <= replica < len(slots):
            raise KeyError(f"stage {stage!r} has replicas 0..{len(slots) - 1}, not {replica}")
        return slots[replica]

    def _all_slots(self) -> list[_Slot]:
        return [s for slots in self._slots.values() for s in slots]

    def _changed_state(self) -> None:
        if self._changed is not None:
            self._changed.set()

    # -- spawning -----------------------------------------------------------
    def _spawn(self, slot: _Slot) -> None:
        slot.restart_handle = None
        if self._closed:
            return
        assert self._loop is not None
        token = secrets.token_hex(8)
        env = self.spawn_env(slot.stage, slot.replica)
        env[TOKEN_ENV] = token
        env[PARENT_ENV] = str(os.getpid())
        if self.worker_token:
            env[AUTH_ENV] = self.worker_token
        else:
            env.pop(AUTH_ENV, None)
        argv = [
            self.python,
            "-m",
            "omnix.stages.worker_cli",
            "--connect",
            self._endpoint,
            "--stage",
            slot.stage,
            "--replica",
            str(slot.replica),
        ]
        proc = WorkerProcess(
            argv,
            env,
            slot.worker_id,
            self._loop,
            self._on_proc_exit,
            forward_output=self.forward_worker_output,
        )
        self._procs[:] = [p for p in self._procs if p.returncode is None]
        self._procs.append(proc)
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
        env = dict(os.environ)
        # torch's thread pool and the streaming loop fight for a small
        # machine's cores (docs/runtime.md); worker_env may override it.
        env["OMP_NUM_THREADS"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        root = os.path.dirname(os.path.dirname(os.path.abspath(omnix.__file__)))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.pop(ENGINE_CPUS_ENV, None)  # only the plan (or worker_env) places an engine
        env.update(self.worker_env)
        cpus = self.worker_cpus.get(wid) or self.worker_cpus.get(stage)
        plan = self.cpu_plan
        if plan is not None and wid in plan.engines:
            cpus = plan.frontend
            env[ENGINE_CPUS_ENV] = plan.engines[wid]
        if cpus:
            env[CPUS_ENV] = cpus
        return env

    def _on_proc_exit(self, proc: WorkerProcess) -> None:
        slot = next((s for s in self._all_slots() if s.proc is proc), None)
        if slot is None or self._closed or slot.state == "down":
            return  # not ours any more, or already handled (lost by heartbeat, then killed)
        why = proc.describe_exit()
        when = "" if slot.state == "ready" else " before it was ready"
        self._lose(slot, why, f"{why}{when}; its last output:\n{proc.last_output()}")

    def _schedule_restart(self, slot: _Slot) -> None:
        assert self._loop is not None
        delay = _RESTART_BACKOFF_S[min(slot.failures, len(_RESTART_BACKOFF_S) - 1)]
        if delay:
            log.warning(
                "restarting %s in %.1f s (%d failed starts in a row)",
                slot.worker_id,
                delay,
                slot.failures,
            )
        slot.restart_handle = self._loop.call_later(delay, self._spawn, slot)

    # -- loss -----------------------------------------------------------------
    def _lose(self, slot: _Slot, reason: str, detail: str = "", *, restart: bool = True) -> None:
        """The slot's worker is gone (or disowned): emit, clean up, restart.

        ``detail`` (how it ended and its last output) goes into start-up
        errors and logs, ``reason`` into ``WorkerLost``."""
        if slot.state == "down":
            return
        was_ready = slot.state == "ready"
        if slot.identity is not None:
            self._by_identity.pop(slot.identity, None)
        if slot.token is not None:
            self._by_token.pop(slot.token, None)
        slot.identity = None
        slot.token = None
        slot.state = "down"
        slot.active.clear()  # its requests are lost; the reducer marks their stages
        slot.deferred.clear()
        slot.outbox.clear()
        if slot.proc is not None and slot.proc.returncode is None:
            # Alive but silent (hung, stopped, partitioned) or too slow to
            # load: make sure it can never come back as a ghost next to its
            # replacement.
            slot.proc.kill()
        if was_ready:
            log.warning("lost %s: %s", slot.worker_id, reason)
            self._emit(
                WorkerLost(
                    worker_id=slot.worker_id, stage=slot.stage, replica=slot.replica, reason=reason
                )
            )
            slot.failures = 0
        else:
            slot.failures += 1
            slot.last_failure = detail or reason
        self._changed_state()
        if slot.proc is None or self._closed:
            return  # hand-started: restarting it is its process manager's job
        if not restart or not self.restart:
            if self._starting:
                self._start_errors.append(f"{slot.where()} did not come up: {detail or reason}")
            return
        if self._starting and not was_ready and slot.failures >= self.start_attempts:
            self._start_errors.append(
                f"{slot.where()} did not come up ({slot.failures} failed starts in a row); the last: "
                f"{slot.last_failure}"
            )
            return
        if not was_ready:
            log.error("%s failed to start: %s", slot.worker_id, slot.last_failure)
        self._schedule_restart(slot)

    def _tick(self) -> None:
        if self._closed:
            return
        assert self._loop is not None
        late = time.monotonic() - self._tick_due
        self._tick_handle = self._loop.call_later(self._tick_s, self._tick)
        self._tick_due = time.monotonic() + self._tick_s
        assert self._inbox is not None
        self._inbox.drain()  # heartbeats already queued count: our own lateness is not their death
        now = time.monotonic()
        if late > self._tick_s and not self._tick_skipped:
            # This process did not run for a while (a starved server on a
            # loaded machine): heartbeats sent meanwhile may still sit in the
            # kernel, unread by ZMQ's I/O thread.  Judge at the next tick
            # (only one in a row: a loop that is always late still judges).
            self._tick_skipped = True
            log.debug("liveness check ran %.2f s late; judging at the next one", late)
            return
        self._tick_skipped = False
        for slot in self._all_slots():
            proc = slot.proc
            if proc is not None and proc.returncode is None:
                proc.poll()  # no-op with a pidfd; the fallback otherwise
            st = slot.state
            silent = now - slot.last_seen
            if st == "ready" and silent > self._silence_s:
                self._lose(slot, f"no heartbeat for {silent:.1f} s")
            elif st == "joining" and proc is None and silent > self._silence_s:
                # A worker we did not spawn has only its heartbeats.  One we
                # spawned is watched through its process (its death is seen
                # at once) while it loads: the load can starve its heartbeat
                # thread on a loaded machine, and slow to load is not dead.
                log.error(
                    "%s went silent for %.1f s while loading its engine; dropping it",
                    slot.worker_id,
                    silent,
                )
                self._lose(slot, f"no heartbeat for {silent:.1f} s while loading")
            elif (
                st == "joining"
                and proc is not None
                and now - slot.welcomed_at > self.load_timeout_s
            ):
                self._lose(
                    slot,
                    f"did not finish loading its engine within {self.load_timeout_s:.0f} s "
                    "(load_timeout_s); killed it",
                )
            elif st == "starting" and now - slot.started_at > self.load_timeout_s:
                self._lose(
                    slot,
                    f"worker process {slot.pid} did not say hello within "
                    f"{self.load_timeout_s:.0f} s (load_timeout_s); killed it",
                )

    # -- receiving ------------------------------------------------------------
    def _routes(self) -> list[Route[Any]]:
        """What each message a worker sends is handed to (see ``Inbox``)."""
        return [
            Route(m.OUTPUTS, list[m.Record], self._on_outputs),
            Route(m.HEARTBEAT, m.Heartbeat, self._on_heartbeat),
            Route(m.HELLO, m.Hello, self._on_hello),
            Route(m.READY, m.Ready, self._on_ready),
            Route(m.START_FAILED, m.StartFailed, self._on_start_failed),
            Route(m.GOODBYE, m.Goodbye, self._on_goodbye),
            Route(m.PROFILED, m.Profiled, self._on_profiled),
        ]

    def _on_outputs(self, identity: bytes, records: list[m.Record]) -> None:
        slot = self._by_identity.get(identity)
        if slot is not None:
            slot.last_seen = time.monotonic()
            self._on_records(slot, records)

    def _on_goodbye(self, identity: bytes, msg: m.Goodbye) -> None:
        slot = self._by_identity.get(identity)
        if slot is not None and slot.token == msg.token:
            self._lose(slot, f"worker exited: {msg.reason}")

    def _on_records(self, slot: _Slot, records: list[m.Record]) -> None:
        emit = self._emit
        stage = slot.stage
        replica = slot.replica
        active = slot.active
        for rec in records:
            rid = rec.request_id
            run = active.get(rid)
            # type(rec) is written out in each test so the checker narrows
            # rec; outputs, the common record, cost one test.
            if type(rec) is m.Output:
                if run is None or run.released:
                    continue
                blob = None
                if rec.array is not None:
                    blob = self.blobs.put_array(rec.array, rec.media_type)
                elif rec.data:
                    blob = self.blobs.put(rec.data, rec.media_type)
                emit(
                    Chunk(
                        request_id=rid,
                        stage=stage,
                        replica=replica,
                        index=rec.index,
                        modality=rec.modality,
                        text=rec.text,
                        token_ids=rec.token_ids,
                        blob=blob,
                        piece=rec.piece,
                        logprobs=rec.logprobs,
                    )
                )
            else:
                if type(rec) is m.Done or type(rec) is m.Error:
                    active.pop(rid, None)
                    if slot.deferred:
                        self._send_deferred(slot)
                if run is None or run.released:
                    continue
                if type(rec) is m.Started:
                    emit(StageStarted(request_id=rid, stage=stage, replica=replica))
                elif type(rec) is m.ProgressRec:
                    emit(
                        Progress(
                            request_id=rid,
                            stage=stage,
                            replica=replica,
                            step=rec.step,
                            total=rec.total,
                        )
                    )
                elif type(rec) is m.Done:
                    emit(
                        StageFinished(
                            request_id=rid,
                            stage=stage,
                            replica=replica,
                            chunks=rec.chunks,
                            finish_reason=rec.finish_reason,
                            prompt_tokens=rec.prompt_tokens,
                            output_tokens=rec.output_tokens,
                        )
                    )
                elif type(rec) is m.Error:
                    emit(
                        StageFailed(
                            request_id=rid, stage=stage, replica=replica, message=rec.message
                        )
                    )
            if slot.state != "ready":
                return  # an event listener shut us down or lost the slot

    def _send_deferred(self, slot: _Slot) -> None:
        """A credit came back: start the oldest waiting request(s)."""
        while slot.deferred and len(slot.active) < slot.capacity and slot.state == "ready":
            rid = next(iter(slot.deferred))
            items = slot.deferred.pop(rid)
            run = slot.active[rid] = _Run()
            for work in items:
                run.next_seq = work.seq + 1
                self._queue(slot, work)

    def _on_heartbeat(self, identity: bytes, hb: m.Heartbeat) -> None:
        slot = self._by_token.get(hb.token)
        assert self._sock is not None
        if slot is None:
            msg = self._enc.encode(
                m.REFUSED,
                m.Refused(
                    "this server does not know the worker (it was declared lost or the server "
                    "restarted); start it again"
                ),
                identity,
            )
        else:
            slot.last_seen = time.monotonic()
            msg = self._enc.encode(m.HEARTBEAT_ACK, m.HeartbeatAck(), identity)
        with contextlib.suppress(zmq.ZMQError):  # its connection may be gone
            self._sock.send_multipart(msg)

    def _refuse(self, identity: bytes, reason: str, hello: m.Hello | None = None) -> None:
        who = (
            f" (stage {hello.stage!r}, pid {hello.pid} on {hello.host or 'an unnamed host'})"
            if hello
            else ""
        )
        log.warning("refused a worker%s: %s", who, reason)
        assert self._sock is not None
        with contextlib.suppress(zmq.ZMQError):
            self._sock.send_multipart(self._enc.encode(m.REFUSED, m.Refused(reason), identity))

    def _on_hello(self, identity: bytes, hello: m.Hello) -> None:
        if hello.protocol != m.PROTOCOL_VERSION:
            return self._refuse(
                identity,
                (
                    f"protocol version {hello.protocol} differs from the server's "
                    f"{m.PROTOCOL_VERSION}; run the same omnix version on both sides"
                ),
                hello,
            )
        if self.worker_token is not None and not hmac.compare_digest(
            hello.auth.encode(), self.worker_token.encode()
        ):
            return self._refuse(
                identity,
                ("wrong worker token" if hello.auth else "this server requires a worker token")
                + "; pass the server's with --worker-token or OMNIX_WORKER_TOKEN",
                hello,
            )
        known = self._by_token.get(hello.token)
        if known is not None:
            if known.state != "joining" or known.stage != hello.stage:
                return self._refuse(identity, "a worker with this token has already joined", hello)
            # The same worker again (its attempt timed out before our answer
            # reached it): the same answer, on its new connection.
            if known.identity is not None:
                self._by_identity.pop(known.identity, None)
            known.identity = identity
            self._by_identity[identity] = known
            return self._welcome(known)
        slots = self._slots.get(hello.stage)
        if slots is None:
            return self._refuse(
                identity,
                (
                    f"pipeline {self.pipeline.name!r} has no stage {hello.stage!r} "
                    f"(stages: {', '.join(self._slots)})"
                ),
                hello,
            )
        slot: _Slot | None
        if hello.stage in self.spawned_stages:
            slot = next(
                (s for s in slots if s.expected_token == hello.token and s.state == "starting"),
                None,
            )
            if slot is None:
                return self._refuse(
                    identity,
                    (
                        f"the workers of stage {hello.stage!r} are spawned by this server itself; "
                        "hand-started workers join the stages it does not spawn (omnix serve --spawn)"
                    ),
                    hello,
                )
        elif hello.replica >= 0:
            if hello.replica >= len(slots):
                return self._refuse(
                    identity,
                    (
                        f"stage {hello.stage!r} has replicas 0..{len(slots) - 1}, not {hello.replica}"
                    ),
                    hello,
                )
            slot = slots[hello.replica]
            if slot.state != "down":
                return self._refuse(
                    identity,
                    (
                        f"replica {hello.replica} of stage {hello.stage!r} already has a worker "
                        f"(pid {slot.pid}, {slot.state}); pick another --replica or omit it"
                    ),
                    hello,
                )
        else:
            slot = next((s for s in slots if s.state == "down"), None)
            if slot is None:
                return self._refuse(
                    identity,
                    (
                        f"all {len(slots)} replicas of stage {hello.stage!r} have workers; raise "
                        "`replicas` in the pipeline config to add more"
                    ),
                    hello,
                )
        assert self._sock is not None
        slot.state = "joining"
        slot.token = hello.token
        slot.identity = identity
        slot.pid = hello.pid
        slot.last_seen = slot.welcomed_at = time.monotonic()
        self._by_identity[identity] = slot
        self._by_token[hello.token] = slot
        self._welcome(slot)
        log.debug("welcomed %s (pid %d)", slot.worker_id, hello.pid)

    def _welcome(self, slot: _Slot) -> None:
        welcome = m.Welcome(
            replica=slot.replica,
            config=slot.config,
            pipeline=self.pipeline.name,
            heartbeat_interval_s=self.heartbeat_interval_s,
            server_lost_after_s=max(10.0, 5 * self.lost_after_s),
            profile_dir=str(self.profile_dir / slot.stage / str(slot.replica))
            if self.profile_dir
            else "",
        )
        self._send_to(slot, m.WELCOME, welcome)

    def _on_profiled(self, identity: bytes, msg: m.Profiled) -> None:
        wait = self._profile_waits.pop(msg.token, None)
        if wait is not None and not wait.done():
            wait.set_result(msg)

    async def profile(
        self, action: m.ProfileAction, stages: Iterable[str], timeout_s: float = 120.0
    ) -> list[ProfileReport]:
        """Start or stop the profiler of every ready replica of ``stages``;
        each replica's answer (a replica that does not answer within
        ``timeout_s`` is reported as such).  Raises ``RuntimeConfigError``
        when profiling is off or a stage does not exist."""
        if self.profile_dir is None:
            raise RuntimeConfigError("profiling is off: start the server with --profile-dir DIR")
        names = list(stages)
        known = {st.name for st in self.pipeline.stages}
        if unknown := [n for n in names if n not in known]:
            raise RuntimeConfigError(
                f"pipeline {self.pipeline.name!r} has no stage {', '.join(map(repr, unknown))} "
                f"(stages: {', '.join(sorted(known))})"
            )
        assert self._loop is not None
        asked: list[tuple[_Slot, asyncio.Future[m.Profiled]]] = []
        for name in names:
            for slot in self._stage_slots(name):
                if slot.state != "ready" or slot.token is None:
                    continue
                wait = self._loop.create_future()
                self._profile_waits[slot.token] = wait
                asked.append((slot, wait))
                self._send_to(slot, m.PROFILE, m.Profile(action))
        if asked:
            await asyncio.wait([w for _, w in asked], timeout=timeout_s)
        reports = []
        for slot, wait in asked:
            if wait.done():
                got = wait.result()
                reports.append(ProfileReport(slot.stage, slot.replica, got.ok, got.detail))
            else:
                if slot.token is not None:
                    self._profile_waits.pop(slot.token, None)
                reports.append(
                    ProfileReport(
                        slot.stage, slot.replica, False, f"no answer within {timeout_s:g} s"
                    )
                )
        return reports

    def _on_ready(self, identity: bytes, ready: m.Ready) -> None:
        slot = self._by_identity.get(identity)
        if slot is None or slot.token != ready.token or slot.state != "joining":
            return self._refuse(
                identity, "READY from a worker that is not joining; say HELLO first"
            )
        slot.state = "ready"
        slot.capacity = ready.capacity
        slot.engine = ready.engine
        slot.last_seen = slot.joined_at = time.monotonic()
        slot.failures = 0
        self._emit(
            WorkerJoined(
                worker_id=slot.worker_id,
                stage=slot.stage,
                replica=slot.replica,
                engine=ready.engine,
                capacity=ready.capacity,
                pid=slot.pid,
            )
        )
        self._changed_state()

    def _on_start_failed(self, identity: bytes, msg: m.StartFailed) -> None:
        slot = self._by_identity.get(identity)
        if slot is None or slot.token != msg.token:
            return
        text = f"{slot.where()} could not load its engine: {msg.message}"
        if self._starting:
            # The engine said why: a missing model or a bad argument, which a
            # restart would only repeat.  Fail start-up with its own words.
            self._start_errors.append(text)
            self._lose(slot, text, restart=False)
        else:
            self._lose(slot, text)

    # -- sending ----------------------------------------------------------------
    def _queue(self, slot: _Slot, work: WorkItem) -> None:
        """Send ``work`` at the end of this loop turn, with whatever else the
        turn sends to the same replica, as one WORK message.

        Why: a burst (32 requests admitted by 32 client tasks in one turn,
        or every piece a chunk batch routes downstream) otherwise costs one
        ZMQ message each, and on a small machine each one wakes both
        processes' I/O threads: measured 150-250 us per send on 2 busy
        cores, serialising a 32-request burst by ~7 ms.  One message costs
        one wakeup.  The delay is the rest of the current turn.

        Not "the first at once, the rest batched": the lone first request
        reaches vLLM ~2 ms before the rest, vLLM runs a prefill step for it
        alone, and the burst's others queue behind that step (worse TTFT
        p50 at concurrency 32).  On a small machine the worker shares
        the CPU with this process anyway, so sending early overlaps
        nothing."""
        box = slot.outbox
        box.append(work)
        if len(box) == 1:
            if not self._unsent:
                assert self._loop is not None
                self._loop.call_soon(self._flush_work)
            self._unsent.append(slot)

    def _flush_work(self) -> None:
        slots, self._unsent = self._unsent, []
        for slot in slots:
            self._flush_slot(slot)

    def _flush_slot(self, slot: _Slot) -> None:
        """Put ``slot``'s queued work on the wire now (before any message that
        must follow it: an abort must never overtake the work it aborts)."""
        if not slot.outbox:
            return
        items, slot.outbox = slot.outbox, []
        if slot.state == "ready" and slot.identity is not None:
            self._send_to(slot, m.WORK, items)

    def _send_to(self, slot: _Slot, mtype: bytes, msg: object) -> None:
        sock = self._sock
        assert sock is not None and slot.identity is not None
        if mtype != m.WORK and slot.outbox:
            self._flush_slot(slot)
        frames = self._enc.encode(mtype, msg, slot.identity)
        try:
            send_frames(sock, frames)
        except zmq.ZMQError as exc:
            # ROUTER_MANDATORY: its connection is gone.  Declare it lost from
            # the loop, not from inside the caller's send().
            assert self._loop is not None
            self._loop.call_soon(self._lose, slot, f"unreachable: {exc}")
            return
        assert self._inbox is not None
        self._inbox.kick()

    def _emit(self, ev: Event) -> None:
        try:
            self._emit_fn(ev)
        except Exception:
            # emit must not raise (contract); if it does, keep serving.
            log.exception("emit(%s) raised; event dropped", type(ev).__name__)

    def _not_ready_message(self, missing: list[_Slot], timeout: float) -> str:
        lines = []
        for s in missing:
            if s.state == "down" and s.stage not in self.spawned_stages:
                lines.append(
                    f"{s.where()}: no worker joined within {timeout:.0f} s; start one with "
                    f"`omnix worker --connect {self._endpoint} --stage {s.stage}`"
                )
            elif s.state == "starting":
                lines.append(
                    f"{s.where()}: the worker (pid {s.pid}) never said hello within {timeout:.0f} s"
                )
            elif s.state == "joining":
                lines.append(
                    f"{s.where()}: the worker (pid {s.pid}) was still loading its engine after "
                    f"{timeout:.0f} s; raise start_timeout_s if its model loads slowly"
                )
            elif s.state == "down" and s.failures:
                lines.append(
                    f"{s.where()}: {s.failures} failed starts in a row; the last: {s.last_failure}"
                )
                continue
            else:
                lines.append(f"{s.where()}: not ready ({s.state})")
            if s.proc is not None and s.proc.tail:
                lines.append("  its last output:\n" + s.proc.last_output())
        return "stage workers not ready:\n" + "\n".join(lines)


def _kill_all(procs: list[WorkerProcess], tmpdir: str | None) -> None:
    """Finalizer: a runtime dropped without shutdown() still leaves no child
    (and no socket directory)."""
    for p in procs:
        with contextlib.suppress(Exception):
            p.kill()
            p.wait_blocking(2.0)
    remove_endpoint_dir(tmpdir)


def _private_endpoint(endpoint: str) -> bool:
    """Whether only this host can connect: ipc, or tcp on a loopback address."""
    if not endpoint.startswith("tcp://"):
        return True
    host = endpoint[len("tcp://") :].rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a wildcard (*), an interface or a host name: reachable from elsewhere
