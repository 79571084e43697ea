"""A stage worker's heartbeats: a thread of its own, a socket of its own.

Owns: ``Heartbeats``.  From the WELCOME on, a thread sends a heartbeat
every interval (with how many requests run) on its own socket, so the
worker proves itself alive even while an engine load blocks the event
loop.  It also watches the other side: a REFUSED answer (the server no
longer knows this worker) or, for a hand-started worker, no answer for the
server's ``server_lost_after_s`` means the server is lost; a spawned
worker whose parent died, or one that does not rejoin, is stopped (and
exits hard if its loop does not stop within a grace).  It sleeps whole
intervals yet stops at once: it polls a pipe written on close beside its
socket (a thread waking often steals the GIL and the core from the loop,
which costs the hop's p99).

Does not own rejoining (``worker.py``) nor anything the loop does: it
reaches the loop only through ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from omnix.stages.worker_process import EXIT_SERVER_LOST, exit_now, say
from omnix.transport import messages as m
from omnix.transport.codec import FrameDecoder, FrameEncoder
from omnix.transport.sockets import make_dealer, recv_parts

_HARD_EXIT_GRACE_S = 5.0  # after asking the loop to stop, exit anyway


class Heartbeats:
    """``lost``: why the server was lost, written by the thread at once (a
    load that blocks the loop ends before the thread's callback can run);
    ``fatal``: the thread stopped the worker (no goodbye is owed)."""

    def __init__(
        self,
        *,
        connect: str,
        parent_pid: int,
        reconnect_for_s: float,
        who: Callable[[], str],
        running: Callable[[], int],
        on_lost: Callable[[str], None],
        stop: Callable[[int, str], None],
    ) -> None:
        self.connect = connect
        self.parent_pid = parent_pid
        self.reconnect_for_s = reconnect_for_s
        self._who = who
        self._running = running
        self._on_lost = on_lost
        self._stop = stop
        self.lost: str | None = None
        self.fatal = False
        self._stopping = threading.Event()
        # Written on close: the thread polls it beside its socket.
        self._wake_r, self._wake_w = os.pipe()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(
        self,
        loop: asyncio.AbstractEventLoop,
        ctx: zmq.Context[zmq.Socket[bytes]],
        token: str,
        welcome: m.Welcome,
    ) -> None:
        """Start a thread for the incarnation ``token`` (a rejoin starts a new one)."""
        self._loop = loop
        self._thread = threading.Thread(
            target=self._main,
            args=(ctx, token, welcome.heartbeat_interval_s, welcome.server_lost_after_s),
            name="omnix-heartbeat",
            daemon=True,
        )
        self._thread.start()

    def join(self, timeout: float) -> None:
        """Wait for the thread (it returns after reporting a lost server)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def close(self) -> None:
        self._stopping.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        self.join(2.0)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _main(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        token: str,
        interval: float,
        server_lost_after: float,
    ) -> None:
        sock = make_dealer(ctx, self.connect, b"h" + token.encode(), hwm=4, linger_ms=0)
        enc = FrameEncoder()
        ack_dec = m.decoders(m.WORKER_BOUND)
        try:
            self._loop_until_lost(sock, enc, ack_dec, token, interval, server_lost_after)
        except Exception as exc:  # a dead heartbeat thread would make a ghost worker
            self._fatal(EXIT_SERVER_LOST, f"heartbeat thread failed: {type(exc).__name__}: {exc}")
        finally:
            sock.close(0)

    def _loop_until_lost(
        self,
        sock: zmq.Socket[bytes],
        enc: FrameEncoder,
        ack_dec: dict[bytes, FrameDecoder[Any]],
        token: str,
        interval: float,
        server_lost_after: float,
    ) -> None:
        last_ack = time.monotonic()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while not self._stopping.is_set():
            try:
                sock.send_multipart(
                    enc.encode(m.HEARTBEAT, m.Heartbeat(token, self._running())),
                    flags=zmq.NOBLOCK,
                )
            except zmq.Again:
                pass
            deadline = time.monotonic() + interval
            while (left := deadline - time.monotonic()) > 0 and not self._stopping.is_set():
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
        """In the thread (which returns after this): rejoin, or exit when
        this worker does not (spawned, or --reconnect-for 0)."""
        if self.parent_pid:
            self._fatal(EXIT_SERVER_LOST, reason)  # its runtime starts another if it still runs
            return
        if self.reconnect_for_s <= 0:
            self._fatal(
                EXIT_SERVER_LOST, f"{reason}; exiting so a process manager can restart this worker"
            )
            return
        say(
            f"omnix worker {self._who()}: {reason}; trying to join a server at "
            f"{self.connect} for up to {self.reconnect_for_s:.0f} s"
        )
        self.lost = reason
        self._call_soon(self._on_lost, reason)

    def _fatal(self, code: int, reason: str) -> None:
        """In the thread: stop the worker; hard-exit if the loop is stuck."""
        say(f"omnix worker {self._who()}: {reason}")
        self.fatal = True
        self._call_soon(self._stop, code, reason)
        if not self._stopping.wait(_HARD_EXIT_GRACE_S):
            exit_now(code)

    def _call_soon(self, fn: Callable[..., None], *args: object) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:
                pass
