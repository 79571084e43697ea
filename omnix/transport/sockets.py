"""ZMQ sockets for the stage protocol: endpoints, options, receiving, loop pumping.

Owns: the socket options (and why), default endpoints, reading one message
as ``(identity, type, body, array_buffers)`` and ``LoopReader``, which
drives a plain (non-asyncio) ZMQ socket from an asyncio loop.  Does not own
decoding and dispatching what is read (``inbox.py``) nor what messages mean.

Socket layout (one endpoint, so ``omnix worker --connect ADDR`` is all a
worker needs): the server binds a ROUTER; each worker connects a DEALER for
work, control and outputs (used only on the worker's event loop thread) and
a second DEALER for heartbeats (used only by its heartbeat thread: ZMQ
sockets are not thread-safe, and heartbeats must flow while the engine
loads with the loop blocked).

High-water marks: ``0`` (unlimited) on the ROUTER and the work DEALER, as
vLLM does.  A ROUTER at its HWM silently *drops* messages, which would lose
a work item or an abort and hang a request with no error; a DEALER at its
HWM *blocks* (or fails with EAGAIN), which would stall the event loop.
Memory is bounded by the protocol instead: the server never has more than
``capacity`` requests in flight per worker (credits), and the orchestrator
bounds the pieces per request.  Outputs are bounded by the engines' pace;
the server drains them as they come (the event log is the buffer).  The
heartbeat DEALER has a small HWM and sends with NOBLOCK: a stale heartbeat
is worthless, so dropping one beats queueing it.

The ROUTER sets ``ROUTER_MANDATORY`` so a send to a worker whose connection
is gone raises instead of vanishing; the runtime then declares it lost.
Workers set their routing id from their token, so a TCP reconnect keeps
the identity; ``ROUTER_HANDOVER`` lets a new connection under a known
routing id replace the old one.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import zmq

MAX_DRAIN = 256  # messages read per loop callback before yielding to other work


def default_ipc_endpoint() -> tuple[str, str]:
    """An ``ipc://`` endpoint in a fresh private temp dir; returns (endpoint, dir).

    The dir is named for this process (``omnix-PID-*``), and the dirs of
    processes that no longer run (killed with SIGKILL, so they could not
    remove theirs) are removed first."""
    remove_stale_endpoint_dirs()
    d = tempfile.mkdtemp(prefix=f"omnix-{os.getpid()}-")
    return f"ipc://{d}/stages.sock", d


def remove_stale_endpoint_dirs(root: str | None = None) -> list[str]:
    """Remove this user's ``omnix-PID-*`` endpoint dirs whose process is
    gone; returns the dirs removed."""
    removed: list[str] = []
    base = Path(root or tempfile.gettempdir())
    for d in base.glob("omnix-*-*"):
        pid = d.name.split("-")[1]
        if not pid.isdigit() or _running(int(pid)):
            continue
        try:
            if not d.is_dir() or d.stat().st_uid != os.getuid():
                continue
            # Only what an endpoint dir holds: its sockets.
            if any(not f.name.startswith("stages.sock") for f in d.iterdir()):
                continue
        except OSError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(str(d))
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_endpoint_dir(d: str | None) -> None:
    if d:
        shutil.rmtree(d, ignore_errors=True)


def check_endpoints(text: str) -> str:
    """``ENDPOINT[,ENDPOINT...]`` when each is one ``check_endpoint`` takes
    (a worker given every server of a replicated log)."""
    parts = [p.strip() for p in text.split(",")]
    for part in parts:
        check_endpoint(part)
    return ",".join(parts)


def check_endpoint(endpoint: str) -> str:
    """``endpoint`` when ZMQ can use it; else ``ValueError`` saying what is
    wrong with it in one line (command lines check ``--connect`` with it
    as they parse)."""
    if not endpoint.startswith(("ipc://", "tcp://")):
        raise ValueError(
            f"endpoint {endpoint!r} is neither ipc://PATH (one host) nor tcp://HOST:PORT "
            "(across hosts)"
        )
    if endpoint.startswith("ipc://"):
        if len(endpoint) == 6:
            raise ValueError(f"endpoint {endpoint!r} names no path: give ipc://PATH")
        if len(endpoint) - 6 > 100:
            raise ValueError(
                f"ipc path {endpoint[6:]!r} is {len(endpoint) - 6} bytes; Unix sockets allow "
                "about 107: use a shorter path (e.g. under /tmp)"
            )
        return endpoint
    host, colon, port = endpoint[6:].rpartition(":")
    # ZMQ's own forms: a port number, or * for any free one when binding.
    if not colon or not host.strip("[]") or not (port == "*" or port.isdigit()):
        raise ValueError(
            f"endpoint {endpoint!r} needs a host and a port: give tcp://HOST:PORT, "
            "e.g. tcp://127.0.0.1:5555"
        )
    if port.isdigit() and int(port) > 65535:
        raise ValueError(f"endpoint {endpoint!r}: port {port} is out of range (0 to 65535)")
    return endpoint


def make_router(
    ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str
) -> tuple[zmq.Socket[bytes], str]:
    """Bind the server's ROUTER; returns it and the bound endpoint (tcp port 0 resolved)."""
    check_endpoint(endpoint)
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    # A worker that reconnects under its routing id (a new socket for a
    # repeated HELLO) takes it over, instead of being dropped while the
    # server still holds its old, dying connection.
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    sock.setsockopt(zmq.LINGER, 0)
    if endpoint.startswith("ipc://"):
        os.makedirs(os.path.dirname(endpoint[6:]) or ".", exist_ok=True)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        sock.close(0)
        raise OSError(
            f"cannot bind the stage runtime to {endpoint}: {exc}; pick a free port or path"
        ) from exc
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


def make_dealer(
    ctx: zmq.Context[zmq.Socket[bytes]],
    endpoint: str,
    routing_id: bytes,
    *,
    hwm: int = 0,
    linger_ms: int = 1000,
) -> zmq.Socket[bytes]:
    check_endpoint(endpoint)
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.ROUTING_ID, routing_id)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.LINGER, linger_ms)
    # Reconnect quickly after a server restart or a network blip.
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
    sock.connect(endpoint)
    return sock


_EVENTS = int(zmq.EVENTS)  # plain ints: pyzmq enums cost a constructor per operation
_POLLIN = int(zmq.POLLIN)
_RCVMORE = int(zmq.RCVMORE)


def readable(sock: zmq.Socket[bytes]) -> bool:
    """Whether a message waits.  Also processes ZMQ's pending commands,
    which re-arms the socket's FD (a bare ``recv`` does that only now and
    then, leaving the FD readable and the loop waking for nothing)."""
    # EVENTS is an int option; pyzmq types every option's value as int | bytes.
    return bool(sock.getsockopt(_EVENTS) & _POLLIN)  # type: ignore[operator]


_SNDMORE = int(zmq.SNDMORE)


def send_frames(sock: zmq.Socket[bytes], frames: list[bytes | memoryview]) -> None:
    """Send one multipart message.  Small frames (bytes) are copied, which
    is cheapest; array buffers (memoryviews from ``FrameEncoder``) go
    zero-copy.  ~2x cheaper than ``send_multipart`` (no enum arithmetic
    per frame)."""
    send = sock.send
    last = len(frames) - 1
    for i, f in enumerate(frames):
        flags = _SNDMORE if i < last else 0
        if type(f) is memoryview:
            send(f, flags, copy=False)
        else:
            send(f, flags)


def recv_parts(sock: zmq.Socket[bytes]) -> tuple[bytes, bytes, list[memoryview]]:
    """Read the rest of a message after its identity: (type, body, arrays).

    Call when ``readable``.  Small frames are received as bytes (cheapest
    for small messages); array frames as zero-copy ``zmq.Frame`` buffers.
    """
    mtype = sock.recv(zmq.NOBLOCK)
    body = sock.recv() if sock.getsockopt(_RCVMORE) else b""
    aux: list[memoryview] = []
    while sock.getsockopt(_RCVMORE):
        aux.append(sock.recv(copy=False).buffer)
    return mtype, body, aux


class LoopReader:
    """Call ``on_readable()`` on the loop whenever ``sock`` may hold messages.

    A ZMQ socket's FD is edge-triggered and only says "state may have
    changed": the handler must read while ``readable(sock)``.  A send (or any
    ``getsockopt(EVENTS)``) can consume the edge while messages wait, so the
    owner calls ``kick()`` after sending.  ``on_readable`` may stop early
    (after ``MAX_DRAIN`` messages) and call ``reschedule()``.
    """

    __slots__ = ("_fd", "_loop", "_on_readable", "_pending", "_sock")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: zmq.Socket[bytes],
        on_readable: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._on_readable = on_readable
        self._pending = False
        fd = sock.getsockopt(zmq.FD)
        assert isinstance(fd, int)
        self._fd = fd
        loop.add_reader(self._fd, self._fire)
        # ZMQ signals the FD only when a pipe goes from "read found it empty"
        # to non-empty: until one read attempt is made, arrivals are silent.
        self.reschedule()

    def _fire(self) -> None:
        self._pending = False
        self._on_readable()

    def reschedule(self) -> None:
        if not self._pending:
            self._pending = True
            self._loop.call_soon(self._fire)

    def kick(self) -> None:
        # readable() inlined, as kick runs after every send; EVENTS is an
        # int option (see readable()).
        if not self._pending and self._sock.getsockopt(_EVENTS) & _POLLIN:  # type: ignore[operator]
            self.reschedule()

    def close(self) -> None:
        try:
            self._loop.remove_reader(self._fd)
        except (ValueError, OSError, RuntimeError):
            pass
