"""The on-disk event log: ``DiskLog``, an ``EventLog`` stored in segment files.

Owns: ``DiskLog`` (the storage hooks of ``EventLog`` on disk, put together
from the parts below), ``LogConfig``, the directory's lock (one process has
a log open), when snapshots are due, and which stored events a reader
still sees once retention released some.  The public names of the parts
are re-exported here, so callers import one module.

Does not own, each in its own module:

* the segment file format, scanning and ``iter_log`` (``segments.py``);
* the index of positions and requests (``logindex.py``);
* appending: the write buffer, group commit, the fsync policies and what
  an acknowledged append means under each, rotation (``segwriter.py``);
* reading events by position (``segreader.py``);
* recovery on open: a torn tail is truncated, damage anywhere else is
  refused with ``CorruptLog`` (``logrecovery.py``);
* snapshots and letting segments go, deleted or archived (``compaction.py``).

Nor validation, positions or folding (``EventLog.append`` and the reducer
do that before ``_store`` is called), the event encoding (``codec.py``) or
large payloads (``blobs.py``).

The log is single-writer: all appends and reads happen on one thread (the
asyncio loop's); only the writer's flusher thread runs beside it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import msgspec

from omnix.events.clock import Clock
from omnix.events.compaction import Compaction
from omnix.events.log import EventLog, EventReleased, LogClosed
from omnix.events.logrecovery import RecoveryReport, recover
from omnix.events.reducer import RequestState
from omnix.events.segments import (
    FORMAT_VERSION,
    HEADER_SIZE,
    CorruptLog,
    LogError,
    LogFormatError,
    iter_log,
)
from omnix.events.segreader import SegmentReader
from omnix.events.segwriter import NEVER, LogFailed, SegmentWriter
from omnix.events.snapshot import SNAPSHOT_DIR
from omnix.events.types import Event, Released, Scaled, SessionChanged, WorkerJoined, WorkerLost

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "SNAPSHOT_DIR",
    "CorruptLog",
    "DiskLog",
    "LogConfig",
    "LogError",
    "LogFailed",
    "LogFormatError",
    "LogLocked",
    "RecoveryReport",
    "iter_log",
]

log = logging.getLogger("omnix.events.disklog")


class LogLocked(LogError):
    """Another process (or another DiskLog in this one) has the log open."""


class LogConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How a ``DiskLog`` writes.  The fsync policies: ``segwriter.py``."""

    fsync: Literal["always", "batch", "none"] = "batch"
    #: Longest time between group fsyncs under "batch" (and between writes
    #: of the buffer to the OS under "batch" and "none").
    batch_interval_ms: float = 5.0
    #: A segment is sealed and a new one started once it would grow past this.
    segment_bytes: int = 64 << 20
    #: Buffered bytes that make ``append`` hand the buffer to the OS at once
    #: instead of waiting for the flusher's next tick.
    write_buffer_bytes: int = 256 << 10
    #: Appends between two snapshots of the fold (``DIR/snapshots``): a
    #: reopen folds only the events after the newest one.  0: none.
    snapshot_every: int = 100_000
    #: Snapshots kept (the newest ones).  Segments are let go only below
    #: what the oldest kept one needs, so a damaged newest one falls back.
    keep_snapshots: int = 2
    #: Segments that hold only released requests' events (and server events
    #: older than every retained request) are deleted, or with ``archive``
    #: moved to ``DIR/archive/`` (``iter_log`` reads them there).
    archive: bool = False

    def __post_init__(self) -> None:
        if self.fsync not in ("always", "batch", "none"):
            raise ValueError(f"fsync must be 'always', 'batch' or 'none', not {self.fsync!r}")
        if not self.batch_interval_ms > 0:
            raise ValueError(f"batch_interval_ms must be > 0, got {self.batch_interval_ms}")
        if self.segment_bytes < 4096:
            raise ValueError(f"segment_bytes must be at least 4096, got {self.segment_bytes}")
        if self.write_buffer_bytes < 1:
            raise ValueError(f"write_buffer_bytes must be >= 1, got {self.write_buffer_bytes}")
        if self.snapshot_every < 0:
            raise ValueError(
                f"snapshot_every must be >= 0 (0: no snapshots), got {self.snapshot_every}"
            )
        if self.keep_snapshots < 1:
            raise ValueError(f"keep_snapshots must be >= 1, got {self.keep_snapshots}")


def _retained(ev: Event, requests: dict[str, RequestState]) -> bool:
    """Whether a stored event is still in the log: a request event whose
    request is not in the fold can only have been released."""
    return (
        type(ev) is WorkerJoined
        or type(ev) is WorkerLost
        or type(ev) is Released
        or type(ev) is SessionChanged
        or type(ev) is Scaled
        or ev.request_id in requests
    )


class DiskLog(EventLog):
    """An ``EventLog`` stored in segment files under ``path``.

    Opening recovers the directory (see ``recovery``) and rebuilds ``state``
    by folding every record.  Use it as a context manager or call
    ``close()``: closing writes out and fsyncs whatever is buffered.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        config: LogConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(clock)
        self.path = Path(path)
        self.config = cfg = config or LogConfig()
        self._snap_every = cfg.snapshot_every
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._acquire_lock()
        try:
            found = recover(self.path)
            writer = SegmentWriter(
                self.path,
                found.index,
                policy=cfg.fsync,
                interval_s=cfg.batch_interval_ms / 1000.0,
                segment_bytes=cfg.segment_bytes,
                buffer_bytes=cfg.write_buffer_bytes,
                on_fail=self._on_write_failure,
                on_due=self._snapshot_due,
            )
            writer.open(found.fold.next_pos)
        except BaseException:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise
        self.recovery: RecoveryReport = found.report
        self.state = found.fold
        self.loaded_retention = found.retention
        self.snapshot_pos = found.snapshot_pos
        self._index = found.index
        self._writer = writer
        self._snapshot_after(found.fold.next_pos)
        self._store = writer.append  # no frame in between: see SegmentWriter.append
        self._reader = SegmentReader(found.index, writer)
        self._compaction = Compaction(
            self.path,
            found.index,
            self._reader,
            found.snaps,
            keep=cfg.keep_snapshots,
            archive=cfg.archive,
            durable=cfg.fsync != "none",
        )

    def _acquire_lock(self) -> int:
        fd = os.open(self.path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise LogLocked(
                f"{self.path} is already open (held by pid {holder}); a log has one "
                "writer: close the other DiskLog, or read it with iter_log()"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _on_write_failure(self) -> None:
        self._closed = True  # append() now raises _refusal(): LogFailed

    def _snapshot_after(self, next_pos: int) -> None:
        """The next snapshot falls due ``snapshot_every`` appends from ``next_pos``."""
        every = self._snap_every
        self._writer.due_at = next_pos + every - 1 if every > 0 else NEVER

    def _snapshot_due(self) -> None:
        self._maint_due = True

    # -- storage hooks ----------------------------------------------------
    def _refusal(self) -> Exception:
        failure = self._writer.failure
        if failure is not None:
            return LogFailed(
                f"{self.path}: an earlier write failed ({failure}); the log refuses "
                "appends because its state may be ahead of the disk: reopen it to recover"
            )
        return LogClosed(f"{self.path}: the event log is closed")

    def read(self, start: int = 0, stop: int | None = None) -> Iterator[Event]:
        n = self.state.next_pos
        stop = n if stop is None else min(stop, n)
        start = max(start, 0)
        index = self._index
        if start < index.base:
            return self._read_below(start, stop)
        if index.released_any:
            return self._held(self._reader.events(start, stop))
        return self._reader.events(start, stop)

    def _read_below(self, start: int, stop: int) -> Iterator[Event]:
        index = self._index
        for p in sorted(index.pinned):
            if start <= p < stop:
                yield index.pinned[p]
        if stop > index.base:
            yield from self._held(self._reader.events(index.base, stop))

    def _held(self, events: Iterator[Event]) -> Iterator[Event]:
        """Skip released requests' events (a stored request event whose
        request is not in the fold can only have been released)."""
        requests = self.state.requests
        for ev in events:
            if _retained(ev, requests):
                yield ev

    def get(self, pos: int) -> Event:
        if not 0 <= pos < self.state.next_pos:
            raise IndexError(f"no event at position {pos} (log has {self.state.next_pos})")
        index = self._index
        if pos < index.base:
            found = index.pinned.get(pos)
            if found is None:
                raise EventReleased(pos, f" ({self.path})")
            return found
        ev = self._reader.event(pos)
        if index.released_any and not _retained(ev, self.state.requests):
            raise EventReleased(pos, f" ({self.path})")
        return ev

    def _positions(self, request_id: str) -> list[int]:
        return self._index.positions(request_id)

    def _positions_since(self, request_id: str, start: int) -> list[int]:
        return self._index.positions(request_id, start)

    # -- durability ---------------------------------------------------------
    @property
    def durable_pos(self) -> int:
        """Positions below this are fsynced (survive power loss)."""
        return self._writer.durable_pos

    @property
    def written_pos(self) -> int:
        """Positions below this are in the OS (survive a crash of this process)."""
        return self._writer.written_pos

    def sync(self) -> int:
        """Write out and fsync everything appended so far, now; return ``durable_pos``.

        Blocks for one fsync; from async code prefer ``await flush()``.
        """
        return self._writer.sync()

    async def flush(self) -> int:
        """Wait until everything appended so far is durable; return ``durable_pos``.

        Under "batch" this joins the next group fsync (at most
        ``batch_interval_ms`` away) instead of forcing one, so many
        concurrent flushes share one fsync.
        """
        return await self._writer.flush()

    @contextlib.contextmanager
    def group_commit(self) -> Iterator[DiskLog]:
        """Under fsync="always", share one fsync among the appends in the block.

        Appends inside the block are acknowledged (durable) when it exits;
        until then they are visible to readers but not yet durable.  Under
        the other policies the block changes nothing.
        """
        with self._writer.group():
            yield self

    # -- closing ----------------------------------------------------------
    def close(self) -> None:
        """Write out and fsync what is buffered, stop the flusher, unlock."""
        if self._lock_fd < 0:
            super().close()
            return
        try:
            self._writer.close()
        finally:
            self._reader.close()
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1
            super().close()

    def __enter__(self) -> DiskLog:
        return self

    def segment_paths(self) -> list[Path]:
        """The segment files, oldest first."""
        return [Path(s.path) for s in self._index.segs]

    @property
    def index_base(self) -> int:
        """The first position the in-memory index covers (0 until retention
        let segments go)."""
        return self._index.base

    @property
    def index_bytes(self) -> int:
        """Bytes the in-memory position index holds (16 per indexed event)."""
        index = self._index
        return index.offs.itemsize * len(index.offs) + index.prev.itemsize * len(index.prev)

    # -- snapshots and retention ------------------------------------------
    def _housekeeping(self) -> None:
        super()._housekeeping()  # retention first: the snapshot then holds its releases
        if self.state.next_pos <= self._writer.due_at:
            return
        self._snapshot_after(self.state.next_pos)
        if not self._writer.usable:
            return
        try:
            self.snapshot()
        except OSError as exc:
            # The log itself is intact; only the reopen will fold more.
            log.error("could not write a snapshot of %s: %s; the log goes on", self.path, exc)

    def snapshot(self) -> Path:
        """Write a snapshot of the fold now (``DIR/snapshots``), then let go of
        the snapshots and segments no longer needed; returns its path.

        Runs every ``snapshot_every`` appends by itself.  The log is synced
        first, so the snapshot never names a position that a crash could
        take back (under ``fsync="none"`` it is only written to the OS)."""
        w = self._writer
        w.check_usable()
        w.write_out(fsync=w.policy != "none")
        retention = self.retention_state() if self.retention_state is not None else None
        path = self._compaction.take(self.state, self._worker_positions(), retention, w.end)
        self._compact()
        return path

    def _compact(self) -> None:
        """Let go of the segments every kept snapshot is past (``compaction.py``)."""
        self._compaction.let_go(self._worker_positions())
