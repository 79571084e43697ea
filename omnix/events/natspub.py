"""A replicated log leader's publisher: group commit, acks, fencing.

Owns: ``Publisher``: the events appended but not published yet, the task
that publishes them (everything appended since the last publish as one
message, split at ``MAX_BATCH_BYTES``; one message in flight at a time),
the headers of each message (``Nats-Expected-Last-Sequence`` = the last
stream sequence this leader knows, ``Nats-Msg-Id`` = the log id, this
leader's incarnation and the batch's first position, and omnix's own:
``jetstream.py``), retrying a publish through timeouts and reconnects
(the message id makes a retry a duplicate, never a second copy), the
acknowledged position and the ``flush`` waiters on it, and recognising a
refused expected sequence as another leader's append (``LogFenced``).

Blobs (``push_blob``) go in the same order as events: a blob put before
an event that references it is published (and acked) before that event's
batch, as a message of its own (``HDR_BLOB``).

Does not own the log's storage, snapshots, nor what a fenced log does
(``natslog.py`` closes it and tells the server).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import Callable
from typing import NamedTuple, cast

import nats.errors
import nats.js.errors
from nats.js.api import Header

from omnix.events.codec import encode_batches
from omnix.events.jetstream import (
    HDR_BLOB,
    HDR_COUNT,
    HDR_FIRST,
    HDR_LOG_ID,
    HDR_PART,
    HDR_SCHEMA,
    WRONG_LAST_SEQUENCE,
    LogFenced,
    Names,
    NatsConnection,
)
from omnix.events.segments import LogError
from omnix.events.types import SCHEMA_VERSION, Event

__all__ = ["MAX_BATCH_BYTES", "Publisher"]

log = logging.getLogger("omnix.events.natslog")

#: A message's encoded batch stays under this (the server's max payload is 1 MiB).
MAX_BATCH_BYTES = 512 << 10
_PUBLISH_TIMEOUT_S = 2.0


class BlobOut(NamedTuple):
    """A blob waiting in the publish order."""

    digest: str
    data: bytes


class Publisher:
    """Publishes a leader's appends from position ``acked_pos`` on, the
    stream being at sequence ``last_seq``.  ``on_acked(first, end, seq)``
    runs after each ack; ``on_failed(exc)`` once, when it stops for good
    (``LogFenced``, or a failure it cannot retry)."""

    def __init__(
        self,
        conn: NatsConnection,
        names: Names,
        log_id: str,
        *,
        last_seq: int,
        acked_pos: int,
        on_acked: Callable[[int, int, int], None],
        on_failed: Callable[[LogError], None],
        on_blob_acked: Callable[[str, int], None] | None = None,
    ) -> None:
        self.conn = conn
        self.names = names
        self.log_id = log_id
        #: distinguishes this leader's message ids from any other's
        self.incarnation = uuid.uuid4().hex[:12]
        self.last_seq = last_seq
        self.acked_pos = acked_pos
        self.unsent: list[Event | BlobOut] = []
        self._blobs_unsent = 0
        self._blobs_pushed = 0
        self._blobs_acked = 0
        self._blobs_sent = 0  # numbers each blob message (a re-sent digest is a new message)
        self._blob_flushes: list[tuple[int, asyncio.Future[None]]] = []
        self._on_acked = on_acked
        self._on_failed = on_failed
        self._on_blob_acked = on_blob_acked
        self._wake = asyncio.Event()
        self._flushes: deque[tuple[int, asyncio.Future[int]]] = deque()
        self._stopped = False
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def push(self, ev: Event) -> None:
        """Queue a stored event (the log's ``_store``)."""
        self.unsent.append(ev)
        wake = self._wake
        if not wake.is_set():
            wake.set()

    def push_blob(self, digest: str, data: bytes) -> None:
        """Queue a blob: published before every event pushed after it."""
        self.unsent.append(BlobOut(digest, data))
        self._blobs_unsent += 1
        self._blobs_pushed += 1
        wake = self._wake
        if not wake.is_set():
            wake.set()

    async def flush_blobs(self) -> None:
        """Wait until every blob pushed so far is acked."""
        if self._blobs_acked >= self._blobs_pushed:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._blob_flushes.append((self._blobs_pushed, fut))
        await fut

    async def flush(self, target: int) -> int:
        """Wait until positions below ``target`` are acked; the acked position."""
        if self.acked_pos >= target:
            return self.acked_pos
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._flushes.append((target, fut))
        return await fut

    def stop(self, exc: Exception) -> None:
        """Stop publishing; pending ``flush`` calls raise ``exc``."""
        self._stopped = True
        self._task.cancel()
        for fut in [f for _, f in self._flushes] + [f for _, f in self._blob_flushes]:
            if not fut.done():
                fut.set_exception(exc)
        self._flushes.clear()
        self._blob_flushes.clear()

    async def _loop(self) -> None:
        try:
            while not self._stopped:
                if not self.unsent:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                take, self.unsent = self.unsent, []
                if not self._blobs_unsent:
                    await self._send_events(cast(list[Event], take))  # events only
                    continue
                self._blobs_unsent = 0
                run: list[Event] = []
                for item in take:
                    if isinstance(item, BlobOut):
                        if run:
                            await self._send_events(run)
                            run = []
                        await self._send_blob(item)
                    else:
                        run.append(item)
                if run:
                    await self._send_events(run)
        except asyncio.CancelledError:
            raise
        except LogError as exc:
            self._on_failed(exc)
        except Exception as exc:
            log.exception("publishing to stream %s failed", self.names.stream)
            self._on_failed(LogError(f"stream {self.names.stream}: publishing failed: {exc!r}"))

    async def _send_events(self, events: list[Event]) -> None:
        first = events[0].pos
        for n, payload in encode_batches(events, MAX_BATCH_BYTES):
            seq0 = 0
            for where, part in self._parts(payload):
                headers = {
                    Header.MSG_ID: f"{self.log_id}:{self.incarnation}:{first}{where and ':'}{where}",
                    HDR_FIRST: str(first),
                    HDR_COUNT: str(n),
                }
                seq = await self._publish(part, headers, where, first)
                seq0 = seq0 or seq
            self._acked(first, first + n, seq0)
            first += n

    async def _send_blob(self, blob: BlobOut) -> None:
        self._blobs_sent += 1
        tag = f"{self.log_id}:{self.incarnation}:b{self._blobs_sent}"
        seq0 = 0
        for where, part in self._parts(blob.data):
            headers = {
                Header.MSG_ID: f"{tag}{where and ':'}{where}",
                HDR_BLOB: blob.digest,
                HDR_FIRST: str(self.acked_pos),
            }
            seq = await self._publish(part, headers, where, self.acked_pos)
            seq0 = seq0 or seq
        self._blobs_acked += 1
        if self._on_blob_acked is not None:
            self._on_blob_acked(blob.digest, seq0)
        done = [f for n, f in self._blob_flushes if n <= self._blobs_acked]
        self._blob_flushes = [(n, f) for n, f in self._blob_flushes if n > self._blobs_acked]
        for fut in done:
            if not fut.done():
                fut.set_result(None)

    def _parts(self, payload: bytes) -> list[tuple[str, bytes]]:
        """``payload`` as the messages it goes in: ("", it) when one is
        enough, else ("k/n", part) each (a message has a max payload)."""
        size = max(1024, min(MAX_BATCH_BYTES, self.conn.nc.max_payload - 4096))
        if len(payload) <= size:
            return [("", payload)]
        parts = [payload[i : i + size] for i in range(0, len(payload), size)]
        return [(f"{k + 1}/{len(parts)}", part) for k, part in enumerate(parts)]

    def _acked(self, first: int, end: int, seq: int) -> None:
        self.acked_pos = end
        flushes = self._flushes
        while flushes and flushes[0][0] <= end:
            _, fut = flushes.popleft()
            if not fut.done():
                fut.set_result(end)
        self._on_acked(first, end, seq)

    async def _publish(self, payload: bytes, headers: dict[str, str], part: str, first: int) -> int:
        """Publish one message (a batch, a blob, or ``part`` of one) until
        JetStream acks it (its sequence), retrying through timeouts and
        reconnects; ``LogFenced`` on a wrong expected sequence.  ``first``:
        the position the leader's unacknowledged events start at."""
        expected = self.last_seq
        headers = {
            **headers,
            Header.EXPECTED_LAST_SEQUENCE: str(expected),
            HDR_LOG_ID: self.log_id,
            HDR_SCHEMA: str(SCHEMA_VERSION),
        }
        if part:
            headers[HDR_PART] = part
        delay = 0.05
        warned = False
        while True:
            try:
                ack = await self.conn.js.publish(
                    self.names.subject,
                    payload,
                    timeout=_PUBLISH_TIMEOUT_S,
                    stream=self.names.stream,
                    headers=dict(headers),
                )
            except nats.js.errors.APIError as exc:
                if exc.err_code in WRONG_LAST_SEQUENCE:
                    raise self._fenced(expected, first) from None
                err: Exception = exc
            except (TimeoutError, nats.errors.Error, OSError) as exc:
                err = exc
            else:
                if ack.seq != expected + 1:
                    raise self._fenced(expected, first)
                self.last_seq = int(ack.seq)
                return self.last_seq
            if not warned:
                log.warning(
                    "stream %s: publish of positions %d.. not acknowledged yet (%r); retrying",
                    self.names.stream,
                    first,
                    err,
                )
                warned = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _fenced(self, expected: int, first: int) -> LogFenced:
        return LogFenced(
            f"another leader appended to stream {self.names.stream} (it is past sequence "
            f"{expected}): this log stopped writing at position {first}; events from there "
            "were not acknowledged.  Step down: follow the stream (NatsLog.follow)"
        )
