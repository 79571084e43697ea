"""Snapshot files: the fold (and what a reopen needs beside it) at a log position.

Owns: the snapshot file format (``SnapshotFile``, ``RetentionState``,
``RequestAccount``), writing one atomically (``write_snapshot``: temporary
file, fsync, rename, fsync of the directory) and finding the newest valid
one (``load_newest``: a damaged file is reported on the
``omnix.events.snapshot`` logger, naming it, and skipped).  Does not own
when snapshots are taken or which segments they let go (``disklog.py``),
nor what retention decides (``retention.py``).

A snapshot is msgspec msgpack, never pickle::

    DIR/snapshots/00000000000001234567.snap    named by the position it was taken at
      8 bytes  magic b"OMNIXSNP"
      2 bytes  format version (1), little-endian
      2 bytes  flags (0)
     16 bytes  blake2b-128 of the body
      n bytes  body: msgpack(SnapshotFile)

The digest covers every byte of the body, so a flipped byte anywhere is
found; a file cut short (a crash while writing) cannot be under its final
name, because the name is only given (``rename``) once the bytes are
fsynced.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import tempfile
from pathlib import Path

import msgspec

from omnix.events.reducer import Snapshot
from omnix.events.segments import fsync_dir
from omnix.events.types import Event

__all__ = [
    "SNAPSHOT_DIR",
    "SNAPSHOT_FORMAT_VERSION",
    "RequestAccount",
    "RetentionState",
    "SnapshotFile",
    "load_newest",
    "snapshot_name",
    "snapshot_paths",
    "write_snapshot",
]

log = logging.getLogger("omnix.events.snapshot")

SNAPSHOT_FORMAT_VERSION = 1
#: Where a disk log keeps its snapshots, under its directory.
SNAPSHOT_DIR = "snapshots"
_MAGIC = b"OMNIXSNP"
_HEAD = struct.Struct("<8sHH16s")
SUFFIX = ".snap"


class RequestAccount(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What retention counts for one retained request (``retention.py``)."""

    request_id: str
    events: int
    nbytes: int  # approximate encoded bytes of its events
    #: (digest, nbytes) of every blob reference its events hold, in log order
    blobs: tuple[tuple[str, int], ...] = ()
    ended_ts: int = 0  # its terminal event's ts_ns; 0 while in flight


class RetentionState(msgspec.Struct, frozen=True):
    """Retention's accounting at the snapshot's position."""

    #: retained requests: in flight first (first-event order), then ended
    #: ones in the order they ended
    requests: tuple[RequestAccount, ...] = ()
    #: released request ids, oldest first (the capped tombstone set)
    tombstones: tuple[str, ...] = ()


class SnapshotFile(msgspec.Struct, frozen=True):
    """Everything a reopen needs to fold only the suffix from ``next_pos``."""

    next_pos: int
    fold: Snapshot
    #: the first position the log must still index (the oldest retained
    #: request's first event: its low-water mark), and where that record
    #: starts: the segment's first position and the byte offset in it
    index_from: int
    index_segment: int
    index_offset: int
    #: the events the fold's workers point at (latest join and loss), for
    #: readers of positions whose segments are gone
    pinned: tuple[Event, ...] = ()
    retention: RetentionState | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(SnapshotFile)


def snapshot_name(pos: int) -> str:
    """The file name of the snapshot taken at ``pos``."""
    return f"{pos:020d}{SUFFIX}"


def snapshot_paths(root: Path) -> list[Path]:
    """Snapshot files under ``root`` (the ``snapshots`` directory), oldest first."""
    if not root.is_dir():
        return []
    found = []
    for p in root.glob(f"*{SUFFIX}"):
        stem = p.name[: -len(SUFFIX)]
        if stem.isdigit():
            found.append((int(stem), p))
    found.sort()
    return [p for _, p in found]


def encode_snapshot(snap: SnapshotFile) -> bytes:
    body = _encoder.encode(snap)
    digest = hashlib.blake2b(body, digest_size=16).digest()
    return _HEAD.pack(_MAGIC, SNAPSHOT_FORMAT_VERSION, 0, digest) + body


def decode_snapshot(data: bytes, path: Path | str = "<bytes>") -> SnapshotFile:
    """Decode and verify one snapshot file's bytes; ``ValueError`` says what is wrong."""
    if len(data) < _HEAD.size:
        raise ValueError(f"{path}: snapshot cut short ({len(data)} bytes)")
    magic, version, _flags, digest = _HEAD.unpack_from(data)
    if magic != _MAGIC:
        raise ValueError(f"{path}: not an omnix snapshot (bad magic)")
    if version > SNAPSHOT_FORMAT_VERSION or version == 0:
        raise ValueError(
            f"{path}: snapshot format version {version} is not readable by this omnix "
            f"(reads 1..{SNAPSHOT_FORMAT_VERSION})"
        )
    body = memoryview(data)[_HEAD.size :]
    if hashlib.blake2b(body, digest_size=16).digest() != digest:
        raise ValueError(f"{path}: snapshot digest mismatch (the file is damaged)")
    try:
        return _decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise ValueError(f"{path}: snapshot does not decode: {exc}") from exc


def write_snapshot(root: Path, snap: SnapshotFile, *, fsync: bool = True) -> Path:
    """Write ``snap`` as ``root/<next_pos>.snap`` atomically; return its path.

    The bytes go to a temporary file in ``root``, are fsynced, and only then
    renamed to the final name (and the directory fsynced): a crash leaves
    either the whole snapshot or a ``.tmp-`` file that ``load_newest``
    ignores and removes."""
    root.mkdir(parents=True, exist_ok=True)
    data = encode_snapshot(snap)
    dest = root / snapshot_name(snap.next_pos)
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if fsync:
        fsync_dir(root)
    return dest


def load_newest(
    root: Path, *, clean: bool = False
) -> tuple[SnapshotFile | None, Path | None, list[str]]:
    """The newest snapshot under ``root`` that verifies, its path, and the
    files skipped (each reported as a warning naming it and why).

    With ``clean`` (the log's owner opening it), leftover temporary files of
    an interrupted write are removed."""
    if clean and root.is_dir():
        for tmp in root.glob(".tmp-*"):
            tmp.unlink(missing_ok=True)
    skipped: list[str] = []
    for p in reversed(snapshot_paths(root)):
        try:
            snap = decode_snapshot(p.read_bytes(), p)
            if snap.next_pos != int(p.name[: -len(SUFFIX)]):
                raise ValueError(f"{p}: holds position {snap.next_pos}, not the one in its name")
        except (OSError, ValueError) as exc:
            log.warning("ignoring snapshot %s: %s; using an older one or the segments", p, exc)
            skipped.append(f"{p}: {exc}")
            continue
        return snap, p, skipped
    return None, None, skipped
