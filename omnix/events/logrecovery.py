"""Opening a disk log directory: which snapshot to start from, what the segments hold.

Owns: ``recover``: choosing the newest snapshot that verifies and fits the
segments on disk (an older one, or position 0, when it does not), reading
and verifying every record from where that snapshot needs the index to
start, cutting a torn tail off the last segment (and removing an empty
segment a torn rotation left), refusing damage anywhere else
(``CorruptLog``), and rebuilding the index and the fold from what it read;
``RecoveryReport``, what it found.

Does not own the record format (``segments.py``), the snapshot format
(``snapshot.py``), the index (``logindex.py``), the rules that validate
each event (the reducer: a stored event it refuses is damage here), nor
writing (``segwriter.py`` goes on where recovery stopped).

A torn tail is the last append(s) before a crash, never acknowledged under
``fsync="always"``: a record cut short, or failing its checksum, with
nothing valid after it in the last segment.  A bad record followed by a
valid one, or in any segment but the last, is damage.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import msgspec

from omnix.events.codec import SchemaError
from omnix.events.logindex import LogIndex
from omnix.events.reducer import Fold, IllegalTransition
from omnix.events.segments import (
    HEADER_SIZE,
    BadRecord,
    CorruptLog,
    LogError,
    Segment,
    decode_at,
    event_decoder,
    fsync_dir,
    iter_records,
    list_segments,
    read_header,
    seg_first,
    seg_name,
    valid_record_after,
)
from omnix.events.snapshot import (
    SNAPSHOT_DIR,
    RetentionState,
    SnapshotFile,
    decode_snapshot,
    snapshot_paths,
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

__all__ = ["Recovered", "RecoveryReport", "recover"]

# The disk log's modules report under one logger.
log = logging.getLogger("omnix.events.disklog")


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


@dataclass(frozen=True, slots=True)
class Recovered:
    """A recovered directory, ready to append to."""

    fold: Fold
    index: LogIndex
    #: the snapshot files kept: (position, first position it needs indexed)
    snaps: list[tuple[int, int]]
    #: retention's accounting at the snapshot used (None: none used)
    retention: RetentionState | None
    snapshot_pos: int  # the position of the snapshot used (0: none)
    report: RecoveryReport


class _Unusable(Exception):
    """A snapshot that verifies but does not fit the segments on disk."""


def recover(root: Path) -> Recovered:
    """Recover the log directory ``root`` (its lock already held)."""
    # Folding a long log allocates millions of short-lived objects and
    # no reference cycles; the cyclic GC's passes over the growing fold
    # would cost about a quarter of the time, so it sleeps meanwhile.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _recover(root)
    finally:
        if gc_was_enabled:
            gc.enable()


def _recover(root: Path) -> Recovered:
    t0 = time.perf_counter()
    paths = list_segments(root)
    snap_dir = root / SNAPSHOT_DIR
    if snap_dir.is_dir():
        for tmp in snap_dir.glob(".tmp-*"):  # a snapshot write a crash cut short
            tmp.unlink(missing_ok=True)
    ignored: list[str] = []
    for cand in reversed(snapshot_paths(snap_dir)):
        try:
            snap = decode_snapshot(cand.read_bytes(), cand)
            if snap.next_pos != int(cand.name.split(".")[0]):
                raise ValueError(f"{cand}: holds position {snap.next_pos}, not the one in its name")
            attempt = _Attempt(root, paths, snap)
            report = attempt.run(str(cand))
        except (OSError, ValueError, _Unusable) as exc:
            if isinstance(exc, SchemaError):
                raise  # a record from a newer omnix: no older snapshot reads it either
            log.warning("ignoring snapshot %s: %s; trying an older one, or the segments", cand, exc)
            ignored.append(f"{cand.name}: {exc}")
            continue
        return attempt.recovered(report, _kept_snapshots(snap_dir, cand, snap), t0, ignored)
    if paths and seg_first(paths[0]) != 0:
        raise CorruptLog(
            paths[0],
            0,
            0,
            f"the log starts at position {seg_first(paths[0])}: retention deleted the "
            "segments before it, and no valid snapshot covers them"
            + (f" ({'; '.join(ignored)})" if ignored else "")
            + ". Restore a snapshot into DIR/snapshots, or the archived segments into DIR",
        )
    attempt = _Attempt(root, paths, None)
    return attempt.recovered(attempt.run(""), [], t0, ignored)


def _kept_snapshots(snap_dir: Path, used: Path, snap: SnapshotFile) -> list[tuple[int, int]]:
    """(position, index_from) of every snapshot file, oldest first: what
    each needs bounds which segments may go.  A file that does not verify
    needs nothing (it will never be used) and is rotated out like the
    others."""
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


class _Attempt:
    """One reading of the segments: from a snapshot, or from position 0."""

    def __init__(self, root: Path, paths: list[Path], snap: SnapshotFile | None) -> None:
        self.root = root
        self.paths = paths
        self.snap = snap
        self.index = LogIndex()
        self.fold = Fold(snap.fold if snap is not None else None)
        self.indexed = 0
        self.removed: list[str] = []
        self.truncated = 0
        self.truncated_at = ""
        self.truncated_reason = ""

    def run(self, snap_name: str) -> RecoveryReport:
        """Fold the segments from the snapshot (or from position 0) on."""
        k0, pos, offset = self._start()
        fold_from = self.snap.next_pos if self.snap is not None else 0
        for k in range(k0, len(self.paths)):
            if k == k0:
                expected = self.snap.index_segment if self.snap is not None else pos
                got = self._read_segment(k, pos, offset, expected, fold_from)
            else:
                got = self._read_segment(k, pos, HEADER_SIZE, pos, fold_from)
            if got is None:
                break  # an empty segment a torn rotation left: removed
            pos = got
        if pos < fold_from:
            raise _Unusable(f"the log ends at position {pos}, before the snapshot's {fold_from}")
        if self.fold.next_pos != pos:  # pragma: no cover - Fold counts what it applies
            raise LogError(f"recovery folded up to {self.fold.next_pos} but read up to {pos}")
        return RecoveryReport(
            segments=len(self.index.segs),
            events=pos,
            truncated_bytes=self.truncated,
            truncated_at=self.truncated_at,
            truncated_reason=self.truncated_reason,
            removed_segments=tuple(self.removed),
            folded=pos - fold_from,
            indexed=self.indexed,
            snapshot=snap_name,
        )

    def recovered(
        self, report: RecoveryReport, snaps: list[tuple[int, int]], t0: float, ignored: list[str]
    ) -> Recovered:
        snap = self.snap
        report = msgspec.structs.replace(
            report, seconds=time.perf_counter() - t0, snapshots_ignored=tuple(ignored)
        )
        return Recovered(
            fold=self.fold,
            index=self.index,
            snaps=snaps,
            retention=snap.retention if snap is not None else None,
            snapshot_pos=snap.next_pos if snap is not None else 0,
            report=report,
        )

    def _start(self) -> tuple[int, int, int]:
        """(the first segment to read, the first position to index, its
        byte offset there).  From a snapshot, the segments wholly before
        the oldest request it retained stay on disk for an older snapshot,
        unread; the next compaction lets them go."""
        snap = self.snap
        if snap is None:
            return 0, 0, HEADER_SIZE
        firsts = [seg_first(p) for p in self.paths]
        if snap.index_segment in firsts:
            k0 = firsts.index(snap.index_segment)
            offset = snap.index_offset
        elif not self.paths and snap.next_pos == 0:
            k0, offset = 0, HEADER_SIZE
        else:
            raise _Unusable(
                f"the segment it reads from ({seg_name(snap.index_segment)}) is missing"
            )
        index = self.index
        index.pinned = {ev.pos: ev for ev in snap.pinned}
        index.released_any = snap.fold.ended_dropped > 0
        for p, first in zip(self.paths[:k0], firsts[:k0], strict=True):
            index.add_segment(Segment(first_pos=first, path=str(p), end=p.stat().st_size))
        index.base = snap.index_from
        return k0, snap.index_from, offset

    def _read_segment(
        self, k: int, pos: int, start: int, expected: int, fold_from: int
    ) -> int | None:
        """Read segment ``k`` from byte ``start`` (position ``pos``); return
        the position after its last record, or None when it was an empty
        segment a torn rotation left (removed)."""
        p = self.paths[k]
        is_last = k == len(self.paths) - 1
        with open(p, "r+b" if is_last else "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(HEADER_SIZE)
            if is_last and size <= HEADER_SIZE and self._torn_rotation(p, head, pos):
                return None
            first = read_header(p, head, pos)
            if first != expected or seg_first(p) != first:
                raise CorruptLog(
                    p,
                    0,
                    pos,
                    f"segment starts at position {first}, expected {expected}: a segment "
                    "is missing or misnamed",
                )
            end = size
            at = [start, pos]  # byte offset and position of the event being read
            try:
                self._fold_records(f, p, size, at, fold_from)
            except BadRecord as bad:
                if not is_last:
                    raise CorruptLog(p, bad.offset, at[1], bad.reason) from None
                end = self._cut_tail(f, p, size, bad, at[1])
            self.indexed += at[1] - pos
        self.index.add_segment(Segment(first_pos=first, path=str(p), end=end))
        return at[1]

    def _torn_rotation(self, p: Path, head: bytes, pos: int) -> bool:
        """A rotation can die after creating the last segment and before
        (fully) writing its header; no record can be in it.  Remove such a
        segment; return whether it was one."""
        try:
            first = read_header(p, head, pos)
        except CorruptLog:
            first = -1
        if first == pos:
            return False
        self.removed.append(p.name)
        log.warning("removing empty segment %s left by a torn rotation", p)
        p.unlink()
        fsync_dir(self.root)
        return True

    def _cut_tail(self, f: BinaryIO, p: Path, size: int, bad: BadRecord, pos: int) -> int:
        """Truncate the last segment at a bad record with nothing valid
        after it (a torn tail); return the segment's new length."""
        follow = valid_record_after(f, size, bad.offset)
        if follow >= 0:
            raise CorruptLog(
                p, bad.offset, pos, f"{bad.reason}, and a valid record follows at byte {follow}"
            ) from None
        end = bad.offset
        self.truncated = size - end
        self.truncated_at = f"{p}:{end}"
        self.truncated_reason = bad.reason
        log.warning(
            "truncating torn tail of %s at byte %d (%d bytes: %s)", p, end, size - end, bad.reason
        )
        f.truncate(end)
        f.flush()
        os.fsync(f.fileno())
        return end

    def _fold_records(self, f: BinaryIO, p: Path, size: int, at: list[int], fold_from: int) -> None:
        try:
            # The fold's bulk path: the same fold, about twice as fast on a
            # log of streamed chunks (Fold.apply_all).
            self.fold.apply_all(self._records(f, p, size, at, fold_from))
        except IllegalTransition as exc:
            raise CorruptLog(
                p,
                at[0],
                exc.event.pos,
                f"the stored event is illegal for this omnix's reducer ({exc})",
            ) from exc

    def _records(
        self, f: BinaryIO, p: Path, size: int, at: list[int], fold_from: int
    ) -> Iterator[Event]:
        """Segment ``p``'s events from byte ``at[0]`` in order, each indexed
        as it is read, those from ``fold_from`` on yielded to be folded
        (the ones before it are in the snapshot's fold: only indexed, and
        only chained for the requests it retained).  ``at`` holds [byte
        offset, position] of the latest one (what an error names) and, at
        the end, the next position.  Raises ``BadRecord`` at a damaged
        record and ``CorruptLog`` at one that decodes to the wrong position."""
        pos = at[1]
        decode = event_decoder.decode
        index = self.index
        add = index.add
        known = self.fold.requests
        for off, v, body in iter_records(f, size, at[0]):
            if v == SCHEMA_VERSION:
                try:
                    ev = decode(body)
                except msgspec.DecodeError:
                    ev = decode_at(v, body, p, off, pos)  # raises CorruptLog
            else:
                ev = decode_at(v, body, p, off, pos)
            if ev.pos != pos:
                raise CorruptLog(p, off, pos, f"record holds position {ev.pos}")
            at[0] = off
            if (
                pos < fold_from
                and type(ev) is not WorkerJoined
                and type(ev) is not WorkerLost
                and type(ev) is not Released
                and type(ev) is not SessionChanged
                and type(ev) is not Scaled
                and ev.request_id not in known
            ):
                # Released before the snapshot: indexed, chained to nothing.
                index.offs.append(off)
                index.prev.append(-1)
            else:
                add(ev, off)
            pos += 1
            at[1] = pos
            if pos > fold_from:
                yield ev
