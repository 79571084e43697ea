"""What a stage worker sends its server: records batched per loop turn.

Owns: ``Outbox``, the one writer of the worker's work socket.  Records
(``Started``, ``Output``, ``ProgressRec``, ``Done``, ``Error``) recorded in
one loop turn leave together as one OUTPUTS message at its end, or at once
when ``MAX_BATCH`` are waiting, or when a caller flushes (a request's end
is latency-critical); other messages (HELLO, READY, PROFILED, GOODBYE)
leave at once.  A rejoin gives it a fresh socket (``attach``); records
queued for a lost server are dropped (``clear``).

Does not own what is recorded (``worker_engine_loop.py``,
``worker_requests.py``, ``worker_control.py``) nor the socket's reading
side (``omnix.transport.inbox``).
"""

from __future__ import annotations

import asyncio
import logging

import zmq

from omnix.transport import messages as m
from omnix.transport.codec import FrameEncoder
from omnix.transport.inbox import Inbox
from omnix.transport.sockets import send_frames

log = logging.getLogger("omnix.worker")

MAX_BATCH = 256  # records per OUTPUTS message before an immediate flush


class Outbox:
    def __init__(self) -> None:
        self.sock: zmq.Socket[bytes] | None = None
        self.inbox: Inbox | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._enc = FrameEncoder()
        self._records: list[m.Record] = []

    def attach(
        self, loop: asyncio.AbstractEventLoop, sock: zmq.Socket[bytes], inbox: Inbox
    ) -> None:
        self.loop = loop
        self.sock = sock
        self.inbox = inbox

    def record(self, rec: m.Record) -> None:
        box = self._records
        box.append(rec)
        if len(box) == 1:
            # Everything recorded in this loop iteration leaves in one message.
            assert self.loop is not None
            self.loop.call_soon(self.flush)
        elif len(box) >= MAX_BATCH:
            self.flush()

    def flush(self) -> None:
        if not self._records or self.sock is None:
            return
        records, self._records = self._records, []
        try:
            self.send(m.OUTPUTS, records)
        except zmq.ZMQError as exc:
            log.error("could not send %d output records: %s", len(records), exc)

    def clear(self) -> None:
        """Drop the records not sent yet (their server is gone)."""
        self._records.clear()

    def send(self, mtype: bytes, msg: object) -> None:
        sock = self.sock
        assert sock is not None
        send_frames(sock, self._enc.encode(mtype, msg))
        if self.inbox is not None:
            self.inbox.kick()
