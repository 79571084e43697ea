"""Reading a replicated log's stream: an ordered consumer, message checks.

Owns: ``StreamReader``: the ordered consumer that delivers the stream's
messages from a sequence on, in order (nats-py recreates it after a
reconnect or a missed heartbeat), the checks each message passes before
its events reach the log (it belongs to this log: ``Omnix-Log-Id``; its
schema is readable: ``Omnix-Schema`` and the body's version byte; it
follows the previous message: no sequence missing, as when a slow reader
fell behind a purge), decoding its batch, and waiting until a given
sequence has been applied.

Does not own applying the events (``NatsLog._apply_batch``: positions,
the fold, storage) nor what a failure does to the log (``on_error``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from omnix.events.codec import SchemaError, decode_events
from omnix.events.jetstream import (
    HDR_BLOB,
    HDR_FIRST,
    HDR_LOG_ID,
    HDR_PART,
    HDR_SCHEMA,
    Names,
    NatsConnection,
    ReplicaDiverged,
    StreamRefused,
    retry_until_answered,
)
from omnix.events.segments import LogError
from omnix.events.types import SCHEMA_VERSION, Event

__all__ = ["StreamReader"]

#: (first and last stream sequence, first position, events) of one batch
Apply = Callable[[int, int, int, list[Event]], None]
#: (stream sequence, digest, bytes) of one blob
ApplyBlob = Callable[[int, str, bytes], None]


class StreamReader:
    """Delivers the stream's batches to ``apply`` from ``start()``'s sequence
    on; a failure (raised by a check or by ``apply``) goes to ``on_error``
    and stops it."""

    def __init__(
        self,
        conn: NatsConnection,
        names: Names,
        log_id: str,
        apply: Apply,
        on_error: Callable[[LogError], None],
        on_blob: ApplyBlob,
    ) -> None:
        self.conn = conn
        self.names = names
        self.log_id = log_id
        self._apply = apply
        self._on_error = on_error
        self._on_blob = on_blob
        self.last_seq = 0  # the last sequence applied
        self.failure: LogError | None = None
        self._progress = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sub: Any = None
        self._parts: list[bytes] = []  # of a batch cut into parts, so far
        self._parts_seq = 0  # the first part's sequence

    async def start(self, seq: int, wait_s: float = 10.0) -> None:
        """Follow the stream from sequence ``seq`` on; the consumer is asked
        for again for up to ``wait_s`` while JetStream does not answer (a
        cluster electing a new leader after a node died)."""
        self.last_seq = seq - 1
        loop = asyncio.get_running_loop()
        self._sub = await retry_until_answered(
            lambda: self.conn.js.subscribe(
                self.names.subject,
                stream=self.names.stream,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                config=ConsumerConfig(opt_start_seq=seq),
                idle_heartbeat=1.0,
            ),
            wait_s,
            f"stream {self.names.stream}'s consumer",
        )
        self._task = loop.create_task(self._read(self._sub))

    async def _read(self, sub: Any) -> None:
        try:
            async for msg in sub.messages:
                seq, first, data = self.check(msg)
                self.last_seq = seq
                if data is not None:
                    first_seq = self._parts_seq or seq
                    self._parts_seq = 0
                    digest = (msg.headers or {}).get(HDR_BLOB)
                    if digest is not None:
                        self._on_blob(first_seq, digest, data)
                    else:
                        self._apply(first_seq, seq, first, self._decode(seq, data))
                self._progress.set()
        except asyncio.CancelledError:
            raise
        except LogError as exc:
            self._failed(exc)
        except Exception as exc:  # the client's own failure: say which stream
            self._failed(LogError(f"stream {self.names.stream}: reading failed: {exc!r}"))

    def _failed(self, exc: LogError) -> None:
        self.failure = exc
        self._progress.set()
        self._on_error(exc)

    def check(self, msg: Msg) -> tuple[int, int, bytes | None]:
        """(sequence, first position, the batch's bytes) of a message,
        checked; the bytes are None for a part that is not the last."""
        headers = msg.headers or {}
        seq = int(msg.metadata.sequence.stream)
        stream = self.names.stream
        if seq != self.last_seq + 1:
            raise ReplicaDiverged(
                f"stream {stream}: message {seq} follows {self.last_seq}; the messages "
                "between were purged or lost; the follower stopped (reopen it: it starts "
                "from the newest snapshot)"
            )
        if headers.get(HDR_LOG_ID) != self.log_id:
            raise StreamRefused(
                f"stream {stream} message {seq} belongs to another omnix log "
                f"({headers.get(HDR_LOG_ID)!r}, not {self.log_id}); one stream holds one "
                "log: use another log name"
            )
        version = int(headers.get(HDR_SCHEMA, "0"))
        if version > SCHEMA_VERSION:
            raise StreamRefused(
                f"stream {stream} message {seq} holds events of schema {version}, newer "
                f"than this omnix reads ({SCHEMA_VERSION}): upgrade omnix"
            )
        first = int(headers.get(HDR_FIRST, "-1"))
        part = headers.get(HDR_PART)
        k, _, n = (part or "1/1").partition("/")
        if k == "1" and self._parts:
            # A batch whose leader died between its parts: never acked,
            # and the next leader went on from the position it started at.
            self._parts, self._parts_seq = [], 0
        if part is None:
            return seq, first, msg.data
        if int(k) != len(self._parts) + 1:
            raise ReplicaDiverged(
                f"stream {stream} message {seq}: part {part} of the batch at {first}, after "
                f"{len(self._parts)} parts; the reader stopped (reopen it)"
            )
        if not self._parts:
            self._parts_seq = seq
        self._parts.append(msg.data)
        if int(k) < int(n):
            return seq, first, None
        data, self._parts = b"".join(self._parts), []
        return seq, first, data

    def _decode(self, seq: int, data: bytes) -> list[Event]:
        try:
            return decode_events(data)
        except (SchemaError, ValueError) as exc:
            raise StreamRefused(f"stream {self.names.stream} message {seq}: {exc}") from None

    async def wait_seq(self, seq: int) -> None:
        """Wait until the stream is applied up to ``seq``; the failure if it stopped."""
        while self.last_seq < seq:
            if self.failure is not None:
                raise self.failure
            if self._task is None or self._task.done():
                raise LogError(f"stream {self.names.stream}: the reader stopped at {self.last_seq}")
            self._progress.clear()
            await self._progress.wait()
        if self.failure is not None:
            raise self.failure

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    def cancel(self) -> None:
        """Stop without waiting (a synchronous close)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
