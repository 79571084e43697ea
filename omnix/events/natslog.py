"""The event log replicated on a NATS JetStream stream: ``NatsLog``.

Owns: ``NatsLog``, a ``MemoryLog`` (the same storage, so retention's
releases bound its memory exactly as they bound a memory log's) whose
events are replicated to the stream ``OMNIX_LOG_NAME`` (layout:
``jetstream.py``), in one of two modes:

* **leader** (``await NatsLog.open(url, name=..., replicas=..., clock=...,
  snapshot_every=...)``): ``append`` stays synchronous and stores and
  folds at once; a publisher task publishes everything appended since its
  last publish as one message (group commit; split at ``MAX_BATCH_BYTES``)
  with ``Nats-Expected-Last-Sequence`` set to the last stream sequence
  this log knows (a gap, a duplicate or a second writer is refused) and a
  ``Nats-Msg-Id`` of this leader's incarnation and the batch's first
  position (a publish retried after a timeout is deduplicated).  One
  message is in flight at a time: the next batch is whatever was appended
  meanwhile.
  *Acknowledged* means acked by JetStream: ``durable_pos`` (positions
  below it are acked) and ``await flush()``.  A publish refused for a
  wrong expected sequence means another leader appended: the log closes
  itself with ``LogFenced`` (appends raise it) and calls ``on_fenced``.
  While NATS is unreachable the client reconnects by itself and pending
  events are published once it is back; ``available`` is False meanwhile
  (and while more than ``max_pending`` events wait for their ack).
* **follower** (``await NatsLog.follow(url, name=...)``): reads the stream
  from the start (or the newest snapshot) and keeps applying new batches
  (an ordered consumer), each through ``EventLog._accept`` (the reducer's
  validation, storage, listeners, tails, waiters: what ``append`` does
  once it positioned an event).  A batch that does not start at
  ``next_pos`` is a gap or a duplicate: the follower closes with
  ``ReplicaDiverged``.  ``append`` raises ``NotLeader``; ``durable_pos``
  is ``next_pos``.  ``await promote()`` catches up to the stream's last
  sequence and leads from there (its first publish is fenced if someone
  published meanwhile).

Opening (either mode) creates the stream when it does not exist, refuses
one that holds another omnix log or a newer schema (``StreamRefused``),
loads the newest snapshot (``natssnap.py``) and reads the stream from the
batch holding that snapshot's ``index_from``: events before the snapshot
that are still retained are stored (readable) but not folded again.
Every ``snapshot_every`` appends a leader snapshots the fold once it is
acknowledged, keeps the newest two and purges the messages neither needs.

Close with ``await aclose()`` (flushes first) or ``close()`` (drops what
is not acknowledged yet).

Does not own connecting, names and errors (``jetstream.py``), the snapshot
store (``natssnap.py``), the encoding (``codec.py``), nor the lease
(``lease.py``).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import inspect
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy, Header, StorageType, StreamConfig

from omnix.events.clock import Clock
from omnix.events.codec import SchemaError, decode_events, encode_batches
from omnix.events.compaction import low_water
from omnix.events.jetstream import (
    HDR_COUNT,
    HDR_FIRST,
    HDR_LOG_ID,
    HDR_SCHEMA,
    WRONG_LAST_SEQUENCE,
    LogFenced,
    Names,
    NatsConnection,
    ReplicaDiverged,
    StreamRefused,
    connect,
)
from omnix.events.log import EventReleased, MemoryLog
from omnix.events.natssnap import LoadedSnapshot, SnapshotStore
from omnix.events.reducer import Fold, IllegalTransition
from omnix.events.segments import LogError
from omnix.events.snapshot import SnapshotFile
from omnix.events.types import (
    SCHEMA_VERSION,
    Event,
    Released,
    SessionChanged,
    WorkerJoined,
    WorkerLost,
)

__all__ = ["MAX_BATCH_BYTES", "LogFenced", "NatsLog", "NotLeader"]

log = logging.getLogger("omnix.events.natslog")

#: A message's encoded batch stays under this (the server's max payload is 1 MiB).
MAX_BATCH_BYTES = 512 << 10
_PUBLISH_TIMEOUT_S = 2.0
_META_LOG = "omnix_log"
_META_ID = "omnix_log_id"
_META_SCHEMA = "omnix_schema"

OnFenced = Callable[[LogFenced], Awaitable[None] | None]


class NotLeader(LogError):
    """``append`` on a follower: a follower never writes."""


class NatsLog(MemoryLog):
    """A ``MemoryLog`` replicated on a JetStream stream (module docstring)."""

    def __init__(
        self,
        conn: NatsConnection,
        names: Names,
        log_id: str,
        *,
        replicas: int,
        clock: Clock | None,
        snapshot_every: int,
        max_pending: int,
        on_fenced: OnFenced | None,
    ) -> None:
        super().__init__(clock)
        self.conn = conn
        self.names = names
        self.log_id = log_id
        self.replicas = replicas
        self.snapshot_every = snapshot_every
        self.max_pending = max_pending
        self.on_fenced = on_fenced
        self._snaps = SnapshotStore(conn, names.snapshots, log_id)
        self._failure: LogError | None = None
        self._following = True
        self._last_seq = 0  # the last stream sequence this log knows
        self._bfirst: list[int] = []  # first position of each known batch...
        self._bseq: list[int] = []  # ...and its stream sequence
        # reading
        self._read_pos: int | None = 0  # next position the stream must hold (None: any <= base)
        self._fold_from = 0  # positions below were folded in the snapshot loaded
        self._reader: asyncio.Task[None] | None = None
        self._sub: object | None = None
        self._progress = asyncio.Event()
        # leading
        self.incarnation = ""
        self._unsent: list[Event] = []
        self._acked_pos = 0
        self._wake = asyncio.Event()
        self._publisher: asyncio.Task[None] | None = None
        self._flushes: deque[tuple[int, asyncio.Future[int]]] = deque()
        self._snap_due = 0
        self._snap_ready: SnapshotFile | None = None
        self._snap_task: asyncio.Task[None] | None = None
        self._purged_below = 0
        self._callbacks: set[asyncio.Future[None]] = set()  # on_fenced's, while they run
        #: snapshots this log stored
        self.snapshot_count = 0

    # -- opening ------------------------------------------------------------
    @classmethod
    async def open(
        cls,
        url: str,
        *,
        name: str = "omnix",
        replicas: int = 1,
        clock: Clock | None = None,
        snapshot_every: int = 100_000,
        log_id: str | None = None,
        max_pending: int = 100_000,
        on_fenced: OnFenced | None = None,
        timeout_s: float = 10.0,
    ) -> NatsLog:
        """Open the log as its leader: read the stream (from the newest
        snapshot) to its end, then append from there."""
        nlog = await cls._connect(
            url, name, replicas, clock, snapshot_every, log_id, max_pending, on_fenced, timeout_s
        )
        try:
            await nlog.promote()
        except BaseException:
            await nlog.aclose()
            raise
        return nlog

    @classmethod
    async def follow(
        cls,
        url: str,
        *,
        name: str = "omnix",
        replicas: int = 1,
        clock: Clock | None = None,
        snapshot_every: int = 100_000,
        log_id: str | None = None,
        max_pending: int = 100_000,
        on_fenced: OnFenced | None = None,
        timeout_s: float = 10.0,
    ) -> NatsLog:
        """Open the log as a follower: its fold follows the stream; it never
        writes until ``promote()``.  Returns once it has read what the
        stream held when it opened."""
        nlog = await cls._connect(
            url, name, replicas, clock, snapshot_every, log_id, max_pending, on_fenced, timeout_s
        )
        try:
            info = await nlog.conn.js.stream_info(nlog.names.stream)
            await nlog._wait_seq(info.state.last_seq)
        except BaseException:
            await nlog.aclose()
            raise
        return nlog

    @classmethod
    async def _connect(
        cls,
        url: str,
        name: str,
        replicas: int,
        clock: Clock | None,
        snapshot_every: int,
        log_id: str | None,
        max_pending: int,
        on_fenced: OnFenced | None,
        timeout_s: float,
    ) -> NatsLog:
        if replicas < 1 or replicas > 5:
            raise LogError(f"replicas must be 1..5 (3 for a three-node cluster), got {replicas}")
        names = Names(name)
        conn = await connect(url, timeout_s=min(timeout_s, 5.0))
        try:
            found_id = await _ensure_stream(conn, names, replicas, log_id, timeout_s)
            nlog = cls(
                conn,
                names,
                found_id,
                replicas=replicas,
                clock=clock,
                snapshot_every=snapshot_every,
                max_pending=max_pending,
                on_fenced=on_fenced,
            )
            await nlog._start_reading()
        except BaseException:
            await conn.close()
            raise
        return nlog

    async def _start_reading(self) -> None:
        """Load the newest snapshot, then follow the stream from the batch
        that holds its ``index_from`` (from the start without one)."""
        info = await self.conn.js.stream_info(self.names.stream)
        loaded = await self._snaps.load_newest()
        start = 1
        if loaded is not None:
            self._restore(loaded)
            start = loaded.index_seq
        elif info.state.first_seq > 1 and info.state.messages:
            raise StreamRefused(
                f"stream {self.names.stream} starts at sequence {info.state.first_seq} and no "
                f"snapshot in {self.names.snapshots} covers what was purged; restore the "
                "snapshot bucket, or delete the stream to start a new log"
            )
        if start < info.state.first_seq:
            raise StreamRefused(
                f"stream {self.names.stream}: the snapshot needs sequence {start}, but the "
                f"stream starts at {info.state.first_seq}; delete the stream and its "
                "snapshot bucket to start a new log"
            )
        self._last_seq = start - 1
        sub = await self.conn.js.subscribe(
            self.names.subject,
            stream=self.names.stream,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            config=ConsumerConfig(opt_start_seq=start),
            idle_heartbeat=1.0,
        )
        self._sub = sub
        self._reader = asyncio.get_running_loop().create_task(self._read(sub))

    def _restore(self, loaded: LoadedSnapshot) -> None:
        snap = loaded.snap
        self.state = Fold(snap.fold)
        self.snapshot_pos = self._fold_from = snap.next_pos
        self.loaded_retention = snap.retention
        self._resume_at(snap.index_from, snap.pinned)
        self._read_pos = None
        self._snap_due = snap.next_pos + self.snapshot_every

    # -- reading the stream ---------------------------------------------------
    async def _read(self, sub: object) -> None:
        try:
            async for msg in sub.messages:  # type: ignore[attr-defined]
                self._apply_msg(msg)
                self._progress.set()
        except asyncio.CancelledError:
            raise
        except LogError as exc:
            self._fail(exc)
        except Exception as exc:  # the client's own failure: say which stream
            self._fail(LogError(f"stream {self.names.stream}: reading failed: {exc!r}"))

    def _apply_msg(self, msg: Msg) -> None:
        headers = msg.headers or {}
        seq = msg.metadata.sequence.stream
        stream = self.names.stream
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
        try:
            events = decode_events(msg.data)
        except (SchemaError, ValueError) as exc:
            raise StreamRefused(f"stream {stream} message {seq}: {exc}") from None
        self._apply_batch(seq, first, events)

    def _apply_batch(self, seq: int, first: int, events: list[Event]) -> None:
        expect = self._read_pos
        if (expect is not None and first != expect) or (expect is None and first > self._base):
            raise ReplicaDiverged(
                f"stream {self.names.stream} message {seq} starts at position {first}, but "
                f"this log is at {expect if expect is not None else self._base}: a gap or a "
                "duplicate; the follower stopped (reopen it to read the stream again)"
            )
        if seq != self._last_seq + 1 and self._bseq:
            raise ReplicaDiverged(
                f"stream {self.names.stream}: message {seq} follows {self._last_seq}; a "
                "message is missing; the follower stopped"
            )
        pos = first
        fold_from = self._fold_from
        for ev in events:
            if ev.pos != pos:
                raise ReplicaDiverged(
                    f"stream {self.names.stream} message {seq}: event at {ev.pos}, expected {pos}"
                )
            pos += 1
            if ev.pos >= fold_from:
                try:
                    self._accept(ev)
                except IllegalTransition as exc:
                    raise ReplicaDiverged(
                        f"stream {self.names.stream} message {seq}: {exc}; the follower stopped"
                    ) from None
            elif ev.pos >= self._base:
                self._restore_event(ev)
        self._read_pos = pos
        self._last_seq = seq
        self._note_batch(first, seq)

    def _restore_event(self, ev: Event) -> None:
        """An event older than the snapshot loaded: stored when still
        retained (already in the fold), a released slot otherwise."""
        if (
            type(ev) is WorkerJoined
            or type(ev) is WorkerLost
            or type(ev) is Released
            or type(ev) is SessionChanged
            or ev.request_id in self.state.requests
        ):
            MemoryLog._store(self, ev)
        else:
            self._hole()

    def _note_batch(self, first: int, seq: int) -> None:
        self._bfirst.append(first)
        self._bseq.append(seq)
        if len(self._bfirst) > 8192:
            # Batches wholly below what this log still holds are never asked for.
            k = bisect.bisect_right(self._bfirst, self._base) - 1
            if k > 0:
                del self._bfirst[:k], self._bseq[:k]

    async def _wait_seq(self, seq: int) -> None:
        """Wait until this log applied the stream up to ``seq``."""
        while self._last_seq < seq:
            if self._failure is not None:
                raise self._failure
            if self._reader is None or self._reader.done():
                raise LogError(
                    f"stream {self.names.stream}: the reader stopped at {self._last_seq}"
                )
            self._progress.clear()
            await self._progress.wait()
        if self._failure is not None:
            raise self._failure

    async def _stop_reading(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()  # type: ignore[attr-defined]

    # -- promotion and leading ------------------------------------------------
    async def promote(self) -> None:
        """Stop following, fold everything the stream holds now, and lead:
        appends are published with the expected-sequence check from there."""
        if not self._following:
            return
        if self._failure is not None:
            raise self._failure
        info = await self.conn.js.stream_info(self.names.stream)
        await self._wait_seq(info.state.last_seq)
        await self._stop_reading()
        if self._failure is not None:
            raise self._failure
        self._following = False
        self.incarnation = uuid.uuid4().hex[:12]
        self._acked_pos = self.next_pos
        self._read_pos = self.next_pos
        if self._snap_due <= self.next_pos:
            self._snap_due = self.next_pos + self.snapshot_every
        self._publisher = asyncio.get_running_loop().create_task(self._publish_loop())
        if self._maint_due:
            self._maintain()  # what came due while following (retention's decisions)

    @property
    def leading(self) -> bool:
        return not self._following and not self._closed

    def append(self, ev: Event) -> Event:
        if self._following and not self._closed:
            raise NotLeader(
                f"this log follows stream {self.names.stream}: a follower never writes; "
                "promote() it first"
            )
        return super().append(ev)

    def _store(self, ev: Event) -> None:
        MemoryLog._store(self, ev)
        if not self._following:
            self._unsent.append(ev)
            if ev.pos + 1 >= self._snap_due and self.snapshot_every > 0:
                self._maint_due = True  # _housekeeping snapshots between appends
            wake = self._wake
            if not wake.is_set():
                wake.set()

    def _maintain(self) -> None:
        if self._following:
            return  # decisions are the leader's; promote() runs what came due
        super()._maintain()

    async def _publish_loop(self) -> None:
        try:
            while not self._closed:
                if not self._unsent:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                take, self._unsent = self._unsent, []
                first = take[0].pos
                for n, payload in encode_batches(take, MAX_BATCH_BYTES):
                    await self._publish(first, n, payload)
                    first += n
                    self._acked(first)
        except LogFenced:
            pass  # _fence closed the log
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("publishing to stream %s failed", self.names.stream)
            self._fail(LogError(f"stream {self.names.stream}: publishing failed: {exc!r}"))

    async def _publish(self, first: int, n: int, payload: bytes) -> None:
        """Publish one batch until JetStream acks it (retrying through
        timeouts and reconnects), or fence on a wrong expected sequence."""
        expected = self._last_seq
        base = {
            Header.MSG_ID: f"{self.log_id}:{self.incarnation}:{first}",
            Header.EXPECTED_LAST_SEQUENCE: str(expected),
            HDR_FIRST: str(first),
            HDR_COUNT: str(n),
            HDR_LOG_ID: self.log_id,
            HDR_SCHEMA: str(SCHEMA_VERSION),
        }
        delay = 0.05
        warned = False
        while True:
            try:
                ack = await self.conn.js.publish(
                    self.names.subject,
                    payload,
                    timeout=_PUBLISH_TIMEOUT_S,
                    stream=self.names.stream,
                    headers=dict(base),
                )
            except nats.js.errors.APIError as exc:
                if exc.err_code in WRONG_LAST_SEQUENCE:
                    raise self._fence(expected, first) from None
                err: Exception = exc
            except (TimeoutError, nats.errors.Error, OSError) as exc:
                err = exc
            else:
                if ack.seq != expected + 1:
                    raise self._fence(expected, first)
                self._last_seq = ack.seq
                self._note_batch(first, ack.seq)
                return
            if self._closed:
                raise self._refusal()
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

    def _acked(self, pos: int) -> None:
        self._acked_pos = pos
        flushes = self._flushes
        while flushes and flushes[0][0] <= pos:
            _, fut = flushes.popleft()
            if not fut.done():
                fut.set_result(pos)
        ready = self._snap_ready
        if ready is not None and ready.next_pos <= pos and self._snap_task is None:
            self._snap_ready = None
            self._snap_task = asyncio.get_running_loop().create_task(self._write_snapshot(ready))

    # -- acknowledgement ------------------------------------------------------
    @property
    def durable_pos(self) -> int:
        """Positions below this are acked by JetStream (a follower: all it holds)."""
        return self.next_pos if self._following else self._acked_pos

    async def flush(self) -> int:
        """Wait until everything appended so far is acked by JetStream."""
        target = self.next_pos
        if self._failure is not None:
            raise self._failure
        if self._following or self._acked_pos >= target:
            return self.durable_pos
        if self._closed:
            raise self._refusal()
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._flushes.append((target, fut))
        return await fut

    @property
    def available(self) -> bool:
        """Whether new work should be admitted: connected to NATS, not
        closed, and not more than ``max_pending`` events waiting for acks."""
        return (
            self.conn.connected
            and not self._closed
            and self.next_pos - self.durable_pos <= self.max_pending
        )

    @property
    def pending(self) -> int:
        """Events appended but not acknowledged yet."""
        return self.next_pos - self.durable_pos

    # -- failure --------------------------------------------------------------
    def _fence(self, expected: int, first: int) -> LogFenced:
        exc = LogFenced(
            f"another leader appended to stream {self.names.stream} (it is past sequence "
            f"{expected}): this log stopped writing at position {first}; events from there "
            "were not acknowledged.  Step down: follow the stream (NatsLog.follow)"
        )
        self._fail(exc)
        cb = self.on_fenced
        if cb is not None:
            res = cb(exc)
            if inspect.isawaitable(res):
                task = asyncio.ensure_future(res)
                self._callbacks.add(task)
                task.add_done_callback(self._callbacks.discard)
        return exc

    def _fail(self, exc: LogError) -> None:
        if self._failure is None:
            self._failure = exc
        for _, fut in self._flushes:
            if not fut.done():
                fut.set_exception(exc)
        self._flushes.clear()
        self._progress.set()
        super().close()

    def _refusal(self) -> Exception:
        if self._failure is not None:
            return self._failure
        return super()._refusal()

    @property
    def failure(self) -> LogError | None:
        """Why the log closed itself (fenced, diverged, refused), or None."""
        return self._failure

    # -- snapshots --------------------------------------------------------------
    def _housekeeping(self) -> None:
        super()._housekeeping()  # retention first: the snapshot holds its releases
        every = self.snapshot_every
        if every <= 0 or self._following or self.next_pos < self._snap_due:
            return
        self._snap_due = self.next_pos + every
        self._snap_ready = self._snapshot_file()
        if self._acked_pos >= self.next_pos:
            self._acked(self._acked_pos)

    def _snapshot_file(self) -> SnapshotFile:
        state = self.state
        low = low_water(state) if state.ended_dropped else self._base
        pinned = []
        for p in sorted(self._worker_positions()):
            if 0 <= p < low:
                with contextlib.suppress(EventReleased, IndexError):
                    pinned.append(self.get(p))
        retention = self.retention_state() if self.retention_state is not None else None
        return SnapshotFile(
            next_pos=state.next_pos,
            fold=state.snapshot(),
            index_from=low,
            index_segment=0,
            index_offset=0,
            pinned=tuple(pinned),
            retention=retention,
        )

    def _seq_of(self, pos: int) -> int:
        """The stream sequence of the batch holding ``pos`` (the next one's
        when no batch published so far holds it)."""
        if pos >= self._acked_pos or not self._bfirst:
            return self._last_seq + 1
        i = bisect.bisect_right(self._bfirst, pos) - 1
        return self._bseq[max(i, 0)]

    async def _write_snapshot(self, snap: SnapshotFile) -> None:
        try:
            index_seq = self._seq_of(snap.index_from)
            seq = self._seq_of(snap.next_pos - 1) if snap.next_pos else 0
            cut = await self._snaps.save(snap, seq, index_seq, self.replicas)
            self.snapshot_count += 1
            if cut > self._purged_below:
                await self.conn.js.purge_stream(self.names.stream, seq=cut)
                self._purged_below = cut
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The log itself is intact; only a reopen will read more.
            log.error(
                "stream %s: could not store a snapshot: %r; the log goes on", self.names.stream, exc
            )
        finally:
            self._snap_task = None
        if self._snap_ready is not None and self._snap_ready.next_pos <= self._acked_pos:
            self._acked(self._acked_pos)

    async def snapshot(self) -> None:
        """Snapshot the fold now (once acknowledged) and wait for it to be stored."""
        self._snap_ready = self._snapshot_file()
        await self.flush()
        self._acked(self._acked_pos)
        while self._snap_task is not None:
            await self._snap_task

    # -- closing ----------------------------------------------------------------
    def close(self) -> None:
        """Close now: events not acknowledged yet are not published."""
        if self._failure is None and not self._closed:
            super().close()
        for task in (self._publisher, self._reader, self._snap_task):
            if task is not None:
                task.cancel()
        self._publisher = None
        self._reader = None
        for _, fut in self._flushes:
            if not fut.done():
                fut.set_exception(self._refusal())
        self._flushes.clear()
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(self.conn.close())

    async def aclose(self, flush_s: float = 5.0) -> None:
        """Publish what is pending (for up to ``flush_s``), then close."""
        if not self._following and not self._closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.flush(), flush_s)
        if self._snap_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._snap_task), flush_s)
        await self._stop_reading()
        self.close()
        await self.conn.close()


async def _ensure_stream(
    conn: NatsConnection, names: Names, replicas: int, log_id: str | None, wait_s: float
) -> str:
    """Create the log's stream when absent; check what an existing one holds.
    Returns the log's id."""
    js = conn.js
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        try:
            info = await js.stream_info(names.stream)
            break
        except nats.js.errors.NotFoundError:
            pass
        except (nats.js.errors.ServiceUnavailableError, TimeoutError, nats.errors.Error) as exc:
            if loop.time() > deadline:
                raise LogError(f"{conn.url}: JetStream does not answer ({exc!r})") from None
            await asyncio.sleep(0.2)
            continue
        new_id = log_id or uuid.uuid4().hex
        config = StreamConfig(
            name=names.stream,
            subjects=[names.subject],
            storage=StorageType.FILE,
            num_replicas=replicas,
            duplicate_window=120.0,
            allow_direct=True,
            metadata={_META_LOG: names.log, _META_ID: new_id, _META_SCHEMA: str(SCHEMA_VERSION)},
        )
        try:
            await js.add_stream(config)
            return new_id
        except nats.js.errors.APIError as exc:
            # Created by another process meanwhile (read it back), or a
            # cluster still electing its meta leader (retry).
            if loop.time() > deadline:
                raise LogError(
                    f"{conn.url}: cannot create stream {names.stream}: {exc.description}"
                ) from None
            await asyncio.sleep(0.2)
    meta = info.config.metadata or {}
    where = f"stream {names.stream} on {conn.url}"
    if _META_ID not in meta:
        raise StreamRefused(
            f"{where} was not created by omnix (no omnix_log_id in its metadata); "
            "use another log name, or delete the stream"
        )
    if meta.get(_META_LOG) != names.log or (log_id is not None and meta[_META_ID] != log_id):
        raise StreamRefused(
            f"{where} holds another omnix log ({meta.get(_META_LOG)!r}, id {meta[_META_ID]}); "
            "use another log name, or delete the stream to start a new log"
        )
    schema = int(meta.get(_META_SCHEMA, "0"))
    if schema > SCHEMA_VERSION:
        raise StreamRefused(
            f"{where} was written by a newer omnix (event schema {schema}; this one reads up "
            f"to {SCHEMA_VERSION}): upgrade omnix"
        )
    return meta[_META_ID]
