"""The segment file format: headers, record framing, scanning, offline reading.

Owns: the bytes of a segment file (the header, each record's framing and
checksum, what a readable format and schema version are), scanning a
segment's records (``iter_records``, which bounds how fast a log opens),
telling a torn tail from damage (``valid_record_after``), listing a
directory's segments (live and archived), ``iter_log`` for reading a log
offline, and the errors a damaged or newer log raises (``CorruptLog``,
``LogFormatError``).

Does not own anything a process keeps open: the write buffer and fsyncs
(``segwriter.py``), reading records by position (``segreader.py``), the
index (``logindex.py``), opening and recovering a directory
(``logrecovery.py``) or letting segments go (``compaction.py``).

Format (all integers little-endian)::

    ROOT/LOCK                          flock'ed by the process that has it open
    ROOT/00000000000000000000.seg      one file per segment, named by first position
      header  24 bytes: b"OMNIXLOG" | u16 format version | u16 flags (0)
                        | u64 first position | u32 crc32 of the 20 bytes before
      record  u32 payload length | u32 crc32(payload) | payload
      payload codec.encode_event(ev): schema version byte + msgpack array
    ROOT/archive/*.seg                 segments retention let go, with LogConfig.archive

Records are contiguous and in position order.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import msgspec

from omnix.events.codec import SchemaError
from omnix.events.types import SCHEMA_VERSION, Event

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "MAX_RECORD",
    "REC_HEADER_SIZE",
    "BadRecord",
    "CorruptLog",
    "LogError",
    "LogFormatError",
    "Segment",
    "all_segments",
    "decode_at",
    "encode_header",
    "fsync_dir",
    "iter_log",
    "iter_records",
    "list_segments",
    "read_header",
    "seg_first",
    "seg_name",
    "valid_record_after",
]

FORMAT_VERSION = 1
MAGIC = b"OMNIXLOG"
_HEADER = struct.Struct("<8sHHQI")
HEADER_SIZE = _HEADER.size  # 24
REC = struct.Struct("<II")
REC_HEADER_SIZE = REC.size  # 8
#: Bound on one record.  Events hold references to blobs, never the blobs,
#: so a record this large can only be damage; recovery uses the bound to
#: tell a plausible record header from garbage, and appends respect it.
MAX_RECORD = 1 << 30
_SCAN_CHUNK = 4 << 20  # bytes read at a time by recovery
ARCHIVE_DIR = "archive"
VERSION_CRC = zlib.crc32(bytes((SCHEMA_VERSION,)))
#: A record header plus the payload's version byte, written in one pack:
#: the payload is codec.encode_event's form without building it as one bytes.
REC_V = struct.Struct("<IIB")
body_encoder = msgspec.msgpack.Encoder()
#: The codec's form is [version byte] + msgpack; records are checked for the
#: version byte here, so the msgpack part goes straight to a typed decoder.
event_decoder = msgspec.msgpack.Decoder(Event)


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


class Segment(msgspec.Struct):
    """One segment file as a log holds it open."""

    first_pos: int
    path: str
    end: int  # logical length: on disk + still in the write buffer


class BadRecord(Exception):
    """A record cut short, of an implausible length or failing its
    checksum, at ``offset``: a torn tail or damage (the caller decides)."""

    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        self.reason = reason


def seg_name(first_pos: int) -> str:
    return f"{first_pos:020d}.seg"


def seg_first(path: Path) -> int:
    """The first position a segment file holds, from its name."""
    return int(path.name[: -len(".seg")])


def encode_header(first_pos: int) -> bytes:
    body = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, first_pos, 0)[:-4]
    return body + struct.pack("<I", zlib.crc32(body))


def read_header(path: Path, data: bytes, expected_pos: int) -> int:
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


def iter_records(f: BinaryIO, size: int, start: int) -> Iterator[tuple[int, int, bytes]]:
    """Yield ``(offset, version, body)`` for each valid record from ``start``.

    ``body`` is the payload without its schema version byte, ready for the
    msgpack decoder.  Raises ``BadRecord`` at the first record that is cut
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
    unpack = REC.unpack_from
    crc32 = zlib.crc32
    cur_version = SCHEMA_VERSION
    cur_crc = VERSION_CRC
    while True:
        n_data = len(data)
        at_eof = base + n_data >= size
        while i + REC_HEADER_SIZE <= n_data:
            n, crc = unpack(data, i)
            j = i + REC_HEADER_SIZE + n
            if n == 0 or n > MAX_RECORD:
                raise BadRecord(base + i, f"implausible record length {n}")
            if j > n_data:
                break
            v = data[i + REC_HEADER_SIZE]
            body = data[i + REC_HEADER_SIZE + 1 : j]
            if crc32(body, cur_crc if v == cur_version else crc32(bytes((v,)))) != crc:
                raise BadRecord(base + i, "record checksum mismatch")
            yield base + i, v, body
            i = j
        if at_eof:
            avail = n_data - i
            if avail == 0:
                return
            if avail < REC_HEADER_SIZE:
                raise BadRecord(base + i, f"record header cut short ({avail} bytes at end of file)")
            n = unpack(data, i)[0]
            raise BadRecord(
                base + i, f"record of {n} bytes cut short ({avail - 8} bytes at end of file)"
            )
        need = REC_HEADER_SIZE + (unpack(data, i)[0] if n_data - i >= REC_HEADER_SIZE else 0)
        data = data[i:] + f.read(max(_SCAN_CHUNK, need - (n_data - i)))
        base += i
        i = 0


def valid_record_after(f: BinaryIO, size: int, offset: int) -> int:
    """The offset of the first valid-looking record after ``offset``, or -1.

    A torn tail is followed by nothing valid; damage in the middle is.
    Each candidate offset is tried as a record header: a plausible length
    that fits the file and a matching crc32 over a payload that starts with
    a schema version byte.  A false match needs a 32-bit checksum collision.
    """
    f.seek(offset + 1)
    data = f.read(size - offset - 1)
    unpack = REC.unpack_from
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


def list_segments(root: Path) -> list[Path]:
    segs = []
    for p in root.glob("*.seg"):
        stem = p.name[: -len(".seg")]
        if not stem.isdigit():
            raise LogError(f"{p}: unexpected file in the log directory (segment names are digits)")
        segs.append((int(stem), p))
    segs.sort()
    return [p for _, p in segs]


def all_segments(root: Path) -> list[Path]:
    """Archived and live segments in position order."""
    archive = root / ARCHIVE_DIR
    paths = list_segments(archive) if archive.is_dir() else []
    live = list_segments(root)
    if paths and live:
        first_live = seg_first(live[0])
        paths = [p for p in paths if seg_first(p) < first_live]
    return paths + live


def decode_at(version: int, body: bytes, path: Path, offset: int, pos: int) -> Event:
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
        return event_decoder.decode(body)
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
    paths = all_segments(root)
    pos = seg_first(paths[0]) if paths else 0
    for k, p in enumerate(paths):
        is_last = k == len(paths) - 1
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(HEADER_SIZE)
            if is_last and size <= HEADER_SIZE:
                # A segment being created (or left half-created by a crash):
                # no record can be in it yet.
                return
            first = read_header(p, head, pos)
            if first != pos:
                raise CorruptLog(p, 0, pos, f"segment starts at position {first}, expected {pos}")
            try:
                for off, v, body in iter_records(f, size, HEADER_SIZE):
                    ev = decode_at(v, body, p, off, pos)
                    if ev.pos != pos:
                        raise CorruptLog(p, off, pos, f"record holds position {ev.pos}")
                    yield ev
                    pos += 1
            except BadRecord as bad:
                if not is_last or valid_record_after(f, size, bad.offset) >= 0:
                    raise CorruptLog(p, bad.offset, pos, bad.reason) from None
                return


def fsync_dir(path: Path) -> None:
    """Make a directory's entries durable: a segment or snapshot created,
    renamed or removed in it."""
    dfd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
