"""The on-disk event log: checksummed segment files, group commit, recovery.

Owns: ``DiskLog`` (the storage hooks of ``EventLog`` on disk), ``LogConfig``,
the segment and record format, the fsync policies and what an acknowledged
append means under each, recovery on open (a torn tail is truncated, damage
anywhere else is refused with ``CorruptLog``), the in-memory position and
request indexes, and ``iter_log`` for reading a log offline.

Does not own validation, positions or folding (``EventLog.append`` and the
reducer do that before ``_store`` is called), the event encoding
(``codec.py``) or large payloads (``blobs.py``).

Format (all integers little-endian)::

    ROOT/LOCK                          flock'ed by the process that has it open
    ROOT/00000000000000000000.seg      one file per segment, named by first position
      header  24 bytes: b"OMNIXLOG" | u16 format version | u16 flags (0)
                        | u64 first position | u32 crc32 of the 20 bytes before
      record  u32 payload length | u32 crc32(payload) | payload
      payload codec.encode_event(ev): schema version byte + msgpack array

Records are contiguous and in position order, so a position is found from a
compact ``array('Q')`` of byte offsets (8 bytes per event) and the segment
list; one request's events are a backward chain through an ``array('q')``
(``prev[pos]`` = the request's previous position), so the index costs 16
bytes per event plus one dict entry per request, and no event object is
kept alive by the log.

Fsync policies (``LogConfig.fsync``) and what "acknowledged" (``append``
returned) means:

* ``"always"``: the record is written and ``fdatasync``'d before ``append``
  returns: acknowledged == durable (survives power loss).  Listeners only
  ever see durable events.  ``group_commit()`` batches several appends
  behind one fsync (acknowledged when the block exits).
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

The log is single-writer: all appends and reads happen on one thread (the
asyncio loop's).  Only the flusher thread runs beside it: it takes bytes
off the front of the write buffer and writes them under ``_lock``, which
readers of the newest records also take; appends only ever add to the
buffer's end and take no lock.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import fcntl
import gc
import logging
import os
import struct
import threading
import time
import zlib
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, Literal

import msgspec

from omnix.events.clock import Clock
from omnix.events.codec import SchemaError
from omnix.events.log import EventLog, EventReleased, LogClosed
from omnix.events.reducer import Fold, IllegalTransition
from omnix.events.snapshot import (
    SnapshotFile,
    decode_snapshot,
    snapshot_paths,
    write_snapshot,
)
from omnix.events.types import SCHEMA_VERSION, Event, Released, WorkerJoined, WorkerLost

__all__ = [
    "FORMAT_VERSION",
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

FORMAT_VERSION = 1
MAGIC = b"OMNIXLOG"
_HEADER = struct.Struct("<8sHHQI")
HEADER_SIZE = _HEADER.size  # 24
_REC = struct.Struct("<II")
REC_HEADER_SIZE = _REC.size  # 8
#: Bound on one record.  Events hold references to blobs, never the blobs,
#: so a record this large can only be damage; recovery uses the bound to
#: tell a plausible record header from garbage, and appends respect it.
MAX_RECORD = 1 << 30
_READ_WINDOW = 1 << 20  # bytes read per pread when iterating a range
_SCAN_CHUNK = 4 << 20  # bytes read at a time by recovery
_MAX_READ_FDS = 8
SNAPSHOT_DIR = "snapshots"
ARCHIVE_DIR = "archive"
_VERSION_CRC = zlib.crc32(bytes((SCHEMA_VERSION,)))
#: A record header plus the payload's version byte, written in one pack:
#: the payload is codec.encode_event's form without building it as one bytes.
_REC_V = struct.Struct("<IIB")
_body_encoder = msgspec.msgpack.Encoder()
#: The codec's form is [version byte] + msgpack; records are checked for the
#: version byte here, so the msgpack part goes straight to a typed decoder.
_event_decoder = msgspec.msgpack.Decoder(Event)


# --------------------------------------------------------------------------
# Errors and config
# --------------------------------------------------------------------------


class LogError(RuntimeError):
    """Base class of the disk log's errors."""


class CorruptLog(LogError):
    """A record or segment header is damaged somewhere other than the tail.

    ``path``/``offset`` locate the damaged bytes, ``pos`` is the position the
    record should have held.  omnix refuses to open such a log rather than
    silently dropping the events after the damage.
    """

    def __init__(self, path: str | os.PathLike[str], offset: int, pos: int, reason: str) -> None:
        self.path = str(path)
        self.offset = offset
        self.pos = pos
        self.reason = reason
        super().__init__(
            f"corrupt event log: {self.path} at byte {offset} (position {pos}): {reason}. "
            "The events after this point cannot be trusted to follow it, so the log "
            "was not opened; restore the segment from a copy, or, to discard this "
            "record and everything after it, truncate the file at that offset and "
            "remove the later segments."
        )


class LogFormatError(LogError):
    """A segment written in a format this omnix cannot read (a newer one)."""


class LogLocked(LogError):
    """Another process (or another DiskLog in this one) has the log open."""


class LogFailed(LogError):
    """An earlier write or fsync failed; the log refuses further appends."""


class LogConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How a ``DiskLog`` writes.  See the module docstring for the policies."""

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


class RecoveryReport(msgspec.Struct, frozen=True):
    """What opening the log found (``DiskLog.recovery``)."""

    segments: int
    events: int
    truncated_bytes: int = 0  # torn tail cut off the last segment
    truncated_at: str = ""  # "FILE:OFFSET" of the cut, "" when none
    truncated_reason: str = ""
    removed_segments: tuple[str, ...] = ()  # empty segments left by a torn rotation
    seconds: float = 0.0
    #: events folded on open: those after the snapshot used (all without one)
    folded: int = 0
    #: records read on open (from the oldest retained request's first event on)
    indexed: int = 0
    snapshot: str = ""  # the snapshot file the fold started from, "" when none
    snapshots_ignored: tuple[str, ...] = ()  # damaged or unusable ones, and why


class _Segment(msgspec.Struct):
    first_pos: int
    path: str
    end: int  # logical length: on disk + still in the write buffer


# --------------------------------------------------------------------------
# Scanning (shared by recovery and iter_log)
# --------------------------------------------------------------------------


class _Unusable(Exception):
    """A snapshot that verifies but does not fit the segments on disk."""


class _BadRecord(Exception):
    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        self.reason = reason


def _seg_name(first_pos: int) -> str:
    return f"{first_pos:020d}.seg"


def _encode_header(first_pos: int) -> bytes:
    body = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, first_pos, 0)[:-4]
    return body + struct.pack("<I", zlib.crc32(body))


def _read_header(path: Path, data: bytes, expected_pos: int) -> int:
    """Validate a segment header; return its first position."""
    if len(data) < HEADER_SIZE:
        raise CorruptLog(path, 0, expected_pos, f"segment header cut short ({len(data)} bytes)")
    magic, version, _flags, first, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptLog(path, 0, expected_pos, "not an omnix log segment (bad magic)")
    if zlib.crc32(data[: HEADER_SIZE - 4]) != crc:
        raise CorruptLog(path, 0, expected_pos, "segment header checksum mismatch")
    if version > FORMAT_VERSION or version == 0:
        raise LogFormatError(
            f"{path}: segment format version {version} is not readable by this omnix "
            f"(reads 1..{FORMAT_VERSION}); upgrade omnix to open this log"
        )
    return int(first)


def _iter_records(f: BinaryIO, size: int, start: int) -> Iterator[tuple[int, int, bytes]]:
    """Yield ``(offset, version, body)`` for each valid record from ``start``.

    ``body`` is the payload without its schema version byte, ready for the
    msgpack decoder.  Raises ``_BadRecord`` at the first record that is cut
    short, has an implausible length or a checksum mismatch; the caller
    decides whether that is a torn tail or damage.

    This loop bounds how fast a log opens, so it takes one bytes slice per
    record (cheaper here than memoryview slices) and checksums the version
    byte through a precomputed crc prefix.
    """
    f.seek(start)
    base = start  # file offset of data[0]
    data = f.read(_SCAN_CHUNK)
    i = 0
    unpack = _REC.unpack_from
    crc32 = zlib.crc32
    cur_version = SCHEMA_VERSION
    cur_crc = _VERSION_CRC
    while True:
        n_data = len(data)
        at_eof = base + n_data >= size
        while i + REC_HEADER_SIZE <= n_data:
            n, crc = unpack(data, i)
            j = i + REC_HEADER_SIZE + n
            if n == 0 or n > MAX_RECORD:
                raise _BadRecord(base + i, f"implausible record length {n}")
            if j > n_data:
                break
            v = data[i + REC_HEADER_SIZE]
            body = data[i + REC_HEADER_SIZE + 1 : j]
            if crc32(body, cur_crc if v == cur_version else crc32(bytes((v,)))) != crc:
                raise _BadRecord(base + i, "record checksum mismatch")
            yield base + i, v, body
            i = j
        if at_eof:
            avail = n_data - i
            if avail == 0:
                return
            if avail < REC_HEADER_SIZE:
                raise _BadRecord(
                    base + i, f"record header cut short ({avail} bytes at end of file)"
                )
            n = unpack(data, i)[0]
            raise _BadRecord(
                base + i, f"record of {n} bytes cut short ({avail - 8} bytes at end of file)"
            )
        need = REC_HEADER_SIZE + (unpack(data, i)[0] if n_data - i >= REC_HEADER_SIZE else 0)
        data = data[i:] + f.read(max(_SCAN_CHUNK, need - (n_data - i)))
        base += i
        i = 0


def _valid_record_after(f: BinaryIO, size: int, offset: int) -> int:
    """The offset of the first valid-looking record after ``offset``, or -1.

    A torn tail is followed by nothing valid; damage in the middle is.
    Each candidate offset is tried as a record header: a plausible length
    that fits the file and a matching crc32 over a payload that starts with
    a schema version byte.  A false match needs a 32-bit checksum collision.
    """
    f.seek(offset + 1)
    data = f.read(size - offset - 1)
    unpack = _REC.unpack_from
    end = len(data) - REC_HEADER_SIZE
    j = 0
    while j <= end:
        n, crc = unpack(data, j)
        if n == 0:
            # A crash can leave a long run of zeros where the file grew but
            # the data never landed; a header needs a nonzero length, so
            # jump to just before the next nonzero byte (found in C).
            k = _next_nonzero(data, j)
            if k < 0:
                return -1
            j = max(j + 1, k - 3)
            continue
        if n <= end - j and data[j + REC_HEADER_SIZE] != 0:
            if zlib.crc32(data[j + REC_HEADER_SIZE : j + REC_HEADER_SIZE + n]) == crc:
                return offset + 1 + j
        j += 1
    return -1


def _next_nonzero(data: bytes, j: int) -> int:
    """Index of the first nonzero byte at or after ``j``, or -1."""
    while j < len(data):
        chunk = data[j : j + 65536]
        if chunk != _ZEROS[: len(chunk)]:  # memcmp: much faster than lstrip
            return j + len(chunk) - len(chunk.lstrip(b"\0"))
        j += len(chunk)
    return -1


_ZEROS = bytes(65536)


def _list_segments(root: Path) -> list[Path]:
    segs = []
    for p in root.glob("*.seg"):
        stem = p.name[: -len(".seg")]
        if not stem.isdigit():
            raise LogError(f"{p}: unexpected file in the log directory (segment names are digits)")
        segs.append((int(stem), p))
    segs.sort()
    return [p for _, p in segs]


def _all_segments(root: Path) -> list[Path]:
    """Archived and live segments in position order."""
    archive = root / ARCHIVE_DIR
    paths = _list_segments(archive) if archive.is_dir() else []
    live = _list_segments(root)
    if paths and live:
        first_live = int(live[0].name[: -len(".seg")])
        paths = [p for p in paths if int(p.name[: -len(".seg")]) < first_live]
    return paths + live


def _decode_at(version: int, body: bytes, path: Path, offset: int, pos: int) -> Event:
    if version != SCHEMA_VERSION and not 0 < version < SCHEMA_VERSION:
        if version > SCHEMA_VERSION:
            # The checksum is valid, so a newer schema version byte means a
            # newer omnix wrote this record: not damage, and never truncated.
            raise SchemaError(
                f"{path} at byte {offset} (position {pos}): event schema version {version} "
                f"is not readable by this omnix (reads versions 1..{SCHEMA_VERSION}); "
                "upgrade omnix to read this log"
            )
        raise CorruptLog(path, offset, pos, f"record has schema version byte {version}")
    try:
        return _event_decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise CorruptLog(path, offset, pos, f"record does not decode as an event: {exc}") from exc


def iter_log(path: str | os.PathLike[str]) -> Iterator[Event]:
    """Read a log directory offline, without opening (or locking) it.

    Safe beside a live writer: it stops quietly at a torn or still-being-
    written tail and never modifies a file.  Damage before the tail raises
    ``CorruptLog`` as opening would.

    Archived segments (``DIR/archive/``) are read first.  Where retention
    deleted the oldest segments, the events start at the first segment
    left (its first position): fold them from the snapshot taken there
    (``DiskLog`` does), not from an empty fold.
    """
    root = Path(path)
    paths = _all_segments(root)
    pos = int(paths[0].name[: -len(".seg")]) if paths else 0
    for k, p in enumerate(paths):
        is_last = k == len(paths) - 1
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(HEADER_SIZE)
            if is_last and size <= HEADER_SIZE:
                # A segment being created (or left half-created by a crash):
                # no record can be in it yet.
                return
            first = _read_header(p, head, pos)
            if first != pos:
                raise CorruptLog(p, 0, pos, f"segment starts at position {first}, expected {pos}")
            try:
                for off, v, body in _iter_records(f, size, HEADER_SIZE):
                    ev = _decode_at(v, body, p, off, pos)
                    if ev.pos != pos:
                        raise CorruptLog(p, off, pos, f"record holds position {ev.pos}")
                    yield ev
                    pos += 1
            except _BadRecord as bad:
                if not is_last or _valid_record_after(f, size, bad.offset) >= 0:
                    raise CorruptLog(p, bad.offset, pos, bad.reason) from None
                return


# --------------------------------------------------------------------------
# The log
# --------------------------------------------------------------------------


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
        self.config = config or LogConfig()
        self._policy = self.config.fsync
        self._always = self._policy == "always"
        self._seg_limit = self.config.segment_bytes
        self._buf_limit = self.config.write_buffer_bytes
        self._failure: BaseException | None = None
        self._group_depth = 0

        # Indexes: pos -> byte offset in its segment; pos -> previous pos of
        # the same request (-1: none); request id -> its latest pos.
        self._offs = array("Q")
        self._prev = array("q")
        self._last: dict[str, int] = {}
        self._segs: list[_Segment] = []
        self._seg_firsts: list[int] = []
        self._read_fds: dict[int, int] = {}
        # Retention: ``_offs[i]``/``_prev[i]`` are about position
        # ``_ibase + i`` (positions below it are gone from the index: their
        # segments were let go, or precede what a snapshot needs); the
        # workers' latest events below it are kept in ``_pinned``.
        self._ibase = 0
        self._pinned: dict[int, Event] = {}
        self._released_any = False  # reads must skip released requests' events
        self._snaps: list[tuple[int, int]] = []  # kept snapshots: (next_pos, index_from)
        self._since_snap = 0
        self._snap_every = self.config.snapshot_every

        # Write state.  ``_lock`` serialises taking bytes off the buffer's
        # front and writing them (flusher, full buffer, rotation) with
        # reading the newest records from it; appends only add to its end
        # and take no lock.  ``_sync_lock`` serialises fsyncs and rotation,
        # so the fd being synced is never closed underneath.
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._buf = bytearray()
        self._fd = -1
        self._file_end = 0  # bytes of the active segment handed to the OS
        self._end = 0  # the active segment's length, buffered bytes included
        self._buffered_pos = 0  # positions < this are stored (buffer or OS)
        self._written_pos = 0  # positions < this are in the OS
        self._durable_pos = 0  # positions < this are fsynced
        self._durable_waiters: list[_DurableWaiter] = []
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None

        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._acquire_lock()
        try:
            self.recovery = self._recover()
            self._open_active()
        except BaseException:
            self._release_fds()
            raise
        if self._policy != "always":
            self._flusher = threading.Thread(
                target=self._flush_loop, name=f"omnix-disklog-flush:{self.path.name}", daemon=True
            )
            self._flusher.start()

    # -- opening ----------------------------------------------------------
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

    def _recover(self) -> RecoveryReport:
        # Folding a long log allocates millions of short-lived objects and
        # no reference cycles; the cyclic GC's passes over the growing fold
        # would cost about a quarter of the time, so it sleeps meanwhile.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._recover_files()
        finally:
            if gc_was_enabled:
                gc.enable()

    def _recover_files(self) -> RecoveryReport:
        t0 = time.perf_counter()
        paths = _list_segments(self.path)
        snap_dir = self.path / SNAPSHOT_DIR
        if snap_dir.is_dir():
            for tmp in snap_dir.glob(".tmp-*"):  # a snapshot write a crash cut short
                tmp.unlink(missing_ok=True)
        ignored: list[str] = []
        for cand in reversed(snapshot_paths(snap_dir)):
            try:
                snap = decode_snapshot(cand.read_bytes(), cand)
                if snap.next_pos != int(cand.name.split(".")[0]):
                    raise ValueError(
                        f"{cand}: holds position {snap.next_pos}, not the one in its name"
                    )
                report = self._recover_from(paths, snap, str(cand))
            except (OSError, ValueError, _Unusable) as exc:
                if isinstance(exc, SchemaError):
                    raise  # a record from a newer omnix: no older snapshot reads it either
                log.warning(
                    "ignoring snapshot %s: %s; trying an older one, or the segments", cand, exc
                )
                ignored.append(f"{cand.name}: {exc}")
                self._reset_indexes()
                continue
            self._snaps = self._kept_snapshots(snap_dir, cand, snap)
            return msgspec.structs.replace(
                report, seconds=time.perf_counter() - t0, snapshots_ignored=tuple(ignored)
            )
        if paths and int(paths[0].name[: -len(".seg")]) != 0:
            raise CorruptLog(
                paths[0],
                0,
                0,
                f"the log starts at position {int(paths[0].name[: -len('.seg')])}: retention "
                "deleted the segments before it, and no valid snapshot covers them"
                + (f" ({'; '.join(ignored)})" if ignored else "")
                + ". Restore a snapshot into DIR/snapshots, or the archived segments into DIR",
            )
        report = self._recover_from(paths, None, "")
        return msgspec.structs.replace(
            report, seconds=time.perf_counter() - t0, snapshots_ignored=tuple(ignored)
        )

    def _kept_snapshots(
        self, snap_dir: Path, used: Path, snap: SnapshotFile
    ) -> list[tuple[int, int]]:
        """(position, index_from) of every snapshot file, oldest first: what
        each needs bounds which segments may go.  A file that does not
        verify needs nothing (it will never be used) and is rotated out
        like the others."""
        out = []
        for p in snapshot_paths(snap_dir):
            at = int(p.name.split(".")[0])
            if p == used:
                out.append((at, snap.index_from))
                continue
            try:
                out.append((at, decode_snapshot(p.read_bytes(), p).index_from))
            except (OSError, ValueError):
                out.append((at, snap.index_from))
        return out

    def _reset_indexes(self) -> None:
        self.state = Fold()
        self._offs = array("Q")
        self._prev = array("q")
        self._last = {}
        self._segs = []
        self._seg_firsts = []
        self._ibase = 0
        self._pinned = {}
        self._released_any = False
        self.loaded_retention = None
        self.snapshot_pos = 0

    def _recover_from(
        self, paths: list[Path], snap: SnapshotFile | None, snap_name: str
    ) -> RecoveryReport:
        """Fold the segments from ``snap`` (or from position 0) on."""
        k0 = 0
        fold_from = 0
        pos = 0
        offset = HEADER_SIZE
        if snap is not None:
            firsts = [int(p.name[: -len(".seg")]) for p in paths]
            fold_from = snap.next_pos
            if snap.index_segment in firsts:
                k0 = firsts.index(snap.index_segment)
                offset = snap.index_offset
            elif not paths and snap.next_pos == 0:
                k0 = 0
            else:
                raise _Unusable(
                    f"the segment it reads from ({_seg_name(snap.index_segment)}) is missing"
                )
            pos = snap.index_from
            self.state = Fold(snap.fold)
            self._pinned = {ev.pos: ev for ev in snap.pinned}
            self.loaded_retention = snap.retention
            self.snapshot_pos = snap.next_pos
            self._released_any = snap.fold.ended_dropped > 0
            # Segments wholly before the oldest retained request: kept on disk
            # for an older snapshot, never read; the next compaction lets them go.
            for p, first in zip(paths[:k0], firsts[:k0], strict=True):
                self._segs.append(_Segment(first_pos=first, path=str(p), end=p.stat().st_size))
                self._seg_firsts.append(first)
        self._ibase = pos
        removed: list[str] = []
        truncated = 0
        truncated_at = ""
        truncated_reason = ""
        state = self.state
        apply_all = state.apply_all
        indexed = 0
        for k in range(k0, len(paths)):
            p = paths[k]
            is_last = k == len(paths) - 1
            with open(p, "r+b" if is_last else "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(HEADER_SIZE)
                if is_last and size <= HEADER_SIZE:
                    # A rotation can die after creating the file and before
                    # (fully) writing its header.  No record can be in it.
                    try:
                        first = _read_header(p, head, pos)
                    except CorruptLog:
                        first = -1
                    if first != pos:
                        removed.append(p.name)
                        log.warning("removing empty segment %s left by a torn rotation", p)
                        p.unlink()
                        self._fsync_dir()
                        break
                first = _read_header(p, head, pos)
                expected = snap.index_segment if (snap is not None and k == k0) else pos
                if first != expected or int(p.name[:-4]) != first:
                    raise CorruptLog(
                        p,
                        0,
                        pos,
                        f"segment starts at position {first}, expected {expected}: a segment "
                        "is missing or misnamed",
                    )
                start = offset if k == k0 else HEADER_SIZE
                end = size
                at = [start, pos]  # byte offset and position of the event being read
                try:
                    try:
                        # The fold's bulk path: the same fold, about twice as
                        # fast on a log of streamed chunks (Fold.apply_all).
                        apply_all(self._segment_events(f, p, size, at, start, fold_from))
                    except IllegalTransition as exc:
                        raise CorruptLog(
                            p,
                            at[0],
                            exc.event.pos,
                            f"the stored event is illegal for this omnix's reducer ({exc})",
                        ) from exc
                    indexed += at[1] - pos
                    pos = at[1]
                except _BadRecord as bad:
                    indexed += at[1] - pos
                    pos = at[1]
                    if not is_last:
                        raise CorruptLog(p, bad.offset, pos, bad.reason) from None
                    follow = _valid_record_after(f, size, bad.offset)
                    if follow >= 0:
                        raise CorruptLog(
                            p,
                            bad.offset,
                            pos,
                            f"{bad.reason}, and a valid record follows at byte {follow}",
                        ) from None
                    # A torn tail: the last append(s) before a crash, never
                    # acknowledged under fsync="always".  Cut it off.
                    end = bad.offset
                    truncated = size - end
                    truncated_at = f"{p}:{end}"
                    truncated_reason = bad.reason
                    log.warning(
                        "truncating torn tail of %s at byte %d (%d bytes: %s)",
                        p,
                        end,
                        truncated,
                        bad.reason,
                    )
                    f.truncate(end)
                    f.flush()
                    os.fsync(f.fileno())
                self._segs.append(_Segment(first_pos=first, path=str(p), end=end))
                self._seg_firsts.append(first)
        if pos < fold_from:
            raise _Unusable(f"the log ends at position {pos}, before the snapshot's {fold_from}")
        if state.next_pos != pos:  # pragma: no cover - Fold counts what it applies
            raise LogError(f"recovery folded up to {state.next_pos} but read up to {pos}")
        self._buffered_pos = self._written_pos = self._durable_pos = pos
        return RecoveryReport(
            segments=len(self._segs),
            events=pos,
            truncated_bytes=truncated,
            truncated_at=truncated_at,
            truncated_reason=truncated_reason,
            removed_segments=tuple(removed),
            folded=pos - fold_from,
            indexed=indexed,
            snapshot=snap_name,
        )

    def _segment_events(
        self, f: BinaryIO, p: Path, size: int, at: list[int], start: int, fold_from: int
    ) -> Iterator[Event]:
        """Recovery: segment ``p``'s events from byte ``start`` in order, each
        indexed as it is read, those from ``fold_from`` on yielded to be
        folded (the ones before it are in the snapshot's fold: only indexed,
        and only for the requests it retained).  ``at`` holds [byte offset,
        position] of the latest one (what an error names) and, at the end,
        the next position.  Raises ``_BadRecord`` at a damaged record and
        ``CorruptLog`` at a record that decodes to the wrong position."""
        pos = at[1]
        decode = _event_decoder.decode
        offs_append = self._offs.append
        prev_append = self._prev.append
        last = self._last
        last_get = last.get
        known = self.state.requests
        for off, v, body in _iter_records(f, size, start):
            if v == SCHEMA_VERSION:
                try:
                    ev = decode(body)
                except msgspec.DecodeError:
                    ev = _decode_at(v, body, p, off, pos)  # raises CorruptLog
            else:
                ev = _decode_at(v, body, p, off, pos)
            if ev.pos != pos:
                raise CorruptLog(p, off, pos, f"record holds position {ev.pos}")
            at[0] = off
            offs_append(off)
            if type(ev) is WorkerJoined or type(ev) is WorkerLost:  # exact types: see types.py
                prev_append(-1)
            elif type(ev) is Released:
                prev_append(-1)
                self._released_any = True
                for rid in ev.request_ids:
                    last.pop(rid, None)
            elif pos < fold_from and ev.request_id not in known:
                prev_append(-1)  # released before the snapshot
            else:
                rid = ev.request_id
                prev_append(last_get(rid, -1))
                last[rid] = pos
            pos += 1
            at[1] = pos
            if pos > fold_from:
                yield ev

    def _open_active(self) -> None:
        if not self._segs:
            self._new_segment(self.state.next_pos)
            return
        seg = self._active = self._segs[-1]
        self._fd = os.open(seg.path, os.O_RDWR)
        os.lseek(self._fd, seg.end, os.SEEK_SET)
        self._file_end = self._end = seg.end

    def _new_segment(self, first_pos: int) -> None:
        path = self.path / _seg_name(first_pos)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, _encode_header(first_pos))
            if self._policy != "none":
                # The segment must exist (name and header) before any record
                # in it is acknowledged as durable.
                os.fdatasync(fd)
                self._fsync_dir()
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._file_end = self._end = HEADER_SIZE
        self._active = _Segment(first_pos=first_pos, path=str(path), end=HEADER_SIZE)
        self._segs.append(self._active)
        self._seg_firsts.append(first_pos)

    def _fsync_dir(self) -> None:
        dfd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # -- storage hooks ----------------------------------------------------
    def _refusal(self) -> Exception:
        if self._failure is not None:
            return LogFailed(
                f"{self.path}: an earlier write failed ({self._failure}); the log refuses "
                "appends because its state may be ahead of the disk: reopen it to recover"
            )
        return LogClosed(f"{self.path}: the event log is closed")

    def _store(self, ev: Event) -> None:
        # The hot path of a disk append: encode, index, buffer.  No lock: the
        # buffer is only ever appended to here, and the flusher takes bytes
        # off its front (each a single GIL-held bytearray operation), so a
        # record split between two writes still lands contiguously.
        body = _body_encoder.encode(ev)
        rec_len = REC_HEADER_SIZE + 1 + len(body)
        if rec_len > MAX_RECORD:
            self._fail(ValueError(f"position {ev.pos} encodes to {rec_len} bytes"))
            raise LogFailed(
                f"{self.path}: the event at position {ev.pos} encodes to {rec_len:,} bytes, "
                f"over the {MAX_RECORD:,}-byte record limit; large payloads belong in the "
                "blob store (events carry BlobRefs).  Reopen the log to go on."
            )
        end = self._end  # the active segment's logical length (file + buffer)
        pos = ev.pos
        if end + rec_len > self._seg_limit and end > HEADER_SIZE:
            self._guarded(self._rotate, pos)
            end = self._end
        self._offs.append(end)
        if type(ev) is WorkerJoined or type(ev) is WorkerLost:  # exact types: see types.py
            self._prev.append(-1)
        elif type(ev) is Released:
            self._prev.append(-1)
            self._released_any = True
            for rid in ev.request_ids:
                self._last.pop(rid, None)
        else:
            rid = ev.request_id
            last = self._last
            self._prev.append(last.get(rid, -1))
            last[rid] = pos
        self._end = end + rec_len
        self._since_snap += 1
        if self._since_snap >= self._snap_every > 0:
            self._maint_due = True
        buf = self._buf
        buf += _REC_V.pack(
            rec_len - REC_HEADER_SIZE, zlib.crc32(body, _VERSION_CRC), SCHEMA_VERSION
        )
        buf += body
        self._buffered_pos = pos + 1
        if self._always:
            if not self._group_depth:
                self._guarded(self._sync, True)
        elif len(buf) >= self._buf_limit:
            self._guarded(self._write_out)

    def _guarded(self, fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except OSError as exc:
            self._fail(exc)
            raise LogFailed(
                f"{self.path}: could not store position {self._buffered_pos - 1}: {exc}"
            ) from exc

    def _write_out(self) -> None:
        with self._lock:
            self._write_out_locked()

    def read(self, start: int = 0, stop: int | None = None) -> Iterator[Event]:
        n = self.state.next_pos
        stop = n if stop is None else min(stop, n)
        start = max(start, 0)
        if start < self._ibase:
            return self._read_below(start, stop)
        if self._released_any:
            return self._held(self._iter(start, stop))
        return self._iter(start, stop)

    def _read_below(self, start: int, stop: int) -> Iterator[Event]:
        base = self._ibase
        for p in sorted(self._pinned):
            if start <= p < stop:
                yield self._pinned[p]
        if stop > base:
            yield from self._held(self._iter(base, stop))

    def _held(self, events: Iterator[Event]) -> Iterator[Event]:
        """Skip released requests' events (a stored request event whose
        request is not in the fold can only have been released)."""
        requests = self.state.requests
        for ev in events:
            if (
                type(ev) is WorkerJoined
                or type(ev) is WorkerLost
                or type(ev) is Released
                or ev.request_id in requests
            ):
                yield ev

    def get(self, pos: int) -> Event:
        if not 0 <= pos < self.state.next_pos:
            raise IndexError(f"no event at position {pos} (log has {self.state.next_pos})")
        if pos < self._ibase:
            found = self._pinned.get(pos)
            if found is None:
                raise EventReleased(pos, f" ({self.path})")
            return found
        for ev in self._iter(pos, pos + 1):
            if self._released_any and not (
                type(ev) is WorkerJoined
                or type(ev) is WorkerLost
                or type(ev) is Released
                or ev.request_id in self.state.requests
            ):
                raise EventReleased(pos, f" ({self.path})")
            return ev
        raise AssertionError("unreachable")  # pragma: no cover

    def _positions(self, request_id: str) -> list[int]:
        p = self._last.get(request_id, -1)
        out = []
        prev = self._prev
        base = self._ibase
        while p >= base:
            out.append(p)
            p = prev[p - base]
        out.reverse()
        return out

    def _positions_since(self, request_id: str, start: int) -> list[int]:
        # Walks back only over the new positions: a subscriber tailing one
        # long request costs O(new events) per wake, not O(all its events).
        p = self._last.get(request_id, -1)
        out = []
        prev = self._prev
        base = self._ibase
        start = max(start, base)
        while p >= start:
            out.append(p)
            p = prev[p - base]
        out.reverse()
        return out

    # -- reading ----------------------------------------------------------
    def _iter(self, start: int, stop: int) -> Iterator[Event]:
        offs = self._offs
        firsts = self._seg_firsts
        unpack = _REC.unpack_from
        decode = _event_decoder.decode
        base = self._ibase
        pos = start
        while pos < stop:
            si = bisect.bisect_right(firsts, pos) - 1
            seg_stop = firsts[si + 1] if si + 1 < len(firsts) else stop
            seg_stop = min(seg_stop, stop)
            # One pread per window of about _READ_WINDOW bytes.
            a = offs[pos - base]
            q = bisect.bisect_right(offs, a + _READ_WINDOW, pos + 1 - base, seg_stop - base) + base
            q = max(q, pos + 1)
            b = self._seg_end_at(si, q)
            data = self._fetch(si, a, b)
            i = 0
            for _ in range(pos, q):
                j = i + REC_HEADER_SIZE + unpack(data, i)[0]
                # Records were checked when the log was opened or written;
                # every readable schema version decodes with one decoder.
                yield decode(data[i + REC_HEADER_SIZE + 1 : j])
                i = j
            pos = q

    def _seg_end_at(self, si: int, q: int) -> int:
        """Byte offset where position ``q``'s record starts, or the segment's end."""
        firsts = self._seg_firsts
        nxt = firsts[si + 1] if si + 1 < len(firsts) else None
        if q - self._ibase < len(self._offs) and (nxt is None or q < nxt):
            return self._offs[q - self._ibase]
        return self._end if nxt is None else self._segs[si].end

    def _fetch(self, si: int, a: int, b: int) -> bytes:
        if si == len(self._segs) - 1:
            with self._lock:
                fe = self._file_end
                if a >= fe:
                    # Still in the write buffer: copy it out, no syscall.
                    return bytes(self._buf[a - fe : b - fe])
                if b > fe:
                    self._write_out_locked()
        if self._lock_fd < 0:
            # Closed: reading still works (a tail drains what is left), but
            # without caching descriptors that nothing would close.
            with open(self._segs[si].path, "rb") as f:
                data = os.pread(f.fileno(), b - a, a)
        else:
            fd = self._read_fds.get(si)
            if fd is None:
                if len(self._read_fds) >= _MAX_READ_FDS:
                    old = next(iter(self._read_fds))
                    os.close(self._read_fds.pop(old))
                fd = os.open(self._segs[si].path, os.O_RDONLY)
                self._read_fds[si] = fd
            data = os.pread(fd, b - a, a)
        if len(data) != b - a:
            raise LogError(
                f"{self._segs[si].path}: short read at byte {a} ({len(data)} of {b - a} "
                "bytes); was the file truncated while the log was open?"
            )
        return data

    # -- writing, syncing -------------------------------------------------
    def _write_out_locked(self) -> None:
        """Hand the buffer to the OS.  Caller holds ``_lock``.

        Runs on the flusher thread too, concurrently with ``_store``
        appending to the buffer: read the position first, then copy, so the
        bytes written cover at least every record below that position.
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
        if pos > self._written_pos:
            self._written_pos = pos

    def _sync(self, fsync: bool) -> int:
        """Write the buffer out and (when ``fsync``) make it durable."""
        with self._sync_lock:
            with self._lock:
                self._write_out_locked()
                target = self._written_pos
                fd = self._fd
            if fsync and target > self._durable_pos:
                # The GIL is released during fdatasync; appends go on.
                os.fdatasync(fd)
                self._durable_pos = target
                self._wake_durable()
            return self._durable_pos

    def _rotate(self, first_pos: int) -> None:
        with self._sync_lock:
            with self._lock:
                self._write_out_locked()
                target = self._written_pos
                if self._policy != "none":
                    os.fdatasync(self._fd)
                os.close(self._fd)
                self._fd = -1
                self._active.end = self._end  # sealed: its length is final
                self._new_segment(first_pos)
            if self._policy != "none" and target > self._durable_pos:
                self._durable_pos = target
                self._wake_durable()

    def _flush_loop(self) -> None:
        fsync = self._policy == "batch"
        interval = self.config.batch_interval_ms / 1000.0
        while not self._stop.wait(interval):
            if self._buffered_pos > (self._durable_pos if fsync else self._written_pos):
                try:
                    self._sync(fsync)
                except OSError as exc:
                    self._fail(exc)
                    return

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
            self._closed = True  # append() now raises _refusal(): LogFailed
            log.error("disk log %s failed: %s; appends are refused until reopened", self.path, exc)
        self._wake_durable(LogFailed(f"{self.path}: write or fsync failed: {exc}"))

    def _wake_durable(self, exc: BaseException | None = None) -> None:
        with self._lock:
            if not self._durable_waiters:
                return
            durable = self._durable_pos
            keep: list[_DurableWaiter] = []
            ready: list[_DurableWaiter] = []
            for item in self._durable_waiters:
                (ready if exc is not None or item[0] <= durable else keep).append(item)
            self._durable_waiters = keep
        for _, fut, loop in ready:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, fut, exc)

    # -- public durability API --------------------------------------------
    @property
    def durable_pos(self) -> int:
        """Positions below this are fsynced (survive power loss)."""
        return self._durable_pos

    @property
    def written_pos(self) -> int:
        """Positions below this are in the OS (survive a crash of this process)."""
        return self._written_pos

    def sync(self) -> int:
        """Write out and fsync everything appended so far, now; return ``durable_pos``.

        Blocks for one fsync; from async code prefer ``await flush()``.
        """
        self._check_usable()
        try:
            return self._sync(fsync=True)
        except OSError as exc:
            self._fail(exc)
            raise LogFailed(f"{self.path}: fsync failed: {exc}") from exc

    async def flush(self) -> int:
        """Wait until everything appended so far is durable; return ``durable_pos``.

        Under "batch" this joins the next group fsync (at most
        ``batch_interval_ms`` away) instead of forcing one, so many
        concurrent flushes share one fsync.
        """
        target = self._buffered_pos
        if self._durable_pos >= target:
            return self._durable_pos
        self._check_usable()
        if self._policy != "batch":
            return await asyncio.to_thread(self.sync)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._durable_waiters.append((target, fut, loop))
        if self._durable_pos >= target:  # the flusher finished in between
            self._wake_durable()
        await fut
        return self._durable_pos

    @contextlib.contextmanager
    def group_commit(self) -> Iterator[DiskLog]:
        """Under fsync="always", share one fsync among the appends in the block.

        Appends inside the block are acknowledged (durable) when it exits;
        until then they are visible to readers but not yet durable.  Under
        the other policies the block changes nothing.
        """
        self._group_depth += 1
        try:
            yield self
        finally:
            self._group_depth -= 1
            if self._group_depth == 0 and self._policy == "always" and self._failure is None:
                self.sync()

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise LogFailed(f"{self.path}: an earlier write failed ({self._failure}); reopen it")
        if self._fd < 0:
            raise LogClosed(f"{self.path}: the event log is closed")

    # -- closing ----------------------------------------------------------
    def close(self) -> None:
        """Write out and fsync what is buffered, stop the flusher, unlock."""
        if self._fd < 0 and self._lock_fd < 0:
            super().close()
            return
        try:
            if self._flusher is not None:
                self._stop.set()
                self._flusher.join()
                self._flusher = None
            if self._failure is None and self._fd >= 0:
                try:
                    self._sync(fsync=True)
                except OSError as exc:
                    self._fail(exc)
                    raise LogFailed(f"{self.path}: final fsync on close failed: {exc}") from exc
        finally:
            self._release_fds()
            self._wake_durable(
                None if self._failure is None else LogFailed(f"{self.path}: the log failed")
            )
            super().close()

    def _release_fds(self) -> None:
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    def __enter__(self) -> DiskLog:
        return self

    def segment_paths(self) -> list[Path]:
        """The segment files, oldest first."""
        return [Path(s.path) for s in self._segs]

    # -- snapshots and retention ------------------------------------------
    def _housekeeping(self) -> None:
        super()._housekeeping()  # retention first: the snapshot then holds its releases
        if not (self._since_snap >= self._snap_every > 0):
            return
        self._since_snap = 0
        if self._failure is not None or self._fd < 0:
            return
        try:
            self.snapshot()
        except OSError as exc:
            # The log itself is intact; only the reopen will fold more.
            log.error("could not write a snapshot of %s: %s; the log goes on", self.path, exc)

    def _low_water(self) -> int:
        """The first position of the oldest retained request (the fold keeps
        requests in the order they were admitted); ``next_pos`` when none."""
        for rs in self.state.requests.values():
            return rs.admitted_pos if rs.admitted_pos >= 0 else rs.terminal_pos
        return self.state.next_pos

    def snapshot(self) -> Path:
        """Write a snapshot of the fold now (``DIR/snapshots``), then let go of
        the snapshots and segments no longer needed; returns its path.

        Runs every ``snapshot_every`` appends by itself.  The log is synced
        first, so the snapshot never names a position that a crash could
        take back (under ``fsync="none"`` it is only written to the OS)."""
        self._check_usable()
        durable = self._policy != "none"
        self._sync(fsync=durable)
        state = self.state
        next_pos = state.next_pos
        # A log that never released anything keeps every position readable
        # (a restarted server's orchestrator reads it from 0).
        low = self._low_water() if self._released_any else self._ibase
        if low < next_pos:
            si = bisect.bisect_right(self._seg_firsts, low) - 1
            seg_first = self._seg_firsts[si]
            offset = self._offs[low - self._ibase]
        else:
            seg_first = self._active.first_pos
            offset = self._end
        pinned = []
        for p in sorted(self._worker_positions()):
            if p >= 0:
                pinned.append(self._pinned[p] if p < self._ibase else next(self._iter(p, p + 1)))
        retention = self.retention_state() if self.retention_state is not None else None
        snap = SnapshotFile(
            next_pos=next_pos,
            fold=state.snapshot(),
            index_from=low,
            index_segment=seg_first,
            index_offset=offset,
            pinned=tuple(pinned),
            retention=retention,
        )
        snap_dir = self.path / SNAPSHOT_DIR
        path = write_snapshot(snap_dir, snap, fsync=durable)
        self._snaps = [s for s in self._snaps if s[0] != next_pos]
        self._snaps.append((next_pos, low))
        while len(self._snaps) > self.config.keep_snapshots:
            old, _ = self._snaps.pop(0)
            (snap_dir / f"{old:020d}.snap").unlink(missing_ok=True)
        self._compact()
        return path

    def _compact(self) -> None:
        """Let go of the sealed segments every kept snapshot is past: delete
        them (or move them to ``DIR/archive``), oldest first, so a crash
        leaves a suffix of them, which a reopen reads as before."""
        cut = min(low for _, low in self._snaps) if self._snaps else 0
        firsts = self._seg_firsts
        k = 0
        while k < len(self._segs) - 1 and firsts[k + 1] <= cut:
            k += 1
        if not k:
            return
        gone_below = firsts[k]
        keep = self._worker_positions()
        pinned = {p: ev for p, ev in self._pinned.items() if p in keep}
        for p in sorted(keep):
            if self._ibase <= p < gone_below and p not in pinned:
                pinned[p] = next(self._iter(p, p + 1))
        self._pinned = pinned
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        archive = self.path / ARCHIVE_DIR if self.config.archive else None
        if archive is not None:
            archive.mkdir(exist_ok=True)
        for seg in self._segs[:k]:
            src = Path(seg.path)
            if archive is not None:
                os.replace(src, archive / src.name)
            else:
                src.unlink(missing_ok=True)
        if archive is not None and self._policy != "none":
            dfd = os.open(archive, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        if self._policy != "none":
            self._fsync_dir()
        del self._segs[:k]
        del firsts[:k]
        n = gone_below - self._ibase
        if n > 0:
            del self._offs[:n]
            del self._prev[:n]
            self._ibase = gone_below

    @property
    def index_base(self) -> int:
        """The first position the in-memory index covers (0 until retention
        let segments go)."""
        return self._ibase
