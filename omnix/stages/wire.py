"""The stage runtime's send path: what leaves its ROUTER socket, and when.

Owns: ``Wire``, the one writer of the runtime's socket.  Work for a replica
is queued and leaves at the end of the loop turn as one WORK message per
replica (``queue``); any other message to a welcomed worker first flushes
that replica's queued work, so an abort never overtakes the work it aborts
(``send_to``); answers to a connection that may be gone (refusals,
heartbeat acks, shutdown) are sent best-effort (``send_raw``).  A send that
finds the worker's connection gone is reported through ``on_unreachable``
from the loop, never from inside the caller's send.

Does not own what is sent (credits: ``credits.py``; the handshake:
``handshake.py``) nor the socket's reading side (``omnix.transport.inbox``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import zmq

from omnix.stages.slots import Slot
from omnix.transport import messages as m
from omnix.transport.codec import FrameEncoder
from omnix.transport.inbox import Inbox
from omnix.transport.sockets import send_frames
from omnix.transport.work import WorkItem


class Wire:
    """The runtime's socket, seen from the sending side (``attach`` it
    once the socket is bound)."""

    def __init__(self, on_unreachable: Callable[[Slot, str], None]) -> None:
        self.enc = FrameEncoder()
        self.sock: zmq.Socket[bytes] | None = None
        self.inbox: Inbox | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._on_unreachable = on_unreachable
        self._unsent: list[Slot] = []  # slots whose outbox holds work

    def attach(
        self, loop: asyncio.AbstractEventLoop, sock: zmq.Socket[bytes], inbox: Inbox
    ) -> None:
        self.loop = loop
        self.sock = sock
        self.inbox = inbox

    def queue(self, slot: Slot, work: WorkItem) -> None:
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
                assert self.loop is not None
                self.loop.call_soon(self._flush_work)
            self._unsent.append(slot)

    def _flush_work(self) -> None:
        slots, self._unsent = self._unsent, []
        for slot in slots:
            self.flush_slot(slot)

    def flush_slot(self, slot: Slot) -> None:
        """Put ``slot``'s queued work on the wire now (before any message that
        must follow it: an abort must never overtake the work it aborts)."""
        if not slot.outbox:
            return
        items, slot.outbox = slot.outbox, []
        if slot.state == "ready" and slot.identity is not None:
            self.send_to(slot, m.WORK, items)

    def send_to(self, slot: Slot, mtype: bytes, msg: object) -> None:
        """Send to ``slot``'s welcomed worker, after its queued work."""
        sock = self.sock
        assert sock is not None and slot.identity is not None
        if mtype != m.WORK and slot.outbox:
            self.flush_slot(slot)
        frames = self.enc.encode(mtype, msg, slot.identity)
        try:
            send_frames(sock, frames)
        except zmq.ZMQError as exc:
            # ROUTER_MANDATORY: its connection is gone.  Declare it lost from
            # the loop, not from inside the caller's send().
            assert self.loop is not None
            self.loop.call_soon(self._on_unreachable, slot, f"unreachable: {exc}")
            return
        assert self.inbox is not None
        self.inbox.kick()

    def send_raw(self, identity: bytes, mtype: bytes, msg: object) -> None:
        """Send to a connection that may already be gone (no error then)."""
        assert self.sock is not None
        with contextlib.suppress(zmq.ZMQError):
            self.sock.send_multipart(self.enc.encode(mtype, msg, identity))
