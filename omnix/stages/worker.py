"""One stage worker process: handshake, engine, per-request tasks, heartbeats.

Owns: ``Worker`` (what runs inside ``omnix worker``): it connects to a
stage runtime, says HELLO, gets its stage's config, loads the engine, says
READY, then runs one asyncio task per request, feeding ``WorkItem`` pieces
into ``engine.generate`` through a queue-backed async iterator and
streaming outputs back in batches.  A heartbeat thread proves the process
alive even while the engine load blocks the loop.  A hand-started worker
whose server stops answering (or no longer knows it: a restarted server)
drops the requests it ran and joins again, keeping its loaded engine, for
up to ``reconnect_for_s``.  Does not own the
protocol's shape (``omnix.transport``) nor any decisions about requests:
it reports what happened, the orchestrator decides.

Per request the worker sends ``Started`` once, outputs, then exactly one of
``Done`` (``finish_reason="aborted"`` when acknowledging an abort) or
``Error`` (the engine raised; the worker lives on).  An abort for a request
it no longer runs is ignored; work for a request it has aborted is dropped
(a bounded memory of aborted ids).

Requests run as plain asyncio tasks, each cancelled once on abort or
shutdown, not in an anyio task group under cancel scopes: an engine's
clean-up on cancellation must get to run (vLLM's ``generate`` awaits its
own abort in ``except CancelledError``, and ``VllmEngine`` closes its
stream in a ``finally``), which a cancel scope, cancelling again at every
await, cuts short; shutdown waits a bounded time for them, where a task
group waits for every child however long; and a task group plus a cancel
scope costs ~40 us more per request than ``create_task`` on a small
machine, paid 32 times over by a burst of 32 admissions.

Exit codes: 0 clean shutdown, 2 refused by the server (a missing or wrong
worker token among the reasons), 3 the engine failed to load, 4 no answer
to HELLO, 5 the server stopped answering heartbeats and no server answered
within ``reconnect_for_s`` (or the parent that spawned this worker died),
128 + the signal when a second SIGINT/SIGTERM cut the shutdown short.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import msgspec
import zmq

from omnix.pipelines.config import StageConfig, engine_kind
from omnix.stages.engine import Engine, EngineDead, ProfilingEngine, load_engine
from omnix.stages.profiler import ProfileError, WorkerProfiler
from omnix.transport import messages as m
from omnix.transport.codec import FrameDecoder, FrameEncoder
from omnix.transport.inbox import Inbox, Route, ignore
from omnix.transport.sockets import make_dealer, recv_parts, send_frames
from omnix.transport.work import EngineInfo, EngineOutput, GenerateRequest, InputPiece, WorkItem

log = logging.getLogger("omnix.worker")

TOKEN_ENV = "OMNIX_WORKER_INCARNATION"  # set by the runtime for the workers it spawns
AUTH_ENV = "OMNIX_WORKER_TOKEN"  # the shared secret a server started with --worker-token requires
PARENT_ENV = "OMNIX_PARENT_PID"  # the spawning runtime's pid: die with it

EXIT_OK = 0
EXIT_REFUSED = 2
EXIT_ENGINE_FAILED = 3
EXIT_NO_SERVER = 4
EXIT_SERVER_LOST = 5

MAX_BATCH = 256  # records per OUTPUTS message before an immediate flush
ABORTED_MEMORY = 4096  # recently aborted request ids remembered to drop late work
_HARD_EXIT_GRACE_S = 5.0  # after asking the loop to stop, exit anyway
# Bound on the engine's close at shutdown: inside the runtime's default grace
# (DEFAULT_SHUTDOWN_GRACE_S, 10 s), with room left for the goodbye.
_ENGINE_CLOSE_S = 8.0
# Rejoining: a fresh socket and HELLO this often until a server answers.
# The server answers a repeated HELLO (same token) with the same WELCOME,
# so an answer racing the next attempt takes no second replica.
_REJOIN_ATTEMPT_S = 5.0


class WorkerExit(Exception):
    """Ends the worker with an exit code and a message for its operator."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Inputs:
    """The async iterator ``engine.generate`` reads a request's pieces from."""

    __slots__ = ("_closed", "_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[InputPiece] = deque()
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None

    def push(self, pieces: tuple[InputPiece, ...], last: bool) -> None:
        self._items.extend(pieces)
        if last:
            self._closed = True
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def __aiter__(self) -> _Inputs:
        return self

    async def __anext__(self) -> InputPiece:
        while not self._items:
            if self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


class _Req:
    __slots__ = (
        "aborted",
        "chunks",
        "done",
        "inputs",
        "last",
        "next_seq",
        "rid",
        "started",
        "task",
    )

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.inputs = _Inputs()
        self.task: asyncio.Task[None] | None = None
        self.chunks = 0
        self.next_seq = 1
        self.started = False
        self.done = False
        self.aborted = False
        self.last: EngineOutput | None = None  # the engine's latest output (finish metadata)


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
        self.connect = connect
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
        self.capacity = 0
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sock: zmq.Socket[bytes] | None = None
        self._inbox: Inbox | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._enc = FrameEncoder()
        self._active: dict[str, _Req] = {}
        self._aborted: OrderedDict[str, None] = OrderedDict()
        self._outbox: list[m.Record] = []
        self._aborting: set[asyncio.Task[None]] = set()  # engine.abort calls in flight
        self._welcome: asyncio.Future[m.Welcome] | None = None
        self._stopped: asyncio.Event | None = None
        self._exit_code = EXIT_OK
        self._exit_reason = ""
        self._hb_stop = threading.Event()
        # Written on stop: the heartbeat thread polls it beside its socket, so
        # it sleeps whole intervals (a thread waking often steals the GIL and
        # the core from the loop, which costs the hop's p99) yet stops at once.
        self._hb_wake_r, self._hb_wake_w = os.pipe()
        self._hb_thread: threading.Thread | None = None
        self._server_gone = False
        self._info: EngineInfo | None = None
        self._lost_reason: str | None = None  # the server was lost; set until rejoined
        # The same, written by the heartbeat thread at once: a load that
        # blocks the loop ends before the thread's callback can run.
        self._hb_lost: str | None = None
        self._rejoining: asyncio.Task[None] | None = None
        # Set when the server profiles (omnix serve --profile-dir).
        self._profiler: WorkerProfiler | None = None
        self._profiling: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------
    async def run(self) -> int:
        loop = self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self._ctx = zmq.Context()
        self._sock = make_dealer(self._ctx, self.connect, b"w" + self.token.encode())
        self._inbox = Inbox(
            loop,
            self._sock,
            m.WORKER_BOUND,
            self._routes(),
            routed=False,
            log=log,
            unknown_hint="protocol mismatch?",
        )
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError):  # not the main thread
                pass
        try:
            welcome = await self._handshake(self.hello_timeout_s)
            self.replica = welcome.replica
            self.config = welcome.config
            if welcome.profile_dir:
                self._profiler = WorkerProfiler(Path(welcome.profile_dir))
            self._start_heartbeats(welcome)
            await self._load_engine()
            if self._lost_reason is None and self._hb_lost is None:
                self._send_ready()
            else:  # the server went away while the engine loaded
                self._lost_reason = self._lost_reason or self._hb_lost
                self._begin_rejoin()
            await self._stopped.wait()
            return self._exit_code
        except WorkerExit as exc:
            _say(f"omnix worker {self.stage}/{self.replica}: {exc}")
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
            _say(f"omnix worker {self.stage}/{self.replica}: {name} again: exiting now")
            _exit_now(128 + sig)
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
        self._send(m.HELLO, hello)
        try:
            return await asyncio.wait_for(self._welcome, timeout)
        except TimeoutError:
            raise WorkerExit(
                EXIT_NO_SERVER,
                f"no answer from a stage runtime at {self.connect} within "
                f"{timeout:.0f} s; check that the server is running and that "
                "the address (and port) is the one it printed",
            ) from None

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
            _say(f"omnix worker {self.stage}/{self.replica}: {exc}")
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
        self._drop_requests()
        if self._hb_thread is not None:
            await asyncio.to_thread(self._hb_thread.join, 2.0)  # it returned after reporting
        self.token = secrets.token_hex(
            8
        )  # a new incarnation: the server's records of the old one are void
        deadline = time.monotonic() + self.reconnect_for_s
        while True:
            self._new_socket()
            try:
                welcome = await self._handshake(
                    max(0.1, min(_REJOIN_ATTEMPT_S, deadline - time.monotonic()))
                )
                break
            except WorkerExit as exc:
                if exc.code != EXIT_NO_SERVER:
                    raise
                if time.monotonic() >= deadline:
                    raise WorkerExit(
                        EXIT_SERVER_LOST,
                        (
                            f"{reason}; no server answered at {self.connect} within "
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
        self._lost_reason = self._hb_lost = None
        self._server_gone = False
        self._start_heartbeats(welcome)
        self._send_ready()
        _say(f"omnix worker {self.stage}/{self.replica}: joined {self.connect} again")

    def _drop_requests(self) -> None:
        """Forget every request: the server that sent them is gone, and a
        restarted one continues them elsewhere from its log."""
        for rid, req in list(self._active.items()):
            req.done = req.aborted = True  # its task's end reports nothing
            self._aborted[rid] = None
            if req.task is not None and not req.task.done():
                req.task.cancel()
            if self.engine is not None:
                assert self._loop is not None
                task = self._loop.create_task(self._engine_abort(rid))
                self._aborting.add(task)
                task.add_done_callback(self._aborting.discard)
        self._active.clear()
        self._outbox.clear()

    def _new_socket(self) -> None:
        """A fresh work socket for this incarnation's token: nothing queued
        for the old server (outputs, a READY) reaches the next one."""
        assert self._ctx is not None and self._loop is not None
        if self._inbox is not None:
            self._inbox.close()
        if self._sock is not None:
            self._sock.close(linger=0)
        self._sock = make_dealer(self._ctx, self.connect, b"w" + self.token.encode())
        self._inbox = Inbox(
            self._loop,
            self._sock,
            m.WORKER_BOUND,
            self._routes(),
            routed=False,
            log=log,
            unknown_hint="protocol mismatch?",
        )

    async def _load_engine(self) -> None:
        cfg = self.config
        assert cfg is not None
        kind = engine_kind(cfg.engine)
        try:
            engine = load_engine(kind, cfg.engine)
            self.engine = engine
            if self._profiler is not None:
                await asyncio.to_thread(self._profiler.prepare)
                if isinstance(engine, ProfilingEngine):
                    engine.prepare_profiling(self._profiler.root)
            # object, not EngineInfo: the class was imported by name, so
            # check what it really returned.
            info: object = await engine.start()
            if not isinstance(info, EngineInfo) or info.capacity < 1:
                raise TypeError(
                    f"engine {kind!r} start() returned {info!r}, not an EngineInfo with capacity >= 1"
                )
        except Exception as exc:
            log.exception("engine %r for stage %r failed to start", kind, self.stage)
            self._send(m.START_FAILED, m.StartFailed(self.token, f"{type(exc).__name__}: {exc}"))
            raise WorkerExit(
                EXIT_ENGINE_FAILED,
                f"engine {kind!r} for stage {self.stage!r} failed to start: {type(exc).__name__}: {exc}",
            ) from exc
        _apply_thread_limits()
        freeze_heap()
        self.capacity = info.capacity
        self._info = info

    def _send_ready(self) -> None:
        info = self._info
        assert info is not None
        self._send(
            m.READY, m.Ready(self.token, info.engine, info.capacity, info.device, info.model)
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
        tasks = [r.task for r in self._active.values() if r.task is not None and not r.task.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        self._flush()
        if self.engine is not None:
            try:
                await asyncio.wait_for(self.engine.close(), _ENGINE_CLOSE_S)
            except Exception:
                log.exception("engine close failed")
        if (
            self._sock is not None
            and not self._server_gone
            and self._welcome is not None
            and self._welcome.done()
        ):
            try:
                self._send(m.GOODBYE, m.Goodbye(self.token, self._exit_reason or "exiting"))
            except zmq.ZMQError:
                pass
        self._hb_stop.set()
        try:
            os.write(self._hb_wake_w, b"x")
        except OSError:
            pass
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=2.0)
        for fd in (self._hb_wake_r, self._hb_wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._inbox is not None:
            self._inbox.close()
        if self._sock is not None:
            self._sock.close(linger=500)  # let the last outputs and the goodbye out
        if self._ctx is not None:
            self._ctx.term()

    # -- heartbeats (own thread, own socket) -----------------------------------
    def _start_heartbeats(self, welcome: m.Welcome) -> None:
        self._hb_thread = threading.Thread(
            target=self._heartbeat_main,
            args=(welcome.heartbeat_interval_s, welcome.server_lost_after_s),
            name="omnix-heartbeat",
            daemon=True,
        )
        self._hb_thread.start()

    def _heartbeat_main(self, interval: float, server_lost_after: float) -> None:
        assert self._ctx is not None
        sock = make_dealer(self._ctx, self.connect, b"h" + self.token.encode(), hwm=4, linger_ms=0)
        enc = FrameEncoder()
        ack_dec = m.decoders(m.WORKER_BOUND)
        last_ack = time.monotonic()
        try:
            self._heartbeat_loop(sock, enc, ack_dec, interval, server_lost_after, last_ack)
        except Exception as exc:  # a dead heartbeat thread would make a ghost worker
            self._fatal(EXIT_SERVER_LOST, f"heartbeat thread failed: {type(exc).__name__}: {exc}")
        finally:
            sock.close(0)

    def _heartbeat_loop(
        self,
        sock: zmq.Socket[bytes],
        enc: FrameEncoder,
        ack_dec: dict[bytes, FrameDecoder[Any]],
        interval: float,
        server_lost_after: float,
        last_ack: float,
    ) -> None:
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._hb_wake_r, zmq.POLLIN)
        while not self._hb_stop.is_set():
            try:
                sock.send_multipart(
                    enc.encode(m.HEARTBEAT, m.Heartbeat(self.token, len(self._active))),
                    flags=zmq.NOBLOCK,
                )
            except zmq.Again:
                pass
            deadline = time.monotonic() + interval
            while (left := deadline - time.monotonic()) > 0 and not self._hb_stop.is_set():
                ready = dict(poller.poll(int(left * 1000) + 1))
                if sock not in ready:
                    continue
                mtype, body, _ = recv_parts(sock)
                if mtype == m.HEARTBEAT_ACK:
                    last_ack = time.monotonic()
                elif mtype == m.REFUSED:
                    reason = ack_dec[m.REFUSED].decode(body).reason
                    self._server_lost(f"the server disowned this worker: {reason}")
                    return
            if self.parent_pid and os.getppid() != self.parent_pid:
                self._fatal(
                    EXIT_SERVER_LOST,
                    f"the runtime that spawned this worker (pid {self.parent_pid}) is gone",
                )
                return
            silent = time.monotonic() - last_ack
            # A spawned worker dies with its parent (checked above); only
            # a hand-started one needs the server's silence to give up, so
            # a server loop blocked for a while does not kill its children.
            if not self.parent_pid and silent > server_lost_after:
                self._server_lost(
                    f"the server at {self.connect} has not answered heartbeats for {silent:.1f} s"
                )
                return

    def _server_lost(self, reason: str) -> None:
        """From the heartbeat thread (which returns after this): rejoin, or
        exit when this worker does not (spawned, or --reconnect-for 0)."""
        if self.parent_pid:
            self._fatal(EXIT_SERVER_LOST, reason)  # its runtime starts another if it still runs
            return
        if self.reconnect_for_s <= 0:
            self._fatal(
                EXIT_SERVER_LOST, f"{reason}; exiting so a process manager can restart this worker"
            )
            return
        _say(
            f"omnix worker {self.stage}/{self.replica}: {reason}; trying to join a server at "
            f"{self.connect} for up to {self.reconnect_for_s:.0f} s"
        )
        self._hb_lost = reason
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._on_server_lost, reason)
            except RuntimeError:
                pass

    def _fatal(self, code: int, reason: str) -> None:
        """From the heartbeat thread: stop the worker; hard-exit if the loop is stuck."""
        _say(f"omnix worker {self.stage}/{self.replica}: {reason}")
        self._server_gone = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self.stop, code, reason)
            except RuntimeError:
                pass
        if not self._hb_stop.wait(_HARD_EXIT_GRACE_S):
            _exit_now(code)

    # -- receiving ------------------------------------------------------------
    def _routes(self) -> list[Route[Any]]:
        """What each message from the server is handed to (see ``Inbox``)."""
        return [
            Route(m.WORK, list[WorkItem], self._on_work_batch),
            Route(m.ABORT, m.Abort, self._on_abort),
            Route(m.WELCOME, m.Welcome, self._on_welcome, on_malformed=self._on_bad_welcome),
            Route(m.REFUSED, m.Refused, self._on_refused),
            Route(m.SHUTDOWN, m.Shutdown, self._on_shutdown),
            Route(m.PROFILE, m.Profile, self._on_profile),
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

    def _on_profile(self, _: bytes, msg: m.Profile) -> None:
        if self._profiling is not None and not self._profiling.done():
            self._send(
                m.PROFILED,
                m.Profiled(
                    self.token,
                    msg.action,
                    False,
                    "the previous start or stop is still in progress; retry",
                ),
            )
            return
        assert self._loop is not None
        self._profiling = self._loop.create_task(self._profile(msg.action))

    async def _profile(self, action: m.ProfileAction) -> None:
        """Start or stop profiling: the engine's own profiler where it has
        one (it covers this process too: two torch profilers in one process
        do not mix), else torch's around this process."""
        prof, engine = self._profiler, self.engine
        try:
            if prof is None:
                raise ProfileError(
                    "the server did not enable profiling (omnix serve --profile-dir DIR)"
                )
            if isinstance(engine, ProfilingEngine):
                await (engine.start_profile() if action == "start" else engine.stop_profile())
                detail = str(prof.root)
            elif action == "start":
                prof.start()
                detail = str(prof.root)
            else:
                ended = prof.stop()
                detail = str(await asyncio.to_thread(prof.write, ended))
            ok = True
        except Exception as exc:
            log.warning(
                "worker %s/%d: profile %s failed: %s", self.stage, self.replica, action, exc
            )
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        if self._sock is not None:
            self._send(m.PROFILED, m.Profiled(self.token, action, ok, detail))

    def _on_work_batch(self, _: bytes, items: list[WorkItem]) -> None:
        for item in items:
            self._on_work(item)

    def _on_work(self, item: WorkItem) -> None:
        rid = item.request_id
        req = self._active.get(rid)
        if item.seq == 0:
            if self._stopped is not None and self._stopped.is_set():
                log.warning("request %s arrived while this worker is stopping; dropped", rid)
                return
            if req is not None:
                log.error("request %s: a second seq 0 while it runs; dropped", rid)
                return
            if rid in self._aborted:
                log.info("request %s was aborted; dropping its work", rid)
                return
            if self.engine is None:
                self._record(m.Error(rid, "worker received work before its engine was ready"))
                return
            if len(self._active) >= self.capacity:
                log.error("request %s: over capacity (%d running); refused", rid, len(self._active))
                self._record(
                    m.Error(
                        rid,
                        f"worker {self.stage}/{self.replica} is at its capacity of {self.capacity} "
                        "requests; the runtime should not have sent more (credit accounting bug)",
                    )
                )
                return
            req = _Req(rid)
            if item.resume is not None:
                # A migrated execution: its outputs continue the stage's
                # chunk indices where the lost replica's stopped.
                req.chunks = item.resume.chunks
            req.inputs.push(item.pieces, item.last)
            self._active[rid] = req
            assert self._loop is not None
            req.task = self._loop.create_task(self._execute(req, item))
            req.task.add_done_callback(functools.partial(self._on_task_done, req))
            return
        if req is None or req.aborted:
            if rid not in self._aborted:
                log.debug(
                    "request %s: piece %d for a request not running here; dropped", rid, item.seq
                )
            return
        if item.seq != req.next_seq:
            log.error(
                "request %s: piece seq %d, expected %d (pieces out of order)",
                rid,
                item.seq,
                req.next_seq,
            )
        req.next_seq = item.seq + 1
        req.inputs.push(item.pieces, item.last)

    def _on_abort(self, _: bytes, msg: m.Abort) -> None:
        rid = msg.request_id
        self._aborted[rid] = None
        if len(self._aborted) > ABORTED_MEMORY:
            self._aborted.popitem(last=False)
        req = self._active.get(rid)
        if req is None or req.done or req.aborted:
            return  # not running (any more): ignored, no reply
        req.aborted = True
        assert self._loop is not None and self.engine is not None
        # Tell the engine (it frees its own resources: vLLM's KV blocks) and
        # stop consuming its outputs now; the task's end acknowledges.
        task = self._loop.create_task(self._engine_abort(rid))
        # The loop holds tasks weakly: keep this one until it ends.
        self._aborting.add(task)
        task.add_done_callback(self._aborting.discard)
        if req.task is not None:
            req.task.cancel()

    async def _engine_abort(self, rid: str) -> None:
        try:
            assert self.engine is not None
            await self.engine.abort(rid)
        except Exception:
            log.exception("engine.abort(%r) raised", rid)

    # -- running a request -------------------------------------------------------
    async def _execute(self, req: _Req, item: WorkItem) -> None:
        rid = req.rid
        req.started = True
        record = self._record
        record(m.Started(rid))
        engine = self.engine
        assert engine is not None
        gen = engine.generate(
            GenerateRequest(rid, item.stage, item.params, item.seed, item.resume), req.inputs
        )
        try:
            async for out in gen:
                req.last = out
                if out.text or out.token_ids or out.data or out.array is not None:
                    record(
                        m.Output(
                            rid,
                            req.chunks,
                            out.modality,
                            out.text,
                            out.token_ids,
                            out.array,
                            out.data,
                            out.media_type,
                            out.piece,
                            out.logprobs,
                        )
                    )
                    req.chunks += 1
                elif out.total > 0:
                    record(m.ProgressRec(rid, out.step, out.total))
                # else: payload-free finish metadata, not a chunk
        except asyncio.CancelledError:
            raise  # an abort (acknowledged in _on_task_done) or shutdown
        except EngineDead as exc:
            # Not this request's failure: the worker is useless now.  Its
            # exit makes the runtime record the replica lost (its requests
            # continue elsewhere) and start a new one.
            self._finished(req)
            log.error("stage %s's engine died: %s", self.stage, exc)
            self.stop(EXIT_ENGINE_FAILED, f"its engine died: {exc}")
            return
        except Exception as exc:
            self._finished(req)
            if req.aborted:  # some engines raise when aborted: that is the ack
                record(self._done(req, "aborted"))
                return
            log.warning(
                "request %s failed on stage %s: %s: %s", rid, self.stage, type(exc).__name__, exc
            )
            record(m.Error(rid, f"{type(exc).__name__}: {exc}"))
            return
        self._finished(req)
        last = req.last
        reason = (
            "aborted"
            if req.aborted
            else ((last.finish_reason if last is not None else "") or "stop")
        )
        record(self._done(req, reason))
        # The end of a request is latency-critical (the next stage or the
        # client waits on it): send now rather than one loop turn later.
        self._flush()

    def _finished(self, req: _Req) -> None:
        """The request is over here: free its slot *before* its Done or Error
        is recorded.  The server returns the credit on that record and may
        send the next request at once; the task's done callback (which also
        pops) runs a loop turn later, and a new request read in between
        must not find this one still counted (it would be refused as over
        capacity)."""
        req.done = True
        self._active.pop(req.rid, None)

    @staticmethod
    def _done(req: _Req, reason: str) -> m.Done:
        last = req.last
        if last is None:  # the engine yielded nothing
            return m.Done(req.rid, req.chunks, reason)
        return m.Done(req.rid, req.chunks, reason, last.prompt_tokens, last.output_tokens)

    def _on_task_done(self, req: _Req, task: asyncio.Task[None]) -> None:
        self._active.pop(req.rid, None)
        if req.done:
            return
        req.done = True
        if task.cancelled():
            if req.aborted:
                if not req.started:
                    self._record(m.Started(req.rid))
                self._record(self._done(req, "aborted"))
            elif self._stopped is None or not self._stopped.is_set():
                # Nobody asked: the engine raised CancelledError by itself.
                # Report it, or the request would wait for its stage forever.
                if not req.started:
                    self._record(m.Started(req.rid))
                self._record(
                    m.Error(req.rid, "the engine's generate() was cancelled without an abort")
                )
            # else: cancelled by this worker's shutdown; the server is going away
            return
        exc = task.exception()
        self._record(m.Error(req.rid, f"worker error: {type(exc).__name__}: {exc}"))

    # -- sending ------------------------------------------------------------------
    def _record(self, rec: m.Record) -> None:
        box = self._outbox
        box.append(rec)
        if len(box) == 1:
            # Everything recorded in this loop iteration leaves in one message.
            assert self._loop is not None
            self._loop.call_soon(self._flush)
        elif len(box) >= MAX_BATCH:
            self._flush()

    def _flush(self) -> None:
        if not self._outbox or self._sock is None:
            return
        records, self._outbox = self._outbox, []
        try:
            self._send(m.OUTPUTS, records)
        except zmq.ZMQError as exc:
            log.error("could not send %d output records: %s", len(records), exc)

    def _send(self, mtype: bytes, msg: object) -> None:
        sock = self._sock
        assert sock is not None
        send_frames(sock, self._enc.encode(mtype, msg))
        if self._inbox is not None:
            self._inbox.kick()


def _exit_now(code: int) -> None:
    """Exit without cleanup, taking the engine's processes along."""
    if os.getsid(0) == os.getpid():
        # We lead our own session (spawned by a runtime): take any engine
        # subprocesses down with us.
        os.killpg(os.getpgrp(), signal.SIGKILL)
    else:  # started by hand, in somebody's process group: only our children
        _kill_children()
    os._exit(code)


def exit_without_finalizing(code: int) -> None:
    """Exit with ``code`` once the worker has torn everything down (call it
    after ``Worker.run`` returned), skipping the interpreter's finalization.

    The worker froze its heap after the engine load (``freeze_heap``):
    finalizing would leave those objects alive, and triton's nanobind
    bindings (imported by vLLM) then print dozens of "leaked" lines on
    every clean stop; unfreezing first makes the exit walk and free the
    whole torch/vLLM heap instead (~1.3 s more per worker on 2 cores).
    Nothing is left to finalize by then: the engine is closed (its
    processes joined), the sockets and ZMQ context are closed.  An engine
    process still alive (its close ran out of time) would have been
    terminated by finalization (vLLM's engine core is a daemon process);
    it is killed here instead of being left orphaned."""
    _kill_children()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _kill_children() -> None:
    """Kill this process's multiprocessing children (an engine's processes)."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()


def _say(text: str) -> None:
    """Tell the operator, even when nobody listens: after the server died our
    stderr is a pipe without a reader, and a BrokenPipeError here must not
    stop the worker from exiting."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def freeze_heap() -> None:
    """Move everything the engine's load created (torch, transformers,
    vLLM: millions of objects) out of the garbage collector's reach, as
    vLLM's own server does after start-up.  Serving allocates many short-
    lived objects per token; every full collection would otherwise walk the
    whole static heap (~0.5 s on a small CPU machine) in the middle of
    somebody's stream."""
    gc.collect()
    gc.freeze()


def _apply_thread_limits() -> None:
    """Cap torch's intra-op threads to OMP_NUM_THREADS (the runtime sets 1):
    on small machines a streaming loop and torch's pool fight for cores."""
    torch = sys.modules.get("torch")
    n = os.environ.get("OMP_NUM_THREADS")
    if torch is not None and n and n.isdigit() and int(n) > 0:
        try:
            torch.set_num_threads(int(n))
        except Exception:
            pass
