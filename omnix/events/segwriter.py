"""Appending to a disk log's active segment: the write buffer, group commit, rotation.

Owns: ``SegmentWriter``: the active segment's file; the user-space write
buffer and the flusher thread that hands it to the OS and fsyncs it; the
fsync policies and what an acknowledged append means under each; the
positions buffered, written and durable, and the ``flush()`` waiters on
the last; sealing the active segment and starting the next (rotation);
and the failure that poisons the log (``LogFailed``).

Does not own the record format (``segments.py``), which positions are
where (``logindex.py``: the writer adds each record and each new segment
there), reading (``segreader.py``, which copies the newest records out of
the buffer through ``buffered``), nor what a failure means to appends
(``DiskLog`` refuses them).

Fsync policies (``LogConfig.fsync``) and what "acknowledged" (``append``
returned) means:

* ``"always"``: the record is written and ``fdatasync``'d before ``append``
  returns: acknowledged == durable (survives power loss).  Listeners only
  ever see durable events.  ``group()`` batches several appends behind one
  fsync (acknowledged when the block exits).
* ``"batch"`` (default): ``append`` puts the record in a user-space buffer;
  a background thread writes the buffer to the OS and fsyncs it at most
  every ``batch_interval_ms`` (group commit: every append in the interval
  shares one fsync), and a full buffer is written to the OS at once.
  Acknowledged means "in the log, folded and visible to readers"; it
  survives a process crash once written to the OS (within one interval) and
  power loss once ``durable_pos`` has passed it.  ``await flush()`` waits
  for that; ``sync()`` forces it now.
* ``"none"``: like ``"batch"``, but the log fsyncs only when asked
  (``sync()``, ``flush()``, ``close()``); not even on rotation.

An I/O error while storing poisons the log: the fold may already include
the event that could not be stored, so every later append raises
``LogFailed``; reopening rebuilds the state from what is on disk.

All appends happen on one thread (the asyncio loop's).  Only the flusher
thread runs beside it: it takes bytes off the front of the write buffer
and writes them under ``_lock``, which readers of the newest records also
take; appends only ever add to the buffer's end and take no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from omnix.events.log import LogClosed
from omnix.events.logindex import LogIndex
from omnix.events.segments import (
    HEADER_SIZE,
    MAX_RECORD,
    REC_HEADER_SIZE,
    REC_V,
    VERSION_CRC,
    LogError,
    Segment,
    body_encoder,
    encode_header,
    fsync_dir,
    seg_name,
)
from omnix.events.types import (
    SCHEMA_VERSION,
    Event,
    Released,
    Scaled,
    SessionChanged,
    WorkerJoined,
    WorkerLost,
)

__all__ = ["NEVER", "FsyncPolicy", "LogFailed", "SegmentWriter"]

log = logging.getLogger("omnix.events.disklog")

FsyncPolicy = Literal["always", "batch", "none"]
#: A ``due_at`` no position reaches.
NEVER = 1 << 62


class LogFailed(LogError):
    """An earlier write or fsync failed; the log refuses further appends."""


#: A ``flush()`` waiting for a position to be durable: (position, its
#: future, the loop that awaits it; the flusher thread resolves it there).
_DurableWaiter = tuple[int, asyncio.Future[None], asyncio.AbstractEventLoop]


def _resolve(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)


class SegmentWriter:
    """Writes records to the newest segment under ``root`` (see the module
    docstring).  ``on_fail`` is called once, when a write or fsync fails;
    ``on_due`` once an append reaches ``due_at`` (how the log's snapshots
    fall due)."""

    # Slots: the append path reads a dozen attributes per record.
    __slots__ = (
        "_active",
        "_always",
        "_buf",
        "_buf_limit",
        "_buffered_pos",
        "_durable_waiters",
        "_fd",
        "_file_end",
        "_flusher",
        "_group_depth",
        "_interval_s",
        "_lock",
        "_on_due",
        "_on_fail",
        "_seg_limit",
        "_stop",
        "_sync_lock",
        "due_at",
        "durable_pos",
        "end",
        "failure",
        "index",
        "policy",
        "root",
        "written_pos",
    )

    def __init__(
        self,
        root: Path,
        index: LogIndex,
        *,
        policy: FsyncPolicy,
        interval_s: float,
        segment_bytes: int,
        buffer_bytes: int,
        on_fail: Callable[[], None],
        on_due: Callable[[], None] = lambda: None,
    ) -> None:
        self.root = root
        self.index = index
        self.policy = policy
        self._always = policy == "always"
        self._interval_s = interval_s
        self._seg_limit = segment_bytes
        self._buf_limit = buffer_bytes
        self._on_fail = on_fail
        self._on_due = on_due
        #: ``on_due`` is called after each record appended at a position
        #: ``>= due_at`` (the owner moves it on; by default never)
        self.due_at = NEVER
        self.failure: BaseException | None = None
        self._group_depth = 0
        # ``_lock`` serialises taking bytes off the buffer's front and
        # writing them (flusher, full buffer, rotation) with reading the
        # newest records from it; appends only add to its end and take no
        # lock.  ``_sync_lock`` serialises fsyncs and rotation, so the fd
        # being synced is never closed underneath.
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._buf = bytearray()
        self._fd = -1
        self._file_end = 0  # bytes of the active segment handed to the OS
        self.end = 0  # the active segment's length, buffered bytes included
        self._active: Segment | None = None
        self._buffered_pos = 0  # positions < this are stored (buffer or OS)
        self.written_pos = 0  # positions < this are in the OS
        self.durable_pos = 0  # positions < this are fsynced
        self._durable_waiters: list[_DurableWaiter] = []
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None

    # -- opening ----------------------------------------------------------
    def open(self, next_pos: int) -> None:
        """Go on writing at the end of the index's last segment (recovery
        left it whole), or start the first at ``next_pos``; then start the
        flusher (but under ``"always"``)."""
        self._buffered_pos = self.written_pos = self.durable_pos = next_pos
        if not self.index.segs:
            self._new_segment(next_pos)
        else:
            seg = self._active = self.index.segs[-1]
            fd = os.open(seg.path, os.O_RDWR)
            try:
                os.lseek(fd, seg.end, os.SEEK_SET)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            self._file_end = self.end = seg.end
        if self.policy != "always":
            self._flusher = threading.Thread(
                target=self._flush_loop, name=f"omnix-disklog-flush:{self.root.name}", daemon=True
            )
            self._flusher.start()

    def _new_segment(self, first_pos: int) -> None:
        path = self.root / seg_name(first_pos)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, encode_header(first_pos))
            if self.policy != "none":
                # The segment must exist (name and header) before any record
                # in it is acknowledged as durable.
                os.fdatasync(fd)
                fsync_dir(self.root)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._file_end = self.end = HEADER_SIZE
        self._active = Segment(first_pos=first_pos, path=str(path), end=HEADER_SIZE)
        self.index.add_segment(self._active)

    # -- appending --------------------------------------------------------
    def append(self, ev: Event) -> None:
        """Encode, buffer and index ``ev``'s record; under ``"always"`` make
        it durable before returning.  ``DiskLog`` binds it as its storage
        hook (``EventLog._store``): a frame in between cost ~2% of an
        append (measured)."""
        # The hot path of a disk append.  No lock: the buffer is only ever
        # appended to here, and the flusher takes bytes off its front (each
        # a single GIL-held bytearray operation), so a record split between
        # two writes still lands contiguously.
        body = body_encoder.encode(ev)
        rec_len = REC_HEADER_SIZE + 1 + len(body)
        pos = ev.pos
        if rec_len > MAX_RECORD:
            self.fail(ValueError(f"position {pos} encodes to {rec_len} bytes"))
            raise LogFailed(
                f"{self.root}: the event at position {pos} encodes to {rec_len:,} bytes, "
                f"over the {MAX_RECORD:,}-byte record limit; large payloads belong in the "
                "blob store (events carry BlobRefs).  Reopen the log to go on."
            )
        end = self.end  # the active segment's logical length (file + buffer)
        if end + rec_len > self._seg_limit and end > HEADER_SIZE:
            self._guarded(self._rotate, pos)
            end = self.end
        # LogIndex.add, inlined: the call alone cost ~5% of a disk append
        # (measured); tests/events/test_disklog.py holds the two equal.
        index = self.index
        index.offs.append(end)
        if (
            type(ev) is WorkerJoined
            or type(ev) is WorkerLost
            or type(ev) is SessionChanged
            or type(ev) is Scaled
        ):  # exact types: see types.py
            index.prev.append(-1)
        elif type(ev) is Released:
            index.prev.append(-1)
            index.released_any = True
            for rid in ev.request_ids:
                index.last.pop(rid, None)
        else:
            last = index.last
            rid = ev.request_id
            index.prev.append(last.get(rid, -1))
            last[rid] = pos
        self.end = end + rec_len
        buf = self._buf
        buf += REC_V.pack(rec_len - REC_HEADER_SIZE, zlib.crc32(body, VERSION_CRC), SCHEMA_VERSION)
        buf += body
        self._buffered_pos = pos + 1
        if pos >= self.due_at:
            self._on_due()
        if self._always:
            if not self._group_depth:
                self._guarded(self._sync, True)
        elif len(buf) >= self._buf_limit:
            self._guarded(self._write_out)

    def _guarded(self, fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except OSError as exc:
            self.fail(exc)
            raise LogFailed(
                f"{self.root}: could not store position {self._buffered_pos - 1}: {exc}"
            ) from exc

    def buffered(self, a: int, b: int) -> bytes | None:
        """Bytes ``a:b`` of the active segment when they are still in the
        buffer (copied, no syscall); else ``None``, once every byte below
        ``b`` has been handed to the OS (the caller reads the file)."""
        with self._lock:
            fe = self._file_end
            if a >= fe:
                return bytes(self._buf[a - fe : b - fe])
            if b > fe:
                self._write_out_locked()
        return None

    # -- writing, syncing -------------------------------------------------
    def _write_out(self) -> None:
        with self._lock:
            self._write_out_locked()

    def _write_out_locked(self) -> None:
        """Hand the buffer to the OS.  Caller holds ``_lock``.

        Runs on the flusher thread too, concurrently with ``append`` adding
        to the buffer: read the position first, then copy, so the bytes
        written cover at least every record below that position.
        """
        pos = self._buffered_pos
        buf = self._buf
        if not buf:
            return
        data = bytes(buf)
        del buf[: len(data)]  # only what was copied; later appends stay
        mv = memoryview(data)
        fd = self._fd
        while mv:
            k = os.write(fd, mv)
            mv = mv[k:]
        self._file_end += len(data)
        if pos > self.written_pos:
            self.written_pos = pos

    def _sync(self, fsync: bool) -> int:
        """Write the buffer out and (when ``fsync``) make it durable."""
        with self._sync_lock:
            with self._lock:
                self._write_out_locked()
                target = self.written_pos
                fd = self._fd
            if fsync and target > self.durable_pos:
                # The GIL is released during fdatasync; appends go on.
                os.fdatasync(fd)
                self.durable_pos = target
                self._wake_durable()
            return self.durable_pos

    def write_out(self, fsync: bool) -> None:
        """Hand everything buffered to the OS, and fsync it when ``fsync``
        (a snapshot must never name a position a crash could take back)."""
        self._sync(fsync)

    def _rotate(self, first_pos: int) -> None:
        with self._sync_lock:
            with self._lock:
                self._write_out_locked()
                target = self.written_pos
                if self.policy != "none":
                    os.fdatasync(self._fd)
                os.close(self._fd)
                self._fd = -1
                assert self._active is not None
                self._active.end = self.end  # sealed: its length is final
                self._new_segment(first_pos)
            if self.policy != "none" and target > self.durable_pos:
                self.durable_pos = target
                self._wake_durable()

    def _flush_loop(self) -> None:
        fsync = self.policy == "batch"
        while not self._stop.wait(self._interval_s):
            if self._buffered_pos > (self.durable_pos if fsync else self.written_pos):
                try:
                    self._sync(fsync)
                except OSError as exc:
                    self.fail(exc)
                    return

    def fail(self, exc: BaseException) -> None:
        """Poison the log: record the first failure, tell the owner, and
        fail every ``flush()`` waiting."""
        if self.failure is None:
            self.failure = exc
            self._on_fail()
            log.error("disk log %s failed: %s; appends are refused until reopened", self.root, exc)
        self._wake_durable(LogFailed(f"{self.root}: write or fsync failed: {exc}"))

    def _wake_durable(self, exc: BaseException | None = None) -> None:
        with self._lock:
            if not self._durable_waiters:
                return
            durable = self.durable_pos
            keep: list[_DurableWaiter] = []
            ready: list[_DurableWaiter] = []
            for item in self._durable_waiters:
                (ready if exc is not None or item[0] <= durable else keep).append(item)
            self._durable_waiters = keep
        for _, fut, loop in ready:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, fut, exc)

    # -- durability API (``DiskLog``'s) -------------------------------------
    def check_usable(self) -> None:
        if self.failure is not None:
            raise LogFailed(f"{self.root}: an earlier write failed ({self.failure}); reopen it")
        if self._fd < 0:
            raise LogClosed(f"{self.root}: the event log is closed")

    @property
    def usable(self) -> bool:
        return self.failure is None and self._fd >= 0

    def sync(self) -> int:
        """Write out and fsync everything appended so far, now; return ``durable_pos``."""
        self.check_usable()
        try:
            return self._sync(fsync=True)
        except OSError as exc:
            self.fail(exc)
            raise LogFailed(f"{self.root}: fsync failed: {exc}") from exc

    async def flush(self) -> int:
        """Wait until everything appended so far is durable; return ``durable_pos``.

        Under "batch" this joins the next group fsync (at most one interval
        away) instead of forcing one, so many concurrent flushes share one
        fsync.
        """
        target = self._buffered_pos
        if self.durable_pos >= target:
            return self.durable_pos
        self.check_usable()
        if self.policy != "batch":
            return await asyncio.to_thread(self.sync)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._durable_waiters.append((target, fut, loop))
        if self.durable_pos >= target:  # the flusher finished in between
            self._wake_durable()
        await fut
        return self.durable_pos

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """Under ``"always"``, share one fsync among the appends in the
        block (acknowledged when it exits); under the others, nothing."""
        self._group_depth += 1
        try:
            yield
        finally:
            self._group_depth -= 1
            if self._group_depth == 0 and self._always and self.failure is None:
                self.sync()

    # -- closing ----------------------------------------------------------
    def close(self) -> None:
        """Stop the flusher, write out and fsync what is buffered, close
        the segment; every ``flush()`` still waiting is answered."""
        try:
            if self._flusher is not None:
                self._stop.set()
                self._flusher.join()
                self._flusher = None
            if self.failure is None and self._fd >= 0:
                try:
                    self._sync(fsync=True)
                except OSError as exc:
                    self.fail(exc)
                    raise LogFailed(f"{self.root}: final fsync on close failed: {exc}") from exc
        finally:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            self._wake_durable(
                None if self.failure is None else LogFailed(f"{self.root}: the log failed")
            )
