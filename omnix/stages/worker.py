"""One stage worker process: its connection to the server, from HELLO to exit.

Owns: ``Worker`` (what runs inside ``omnix worker``): it connects to a
stage runtime, says HELLO, gets its stage's config, loads the engine, says
READY, serves until told to stop, and tears down (engine closed, GOODBYE
sent, sockets closed).  A hand-started worker whose server stops answering
(or no longer knows it: a restarted server) drops the requests it ran and
joins again, keeping its loaded engine, for up to ``reconnect_for_s``.
The parts live beside it, each owning one concern:

* ``worker_requests.py``: the running requests and the feeding of WORK
  into them (the input iterator an engine reads);
* ``worker_engine_loop.py``: one request run on the engine, as records;
* ``worker_control.py``: ABORT and PROFILE;
* ``worker_outbox.py``: what the worker sends, records batched per turn;
* ``worker_heartbeat.py``: the heartbeat thread, which also notices a
  lost server;
* ``worker_process.py``: exit codes, process exit, heap settings.

Does not own the protocol's shape (``omnix.transport``) nor any decisions
about requests: it reports what happened, the orchestrator decides.

Per request the worker sends ``Started`` once, outputs, then exactly one of
``Done`` (``finish_reason="aborted"`` when acknowledging an abort) or
``Error`` (the engine raised, or aborted the request on its own; the worker
lives on).  An abort for a request it no longer runs is ignored; work for a
request it has aborted is dropped (a bounded memory of aborted ids).

Exit codes: 0 clean shutdown, 2 refused by the server (a missing or wrong
worker token among the reasons), 3 the engine failed to load, 4 no answer
to HELLO, 5 the server stopped answering heartbeats and no server answered
within ``reconnect_for_s`` (or the parent that spawned this worker died),
128 + the signal when a second SIGINT/SIGTERM cut the shutdown short.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import socket
import time
from pathlib import Path
from typing import Any

import msgspec
import zmq

from omnix.pipelines.config import StageConfig, engine_kind
from omnix.stages.engine import Engine, ProfilingEngine, load_engine
from omnix.stages.profiler import WorkerProfiler
from omnix.stages.worker_control import Aborts, Profiling
from omnix.stages.worker_engine_loop import EngineLoop
from omnix.stages.worker_heartbeat import Heartbeats
from omnix.stages.worker_outbox import Outbox
from omnix.stages.worker_process import (
    AUTH_ENV,
    EXIT_ENGINE_FAILED,
    EXIT_NO_SERVER,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_SERVER_LOST,
    PARENT_ENV,
    TOKEN_ENV,
    WorkerExit,
    apply_thread_limits,
    exit_now,
    exit_without_finalizing,
    freeze_heap,
    say,
)
from omnix.stages.worker_requests import Req, Requests
from omnix.transport import messages as m
from omnix.transport.inbox import Inbox, Route, ignore
from omnix.transport.sockets import make_dealer
from omnix.transport.work import EngineInfo, WorkItem

__all__ = [
    "AUTH_ENV",
    "EXIT_ENGINE_FAILED",
    "EXIT_NO_SERVER",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_SERVER_LOST",
    "PARENT_ENV",
    "TOKEN_ENV",
    "Worker",
    "WorkerExit",
    "exit_without_finalizing",
    "freeze_heap",
]

log = logging.getLogger("omnix.worker")

# Bound on the engine's close at shutdown: inside the runtime's default grace
# (DEFAULT_SHUTDOWN_GRACE_S, 10 s), with room left for the goodbye.
_ENGINE_CLOSE_S = 8.0
# Rejoining: a fresh socket and HELLO this often until a server answers.
# The server answers a repeated HELLO (same token) with the same WELCOME,
# so an answer racing the next attempt takes no second replica.
_REJOIN_ATTEMPT_S = 5.0


class Worker:
    """A stage worker bound to one server endpoint.  ``await run()`` -> exit code."""

    def __init__(
        self,
        connect: str,
        stage: str,
        replica: int = -1,
        *,
        token: str | None = None,
        parent_pid: int = 0,
        hello_timeout_s: float = 60.0,
        auth: str = "",
        reconnect_for_s: float = 300.0,
    ) -> None:
        #: the servers it may join, in order (a replicated log's leader and
        #: standbys); ``connect`` is the one it joins now
        self.endpoints = connect.split(",")
        self.connect = self.endpoints[0]
        self.stage = stage
        self.replica = replica
        self._asked_replica = replica  # what a rejoin asks for again
        self.auth = auth
        # A hand-started worker that lost its server tries to join one again
        # for this long (0: exit at once, code 5).  Spawned workers die with
        # their server instead.
        self.reconnect_for_s = reconnect_for_s
        self.token = token or secrets.token_hex(8)
        self.parent_pid = parent_pid
        self.hello_timeout_s = hello_timeout_s
        self.config: StageConfig | None = None
        self.engine: Engine | None = None
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._welcome: asyncio.Future[m.Welcome] | None = None
        self._stopped: asyncio.Event | None = None
        self._exit_code = EXIT_OK
        self._exit_reason = ""
        self._server_gone = False
        self._info: EngineInfo | None = None
        self._lost_reason: str | None = None  # the server was lost; set until rejoined
        self._rejoining: asyncio.Task[None] | None = None
        self._outbox = Outbox()
        self.requests = Requests(
            self._outbox, run=self._run_request, stopping=self._stopping, who=self._who
        )
        self._engine_loop = EngineLoop(
            stage, self.requests, self._outbox, stop=self.stop, stopping=self._stopping
        )
        self._aborts = Aborts(self.requests, self._outbox)
        self._profiling = Profiling(self._outbox, token=lambda: self.token, who=self._who)
        self._heartbeats = Heartbeats(
            connect=self.connect,
            parent_pid=parent_pid,
            reconnect_for_s=reconnect_for_s,
            who=self._who,
            running=lambda: len(self.requests.active),
            on_lost=self._on_server_lost,
            stop=self.stop,
        )

    def _who(self) -> str:
        return f"{self.stage}/{self.replica}"

    def _stopping(self) -> bool:
        return self._stopped is not None and self._stopped.is_set()

    def _run_request(self, req: Req, item: WorkItem) -> None:
        self._engine_loop.run(req, item)

    # -- lifecycle -----------------------------------------------------------
    async def run(self) -> int:
        loop = self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self._ctx = zmq.Context()
        self._new_socket()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError):  # not the main thread
                pass
        try:
            welcome = await self._join(self.hello_timeout_s)
            self.replica = welcome.replica
            self.config = welcome.config
            if welcome.profile_dir:
                self._profiling.profiler = WorkerProfiler(Path(welcome.profile_dir))
            self._heartbeats.start(loop, self._ctx, self.token, welcome)
            await self._load_engine()
            if self._lost_reason is None and self._heartbeats.lost is None:
                self._send_ready()
            else:  # the server went away while the engine loaded
                self._lost_reason = self._lost_reason or self._heartbeats.lost
                self._begin_rejoin()
            await self._stopped.wait()
            return self._exit_code
        except WorkerExit as exc:
            say(f"omnix worker {self._who()}: {exc}")
            self._exit_reason = str(exc)
            return exc.code
        finally:
            await self._teardown()

    def stop(self, code: int = EXIT_OK, reason: str = "") -> None:
        """Ask the worker to exit (thread-unsafe: call on the loop)."""
        if self._stopped is None or self._stopped.is_set():
            return
        self._exit_code = code
        self._exit_reason = reason
        if code != EXIT_OK or reason:
            log.info("worker %s/%s stopping: %s", self.stage, self.replica, reason)
        self._stopped.set()

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self._stopped is not None and self._stopped.is_set():
            # Already stopping (an engine can take seconds to close): a
            # second signal, Ctrl-C again or the runtime's SIGTERM after its
            # grace, means now.
            say(f"omnix worker {self._who()}: {name} again: exiting now")
            exit_now(128 + sig)
        self.stop(EXIT_OK, f"received {name}")

    async def _handshake(self, timeout: float) -> m.Welcome:  # noqa: ASYNC109
        loop = asyncio.get_running_loop()
        self._welcome = loop.create_future()
        hello = m.Hello(
            protocol=m.PROTOCOL_VERSION,
            stage=self.stage,
            replica=self._asked_replica,
            pid=os.getpid(),
            token=self.token,
            host=socket.gethostname(),
            auth=self.auth,
        )
        self._outbox.send(m.HELLO, hello)
        try:
            return await asyncio.wait_for(self._welcome, timeout)
        except TimeoutError:
            raise WorkerExit(
                EXIT_NO_SERVER,
                f"no answer from a stage runtime at {self.connect} within "
                f"{timeout:.0f} s; check that the server is running and that "
                "the address (and port) is the one it printed",
            ) from None

    async def _load_engine(self) -> None:
        cfg = self.config
        assert cfg is not None
        kind = engine_kind(cfg.engine)
        profiler = self._profiling.profiler
        try:
            engine = load_engine(kind, cfg.engine)
            self.engine = engine
            if profiler is not None:
                await asyncio.to_thread(profiler.prepare)
                if isinstance(engine, ProfilingEngine):
                    engine.prepare_profiling(profiler.root)
            # object, not EngineInfo: the class was imported by name, so
            # check what it really returned.
            info: object = await engine.start()
            if not isinstance(info, EngineInfo) or info.capacity < 1:
                raise TypeError(
                    f"engine {kind!r} start() returned {info!r}, not an EngineInfo with capacity >= 1"
                )
        except Exception as exc:
            log.exception("engine %r for stage %r failed to start", kind, self.stage)
            self._outbox.send(
                m.START_FAILED, m.StartFailed(self.token, f"{type(exc).__name__}: {exc}")
            )
            raise WorkerExit(
                EXIT_ENGINE_FAILED,
                f"engine {kind!r} for stage {self.stage!r} failed to start: {type(exc).__name__}: {exc}",
            ) from exc
        apply_thread_limits()
        freeze_heap()
        self.requests.engine = self._profiling.engine = engine
        self.requests.capacity = info.capacity
        self._info = info

    def _send_ready(self) -> None:
        info = self._info
        assert info is not None
        self._outbox.send(
            m.READY,
            m.Ready(self.token, info.engine, info.capacity, info.device, info.model, info.settings),
        )
        log.info(
            "worker %s/%d ready: engine %s, capacity %d, pid %d",
            self.stage,
            self.replica,
            info.engine,
            info.capacity,
            os.getpid(),
        )

    async def _teardown(self) -> None:
        if self._rejoining is not None and not self._rejoining.done():
            self._rejoining.cancel()
        tasks = [
            r.task
            for r in self.requests.active.values()
            if r.task is not None and not r.task.done()
        ]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        self._outbox.flush()
        if self.engine is not None:
            try:
                await asyncio.wait_for(self.engine.close(), _ENGINE_CLOSE_S)
            except Exception:
                log.exception("engine close failed")
        if (
            self._outbox.sock is not None
            and not (self._server_gone or self._heartbeats.fatal)
            and self._welcome is not None
            and self._welcome.done()
        ):
            try:
                self._outbox.send(m.GOODBYE, m.Goodbye(self.token, self._exit_reason or "exiting"))
            except zmq.ZMQError:
                pass
        self._heartbeats.close()
        if self._outbox.inbox is not None:
            self._outbox.inbox.close()
        if self._outbox.sock is not None:
            self._outbox.sock.close(linger=500)  # let the last outputs and the goodbye out
        if self._ctx is not None:
            self._ctx.term()

    # -- losing the server and joining again ---------------------------------------
    def _on_server_lost(self, reason: str) -> None:
        """On the loop, from the heartbeat thread: the server is gone or no
        longer knows this worker."""
        if self._stopped is None or self._stopped.is_set() or self._lost_reason is not None:
            return
        self._lost_reason = reason
        if self._info is not None:
            self._begin_rejoin()
        # else: still loading; run() rejoins once the engine is up

    def _begin_rejoin(self) -> None:
        assert self._loop is not None
        self._rejoining = self._loop.create_task(self._rejoin())
        self._rejoining.add_done_callback(self._rejoin_done)

    def _rejoin_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, WorkerExit):
            say(f"omnix worker {self._who()}: {exc}")
            self._server_gone = True
            self.stop(exc.code, str(exc))
        elif exc is not None:
            log.error("rejoining failed: %s: %s", type(exc).__name__, exc)
            self._server_gone = True
            self.stop(EXIT_SERVER_LOST, f"rejoining failed: {type(exc).__name__}: {exc}")

    async def _rejoin(self) -> None:
        """Drop the lost server's requests, then say HELLO to whatever
        server answers at ``connect`` (a restarted one takes its requests
        over from its log), keeping the loaded engine."""
        reason = self._lost_reason
        self._server_gone = True
        self._aborts.drop_all()
        await asyncio.to_thread(self._heartbeats.join, 2.0)  # it returned after reporting
        # A new incarnation: the server's records of the old one are void.
        self.token = secrets.token_hex(8)
        self._next_endpoint()  # a replicated log's standby leads now, if any
        self._new_socket()
        try:
            welcome = await self._join(self.reconnect_for_s, _REJOIN_ATTEMPT_S)
        except WorkerExit as exc:
            if exc.code != EXIT_NO_SERVER:
                raise
            raise WorkerExit(
                EXIT_SERVER_LOST,
                (
                    f"{reason}; no server answered at {', '.join(self.endpoints)} within "
                    f"{self.reconnect_for_s:.0f} s (--reconnect-for); exiting"
                ),
            ) from None
        if welcome.config != self.config:
            raise WorkerExit(
                EXIT_SERVER_LOST,
                (
                    f"the server at {self.connect} runs stage {self.stage!r} with another config than "
                    "the one this worker loaded; exiting, so that a process manager starts it again"
                ),
            )
        self.replica = welcome.replica
        self._lost_reason = self._heartbeats.lost = None
        self._server_gone = False
        assert self._loop is not None and self._ctx is not None
        self._heartbeats.start(self._loop, self._ctx, self.token, welcome)
        self._send_ready()
        say(f"omnix worker {self._who()}: joined {self.connect} again")

    async def _join(self, total_s: float, attempt_s: float | None = None) -> m.Welcome:
        """HELLO until a server answers, for up to ``total_s``: each attempt
        ``attempt_s`` long (the whole time with one endpoint and no
        ``attempt_s``), each to the next of ``endpoints``.  Raises the last
        attempt's ``WorkerExit`` (``EXIT_NO_SERVER``) when none answered."""
        if attempt_s is None:
            attempt_s = total_s if len(self.endpoints) == 1 else _REJOIN_ATTEMPT_S
        deadline = time.monotonic() + total_s
        while True:
            try:
                return await self._handshake(max(0.1, min(attempt_s, deadline - time.monotonic())))
            except WorkerExit as exc:
                if exc.code != EXIT_NO_SERVER or time.monotonic() >= deadline:
                    raise
            self._next_endpoint()
            self._new_socket()

    def _next_endpoint(self) -> None:
        eps = self.endpoints
        self.connect = eps[(eps.index(self.connect) + 1) % len(eps)]
        self._heartbeats.connect = self.connect

    def _new_socket(self) -> None:
        """A fresh work socket for this incarnation's token: nothing queued
        for the old server (outputs, a READY) reaches the next one."""
        assert self._ctx is not None and self._loop is not None
        if self._outbox.inbox is not None:
            self._outbox.inbox.close()
        if self._outbox.sock is not None:
            self._outbox.sock.close(linger=0)
        sock = make_dealer(self._ctx, self.connect, b"w" + self.token.encode())
        inbox = Inbox(
            self._loop,
            sock,
            m.WORKER_BOUND,
            self._routes(),
            routed=False,
            log=log,
            unknown_hint="protocol mismatch?",
        )
        self._outbox.attach(self._loop, sock, inbox)

    # -- receiving ------------------------------------------------------------
    def _routes(self) -> list[Route[Any]]:
        """What each message from the server is handed to (see ``Inbox``)."""
        return [
            Route(m.WORK, list[WorkItem], self.requests.on_work_batch),
            Route(m.ABORT, m.Abort, self._aborts.on_abort),
            Route(m.WELCOME, m.Welcome, self._on_welcome, on_malformed=self._on_bad_welcome),
            Route(m.REFUSED, m.Refused, self._on_refused),
            Route(m.SHUTDOWN, m.Shutdown, self._on_shutdown),
            Route(m.PROFILE, m.Profile, self._profiling.on_profile),
            # Acks answer the heartbeat thread, on its own socket.
            Route(m.HEARTBEAT_ACK, m.HeartbeatAck, ignore),
        ]

    def _on_welcome(self, _: bytes, welcome: m.Welcome) -> None:
        if self._welcome is not None and not self._welcome.done():
            self._welcome.set_result(welcome)

    def _on_bad_welcome(self, exc: msgspec.DecodeError) -> bool:
        if self._welcome is None or self._welcome.done():
            return False
        self._welcome.set_exception(
            WorkerExit(
                EXIT_REFUSED,
                f"cannot read the server's stage config ({exc}); run the same omnix "
                "version on the server and the workers",
            )
        )
        return True

    def _on_refused(self, _: bytes, msg: m.Refused) -> None:
        exc = WorkerExit(EXIT_REFUSED, f"the server refused this worker: {msg.reason}")
        if self._welcome is not None and not self._welcome.done():
            self._welcome.set_exception(exc)
        else:
            self.stop(EXIT_REFUSED, str(exc))

    def _on_shutdown(self, _: bytes, msg: m.Shutdown) -> None:
        self._server_gone = True  # no goodbye needed
        self.stop(EXIT_OK, msg.reason or "the server asked this worker to shut down")
