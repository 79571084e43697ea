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

Does not own connecting, names, the stream's creation and errors
(``jetstream.py``), publishing and acks (``natspub.py``), the consumer and
its checks (``natsread.py``), the snapshot store (``natssnap.py``), the
encoding (``codec.py``), nor the lease (``lease.py``).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from omnix.events.clock import Clock
from omnix.events.compaction import low_water
from omnix.events.jetstream import (
    LogFenced,
    Names,
    NatsConnection,
    ReplicaDiverged,
    StreamRefused,
    connect,
    ensure_stream,
    stream_info,
)
from omnix.events.log import EventReleased, MemoryLog
from omnix.events.natsblobs import ReplicatedBlobs
from omnix.events.natspub import MAX_BATCH_BYTES, Publisher
from omnix.events.natsread import StreamReader
from omnix.events.natssnap import LoadedSnapshot, SnapshotStore, SnapshotWriter
from omnix.events.reducer import Fold, IllegalTransition
from omnix.events.segments import LogError
from omnix.events.snapshot import SnapshotFile
from omnix.events.types import Event, Released, Scaled, SessionChanged, WorkerJoined, WorkerLost

__all__ = ["MAX_BATCH_BYTES", "LogFenced", "NatsLog", "NotLeader"]

log = logging.getLogger("omnix.events.natslog")

OnFenced = Callable[[LogFenced], Awaitable[None] | None]


class NotLeader(LogError):
    """``append`` on a follower: a follower never writes."""


@dataclass(frozen=True, slots=True)
class _Options:
    name: str
    replicas: int
    clock: Clock | None
    snapshot_every: int
    log_id: str | None
    max_pending: int
    on_fenced: OnFenced | None
    timeout_s: float


class NatsLog(MemoryLog):
    """A ``MemoryLog`` replicated on a JetStream stream (module docstring)."""

    acts_when_acknowledged = True

    def __init__(self, conn: NatsConnection, names: Names, log_id: str, opts: _Options) -> None:
        super().__init__(opts.clock)
        self.conn = conn
        self.names = names
        self.log_id = log_id
        self.replicas = opts.replicas
        self.snapshot_every = opts.snapshot_every
        self.max_pending = opts.max_pending
        self.timeout_s = opts.timeout_s
        self.on_fenced = opts.on_fenced
        self._snaps = SnapshotStore(conn, names.snapshots, log_id, wait_s=opts.timeout_s)
        self._failure: LogError | None = None
        self._last_seq = 0  # the last stream sequence this log knows
        self._bfirst: list[int] = []  # first position of each known batch...
        self._bseq: list[int] = []  # ...and its stream sequence
        self._read_pos: int | None = 0  # next position the stream must hold (None: any <= base)
        self._fold_from = 0  # positions below were folded in the snapshot loaded
        #: the blobs its events reference, replicated with them (``natsblobs.py``)
        self.blobs = ReplicatedBlobs()
        self._reader: StreamReader | None = StreamReader(
            conn, names, log_id, self._apply_batch, self._fail, self.blobs.replicated
        )
        self._publisher: Publisher | None = None  # set while leading
        self._snap_due = 0
        self._snapshots = SnapshotWriter(
            self._snaps,
            names.stream,
            opts.replicas,
            self._seq_of,
            lambda: self.durable_pos,
            self._keep_blobs,
        )
        self._callbacks: set[asyncio.Future[None]] = (
            set()
        )  # on_fenced's and close's, while they run

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
        snapshot) to its end, then append from there.  ``replicas``: of a
        stream this creates; ``log_id``: refuse a stream holding another;
        ``on_fenced``: called (or awaited) once another leader appended."""
        opts = _Options(
            name, replicas, clock, snapshot_every, log_id, max_pending, on_fenced, timeout_s
        )
        nlog = await cls._connect(url, opts)
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
        writes until ``promote()`` (the options are those it leads with
        then).  Returns once it has read what the stream held at open."""
        opts = _Options(
            name, replicas, clock, snapshot_every, log_id, max_pending, on_fenced, timeout_s
        )
        nlog = await cls._connect(url, opts)
        try:
            info = await stream_info(nlog.conn, nlog.names, opts.timeout_s)
            assert nlog._reader is not None
            await nlog._reader.wait_seq(info.state.last_seq)
        except BaseException:
            await nlog.aclose()
            raise
        return nlog

    @classmethod
    async def _connect(cls, url: str, opts: _Options) -> NatsLog:
        if not 1 <= opts.replicas <= 5:
            raise LogError(
                f"replicas must be 1..5 (3 for a three-node cluster), got {opts.replicas}"
            )
        names = Names(opts.name)
        conn = await connect(url, timeout_s=min(opts.timeout_s, 5.0))
        try:
            found_id = await ensure_stream(conn, names, opts.replicas, opts.log_id, opts.timeout_s)
            nlog = cls(conn, names, found_id, opts)
            await nlog._start_reading()
        except BaseException:
            await conn.close()
            raise
        return nlog

    async def _start_reading(self) -> None:
        """Load the newest snapshot, then follow the stream from the batch
        that holds its ``index_from`` (from the start without one)."""
        info = await stream_info(self.conn, self.names, self.timeout_s)
        loaded = await self._snaps.load_newest()
        start = 1
        if loaded is not None:
            self._restore(loaded)
            start = loaded.index_seq
        elif info.state.first_seq > 1:
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
        assert self._reader is not None
        await self._reader.start(start, self.timeout_s)

    def _restore(self, loaded: LoadedSnapshot) -> None:
        snap = loaded.snap
        self.state = Fold(snap.fold)
        self.snapshot_pos = self._fold_from = snap.next_pos
        self.loaded_retention = snap.retention
        self._resume_at(snap.index_from, snap.pinned)
        self._read_pos = None
        self._snap_due = snap.next_pos + self.snapshot_every

    # -- applying the stream ----------------------------------------------------
    def _apply_batch(self, seq: int, last_seq: int, first: int, events: list[Event]) -> None:
        """Apply one batch's events (its messages ``seq``..``last_seq``):
        those from the snapshot on through ``_accept`` (as an append),
        older retained ones stored only."""
        expect = self._read_pos
        if (expect is not None and first != expect) or (expect is None and first > self._base):
            raise ReplicaDiverged(
                f"stream {self.names.stream} message {seq} starts at position {first}, but "
                f"this log is at {expect if expect is not None else self._base}: a gap or a "
                "duplicate; the follower stopped (reopen it to read the stream again)"
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
        self._last_seq = last_seq
        self._note_batch(first, seq)

    def _restore_event(self, ev: Event) -> None:
        """An event older than the snapshot loaded: stored when still
        retained (already in the fold), a released slot otherwise."""
        if (
            type(ev) is WorkerJoined
            or type(ev) is WorkerLost
            or type(ev) is Released
            or type(ev) is SessionChanged
            or type(ev) is Scaled
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

    # -- promotion and leading ------------------------------------------------
    async def promote(self) -> None:
        """Stop following, fold everything the stream holds now, and lead:
        appends are published with the expected-sequence check from there."""
        reader = self._reader
        if reader is None:
            return  # leading already
        if self._failure is not None:
            raise self._failure
        info = await stream_info(self.conn, self.names, self.timeout_s)
        await reader.wait_seq(info.state.last_seq)
        await reader.stop()
        if self._failure is not None:
            raise self._failure
        self._reader = None
        self._last_seq = reader.last_seq  # parts of a dead leader's batch included
        self._read_pos = self.next_pos
        if self._snap_due <= self.next_pos:
            self._snap_due = self.next_pos + self.snapshot_every
        self._publisher = Publisher(
            self.conn,
            self.names,
            self.log_id,
            last_seq=self._last_seq,
            acked_pos=self.next_pos,
            on_acked=self._acked,
            on_failed=self._failed,
            on_blob_acked=self.blobs.acked,
        )
        self.blobs.send = self._publisher.push_blob
        if self._maint_due:
            self._maintain()  # what came due while following (retention's decisions)

    async def _keep_blobs(self, index_seq: int) -> None:
        """Before a snapshot that reopens the log from ``index_seq`` (and
        purges what is before it): publish again the blobs still held whose
        message is older, and wait for their acks."""
        publisher = self._publisher
        if publisher is None:
            return
        old = self.blobs.older_than(index_seq)
        for digest in old:
            publisher.push_blob(digest, self.blobs.get(digest))
        if old:
            await publisher.flush_blobs()

    @property
    def leading(self) -> bool:
        return self._publisher is not None and not self._closed

    @property
    def incarnation(self) -> str:
        """This leader's id in its messages' ``Nats-Msg-Id`` ("" while following)."""
        return self._publisher.incarnation if self._publisher is not None else ""

    def append(self, ev: Event) -> Event:
        if self._publisher is None and not self._closed:
            raise NotLeader(
                f"this log follows stream {self.names.stream}: a follower never writes; "
                "promote() it first"
            )
        return super().append(ev)

    def _store(self, ev: Event) -> None:
        MemoryLog._store(self, ev)
        publisher = self._publisher
        if publisher is not None:
            publisher.push(ev)
            if ev.pos + 1 >= self._snap_due and self.snapshot_every > 0:
                self._maint_due = True  # _housekeeping snapshots between appends

    def _maintain(self) -> None:
        if self._publisher is None:
            return  # decisions are the leader's; promote() runs what came due
        super()._maintain()

    def _acked(self, first: int, end: int, seq: int) -> None:
        assert self._publisher is not None
        self._last_seq = self._publisher.last_seq
        self._note_batch(first, seq)
        self._snapshots.acked()

    # -- acknowledgement ------------------------------------------------------
    @property
    def durable_pos(self) -> int:
        """Positions below this are acked by JetStream (a follower: all it holds)."""
        publisher = self._publisher
        return self.next_pos if publisher is None else publisher.acked_pos

    async def flush(self) -> int:
        """Wait until everything appended so far is acked by JetStream."""
        if self._failure is not None:
            raise self._failure
        publisher = self._publisher
        if publisher is None or publisher.acked_pos >= self.next_pos:
            return self.durable_pos
        if self._closed:
            raise self._refusal()
        return await publisher.flush(self.next_pos)

    @property
    def available(self) -> bool:
        """Whether new work should be admitted: connected to NATS, not
        closed, and not more than ``max_pending`` events waiting for acks."""
        return self.conn.connected and not self._closed and self.pending <= self.max_pending

    @property
    def pending(self) -> int:
        """Events appended but not acknowledged yet."""
        return self.next_pos - self.durable_pos

    # -- failure --------------------------------------------------------------
    def _failed(self, exc: LogError) -> None:
        """The publisher stopped: fenced (tell ``on_fenced``), or failed."""
        self._fail(exc)
        cb = self.on_fenced
        if isinstance(exc, LogFenced) and cb is not None:
            res = cb(exc)
            if inspect.isawaitable(res):
                task = asyncio.ensure_future(res)
                self._callbacks.add(task)
                task.add_done_callback(self._callbacks.discard)

    def _fail(self, exc: LogError) -> None:
        """Close the log for good: appends and flushes raise ``exc``."""
        if self._failure is None:
            self._failure = exc
        if self._publisher is not None:
            self._publisher.stop(exc)
        super().close()

    def _refusal(self) -> Exception:
        if self._failure is not None:
            return self._failure
        return super()._refusal()

    @property
    def snapshot_count(self) -> int:
        """Snapshots this log stored."""
        return self._snapshots.count

    @property
    def failure(self) -> LogError | None:
        """Why the log closed itself (fenced, diverged, refused), or None."""
        return self._failure

    # -- snapshots --------------------------------------------------------------
    def _housekeeping(self) -> None:
        super()._housekeeping()  # retention first: the snapshot holds its releases
        every = self.snapshot_every
        if every <= 0 or self._publisher is None or self.next_pos < self._snap_due:
            return
        self._snap_due = self.next_pos + every
        self._snapshots.offer(self._snapshot_file())

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
            index_segment=0,  # a disk log's; the stream's is in the object's headers
            index_offset=0,
            pinned=tuple(pinned),
            retention=retention,
        )

    def _seq_of(self, pos: int) -> int:
        """The stream sequence of the batch holding ``pos`` (the next one's
        when no batch acked so far holds it)."""
        if pos >= self.durable_pos or not self._bfirst:
            return self._last_seq + 1
        i = bisect.bisect_right(self._bfirst, pos) - 1
        return self._bseq[max(i, 0)]

    async def snapshot(self) -> None:
        """Snapshot the fold now (once acknowledged) and wait until it is stored."""
        if self._publisher is None:
            raise NotLeader(f"stream {self.names.stream}: only the leader snapshots")
        await self._snapshots.wait()
        self._snapshots.offer(self._snapshot_file())
        await self.flush()
        self._snapshots.acked()
        await self._snapshots.wait()

    # -- closing ----------------------------------------------------------------
    def close(self) -> None:
        """Close now: events not acknowledged yet are not published."""
        if not self._closed:
            super().close()
        if self._publisher is not None:
            self._publisher.stop(self._refusal())
        if self._reader is not None:
            self._reader.cancel()
        self._snapshots.cancel()
        with contextlib.suppress(RuntimeError):  # no running loop: nothing to close on
            task = asyncio.get_running_loop().create_task(self.conn.close())
            self._callbacks.add(task)
            task.add_done_callback(self._callbacks.discard)

    async def aclose(self, flush_s: float = 5.0) -> None:
        """Publish what is pending (for up to ``flush_s``), then close."""
        if self._publisher is not None and not self._closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.flush(), flush_s)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._snapshots.wait(), flush_s)
        if self._reader is not None:
            await self._reader.stop()
        self.close()
        await self.conn.close()
