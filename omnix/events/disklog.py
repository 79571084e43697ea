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
from omnix.events.log import EventLog, LogClosed
from omnix.events.reducer import IllegalTransition
from omnix.events.types import SCHEMA_VERSION, Event, WorkerJoined, WorkerLost

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

    def __post_init__(self) -> None:
        if self.fsync not in ("always", "batch", "none"):
            raise ValueError(f"fsync must be 'always', 'batch' or 'none', not {self.fsync!r}")
        if not self.batch_interval_ms > 0:
            raise ValueError(f"batch_interval_ms must be > 0, got {self.batch_interval_ms}")
        if self.segment_bytes < 4096:
            raise ValueError(f"segment_bytes must be at least 4096, got {self.segment_bytes}")
        if self.write_buffer_bytes < 1:
            raise ValueError(f"write_buffer_bytes must be >= 1, got {self.write_buffer_bytes}")


class RecoveryReport(msgspec.Struct, frozen=True):
    """What opening the log found (``DiskLog.recovery``)."""

    segments: int
    events: int
    truncated_bytes: int = 0  # torn tail cut off the last segment
    truncated_at: str = ""  # "FILE:OFFSET" of the cut, "" when none
    truncated_reason: str = ""
    removed_segments: tuple[str, ...] = ()  # empty segments left by a torn rotation
    seconds: float = 0.0


class _Segment(msgspec.Struct):
    first_pos: int
    path: str
    end: int  # logical length: on disk + still in the write buffer


# --------------------------------------------------------------------------
# Scanning (shared by recovery and iter_log)
# --------------------------------------------------------------------------


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
                raise _BadRecord(base + i, f"record header cut short ({avail} bytes at end of file)")
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
    """
    root = Path(path)
    paths = _list_segments(root)
    pos = 0
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
        pos = 0
        removed: list[str] = []
        truncated = 0
        truncated_at = ""
        truncated_reason = ""
        state = self.state
        apply_all = state.apply_all
        for k, p in enumerate(paths):
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
                if first != pos or int(p.name[:-4]) != first:
                    raise CorruptLog(
                        p, 0, pos,
                        f"segment starts at position {first}, expected {pos}: a segment "
                        "is missing or misnamed",
                    )
                end = size
                at = [0, pos]  # byte offset and position of the event being folded
                try:
                    try:
                        # The fold's bulk path: the same fold, about twice as
                        # fast on a log of streamed chunks (Fold.apply_all).
                        apply_all(self._segment_events(f, p, size, at))
                    except IllegalTransition as exc:
                        raise CorruptLog(
                            p, at[0], exc.event.pos,
                            f"the stored event is illegal for this omnix's reducer ({exc})",
                        ) from exc
                    pos = at[1]
                except _BadRecord as bad:
                    pos = at[1]
                    if not is_last:
                        raise CorruptLog(p, bad.offset, pos, bad.reason) from None
                    follow = _valid_record_after(f, size, bad.offset)
                    if follow >= 0:
                        raise CorruptLog(
                            p, bad.offset, pos,
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
                        p, end, truncated, bad.reason,
                    )
                    f.truncate(end)
                    f.flush()
                    os.fsync(f.fileno())
                self._segs.append(_Segment(first_pos=first, path=str(p), end=end))
                self._seg_firsts.append(first)
        if state.next_pos != pos:  # pragma: no cover - Fold counts what it applies
            raise LogError(f"recovery folded {state.next_pos} events but read {pos}")
        self._buffered_pos = self._written_pos = self._durable_pos = pos
        return RecoveryReport(
            segments=len(self._segs),
            events=pos,
            truncated_bytes=truncated,
            truncated_at=truncated_at,
            truncated_reason=truncated_reason,
            removed_segments=tuple(removed),
            seconds=time.perf_counter() - t0,
        )

    def _segment_events(self, f: BinaryIO, p: Path, size: int, at: list[int]) -> Iterator[Event]:
        """Recovery: segment ``p``'s events in order, each indexed as it is
        read.  ``at`` holds [byte offset, position] of the latest one (what
        an error names) and, at the end, the next position.  Raises
        ``_BadRecord`` at a damaged record and ``CorruptLog`` at a record
        that decodes to the wrong position."""
        pos = at[1]
        decode = _event_decoder.decode
        offs_append = self._offs.append
        prev_append = self._prev.append
        last = self._last
        last_get = last.get
        for off, v, body in _iter_records(f, size, HEADER_SIZE):
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
            else:
                rid = ev.request_id
                prev_append(last_get(rid, -1))
                last[rid] = pos
            pos += 1
            at[1] = pos
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
        else:
            rid = ev.request_id
            last = self._last
            self._prev.append(last.get(rid, -1))
            last[rid] = pos
        self._end = end + rec_len
        buf = self._buf
        buf += _REC_V.pack(rec_len - REC_HEADER_SIZE, zlib.crc32(body, _VERSION_CRC), SCHEMA_VERSION)
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
        return self._iter(max(start, 0), stop)

    def get(self, pos: int) -> Event:
        if not 0 <= pos < self.state.next_pos:
            raise IndexError(f"no event at position {pos} (log has {self.state.next_pos})")
        for ev in self._iter(pos, pos + 1):
            return ev
        raise AssertionError("unreachable")  # pragma: no cover

    def _positions(self, request_id: str) -> list[int]:
        p = self._last.get(request_id, -1)
        out = []
        prev = self._prev
        while p >= 0:
            out.append(p)
            p = prev[p]
        out.reverse()
        return out

    def _positions_since(self, request_id: str, start: int) -> list[int]:
        # Walks back only over the new positions: a subscriber tailing one
        # long request costs O(new events) per wake, not O(all its events).
        p = self._last.get(request_id, -1)
        out = []
        prev = self._prev
        while p >= start:
            out.append(p)
            p = prev[p]
        out.reverse()
        return out

    # -- reading ----------------------------------------------------------
    def _iter(self, start: int, stop: int) -> Iterator[Event]:
        offs = self._offs
        firsts = self._seg_firsts
        unpack = _REC.unpack_from
        decode = _event_decoder.decode
        pos = start
        while pos < stop:
            si = bisect.bisect_right(firsts, pos) - 1
            seg_stop = firsts[si + 1] if si + 1 < len(firsts) else stop
            seg_stop = min(seg_stop, stop)
            # One pread per window of about _READ_WINDOW bytes.
            a = offs[pos]
            q = bisect.bisect_right(offs, a + _READ_WINDOW, pos + 1, seg_stop)
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
        if q < len(self._offs) and (nxt is None or q < nxt):
            return self._offs[q]
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
