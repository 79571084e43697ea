"""Receiving on the event loop: every waiting message read, decoded and handed on.

Owns: ``Inbox``, the one drain-and-decode loop both ends of the stage
protocol run on their main socket (the runtime's ROUTER, a worker's work
DEALER), and ``Route``, which ties a message type to the Struct its body
decodes to and the handler that gets it.  Does not own the message
vocabulary (``messages.py``), framing (``codec.py``), socket setup and
loop wake-ups (``sockets.py``) nor what a handler does with a message.

One callback reads at most ``MAX_DRAIN`` messages, then yields to the loop
and continues on a later turn, so a flood of outputs cannot starve timers
and other callbacks.  A message of a type the protocol does not list, or a
body that does not decode, is logged and skipped: one bad message from a
peer never stops the reader.  A handler may close the inbox (a shutdown
triggered by what it emitted); nothing more is read after that.

The routes are checked against the protocol's table when the inbox is
built: every type the protocol lists has exactly one route, decoding to
the type the table names, so a message type added to the protocol without
a handler fails at construction rather than on the wire.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import msgspec
import zmq

from omnix.transport.codec import Buffer, FrameDecoder
from omnix.transport.sockets import MAX_DRAIN, LoopReader, readable, recv_parts

T = TypeVar("T")

_NOBLOCK = int(zmq.NOBLOCK)  # a plain int: pyzmq enums cost a constructor per operation

_Entry = tuple[
    Callable[[Buffer, Sequence[Buffer]], Any],  # the decoder's decode
    Callable[[bytes, Any], None],  # the handler
    Callable[[msgspec.DecodeError], bool] | None,  # on_malformed
]


class Route(Generic[T]):
    """Messages of type ``mtype`` decode to ``type_`` and go to
    ``handler(peer, message)``; ``peer`` is the sender's routing id on a
    ROUTER and ``b""`` on a DEALER.

    ``on_malformed``, when given, sees a body of this type that does not
    decode and returns whether it dealt with it; otherwise the inbox logs
    it and moves on.
    """

    __slots__ = ("handler", "mtype", "on_malformed", "type")

    def __init__(
        self,
        mtype: bytes,
        type_: type[T],
        handler: Callable[[bytes, T], None],
        on_malformed: Callable[[msgspec.DecodeError], bool] | None = None,
    ) -> None:
        self.mtype = mtype
        self.type = type_
        self.handler = handler
        self.on_malformed = on_malformed


def ignore(peer: bytes, message: object) -> None:
    """A handler for a message type that needs no action on this socket."""


class Inbox:
    """Drives ``sock`` from ``loop``: whenever messages wait, reads each,
    decodes it by its type and calls that type's handler, in arrival order.

    ``protocol`` is the table of every type this end may receive
    (``messages.SERVER_BOUND`` or ``WORKER_BOUND``); ``routed`` says that
    each message starts with the sender's routing id (a ROUTER).  Call
    ``kick()`` after every send on ``sock`` (see ``LoopReader``), and
    ``close()`` before closing the socket.
    """

    __slots__ = (
        "_closed",
        "_log",
        "_reader",
        "_routed",
        "_routes",
        "_sock",
        "_unknown_hint",
        "kick",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: zmq.Socket[bytes],
        protocol: Mapping[bytes, type[Any]],
        routes: Iterable[Route[Any]],
        *,
        routed: bool,
        log: logging.Logger,
        unknown_hint: str,
    ) -> None:
        by_type: dict[bytes, Route[Any]] = {}
        for route in routes:
            if route.mtype in by_type:
                raise ValueError(f"two routes for message type {route.mtype!r}")
            by_type[route.mtype] = route
        if by_type.keys() != protocol.keys():
            missing = sorted(protocol.keys() - by_type.keys())
            extra = sorted(by_type.keys() - protocol.keys())
            raise ValueError(
                f"the routes must cover the protocol's message types exactly: "
                f"no route for {missing}, routes for unknown types {extra}"
            )
        for mtype, route in by_type.items():
            if route.type != protocol[mtype]:
                raise TypeError(
                    f"route for message type {mtype!r} decodes {route.type!r}; "
                    f"the protocol says {protocol[mtype]!r}"
                )
        self._routes: dict[bytes, _Entry] = {
            mtype: (FrameDecoder(r.type).decode, r.handler, r.on_malformed)
            for mtype, r in by_type.items()
        }
        self._sock = sock
        self._routed = routed
        self._log = log
        self._unknown_hint = unknown_hint
        self._closed = False
        self._reader = LoopReader(loop, sock, self.drain)
        # The reader's own method, not a wrapper: it runs after every send.
        self.kick: Callable[[], None] = self._reader.kick

    def drain(self) -> None:
        """Handle what waits on the socket now (up to ``MAX_DRAIN`` messages;
        the rest on a later loop turn)."""
        if self._closed:
            return
        sock = self._sock
        routes = self._routes
        routed = self._routed
        for _ in range(MAX_DRAIN):
            try:
                if not readable(sock):
                    return
                peer = sock.recv(_NOBLOCK) if routed else b""
                mtype, body, aux = recv_parts(sock)
            except zmq.ZMQError:
                return  # the socket was closed under us (teardown)
            entry = routes.get(mtype)
            if entry is None:
                self._log.error(
                    "ignoring a message of unknown type %r (%s)", mtype, self._unknown_hint
                )
                continue
            decode, handler, on_malformed = entry
            try:
                msg = decode(body, aux)
            except msgspec.DecodeError as exc:
                if on_malformed is None or not on_malformed(exc):
                    self._log.error("ignoring a malformed %r message: %s", mtype, exc)
                continue
            handler(peer, msg)
            if self._closed:
                return
        self._reader.reschedule()

    def close(self) -> None:
        """Stop reading (idempotent); the socket itself stays open."""
        self._closed = True
        self._reader.close()
