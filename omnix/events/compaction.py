"""A disk log's snapshots and the segments they let go.

Owns: ``Compaction``: taking a snapshot of a disk log (what it holds: the
fold, where the index must start again on reopen, the workers' events
below that point, retention's accounting), keeping the newest
``keep_snapshots`` of them, and letting go of the sealed segments every
kept snapshot is past: deleted, or with ``LogConfig.archive`` moved to
``DIR/archive/`` (``iter_log`` reads them there).

Does not own the snapshot file format (``snapshot.py``), when a snapshot
is due (``DiskLog`` counts appends), which requests are released
(``retention.py`` decides, the fold drops them), nor reading a directory
back from a snapshot (``logrecovery.py``).
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path

from omnix.events.logindex import LogIndex
from omnix.events.reducer import Fold
from omnix.events.segments import ARCHIVE_DIR, fsync_dir
from omnix.events.segreader import SegmentReader
from omnix.events.snapshot import (
    SNAPSHOT_DIR,
    RetentionState,
    SnapshotFile,
    snapshot_name,
    write_snapshot,
)
from omnix.events.types import Event

__all__ = ["Compaction", "low_water"]


def low_water(state: Fold) -> int:
    """The first position of the oldest retained request (the fold keeps
    requests in the order they were admitted); ``next_pos`` when none."""
    for rs in state.requests.values():
        return rs.admitted_pos if rs.admitted_pos >= 0 else rs.terminal_pos
    return state.next_pos


class Compaction:
    """Snapshots of the log under ``root`` and the segments they let go.

    ``snaps``: the snapshot files kept, oldest first, as (the position each
    was taken at, the first position it needs indexed), what recovery found
    on open.  ``durable``: whether files and directories are fsynced (every
    fsync policy but ``"none"``)."""

    def __init__(
        self,
        root: Path,
        index: LogIndex,
        reader: SegmentReader,
        snaps: list[tuple[int, int]],
        *,
        keep: int,
        archive: bool,
        durable: bool,
    ) -> None:
        self.root = root
        self.index = index
        self.reader = reader
        self.snaps = snaps
        self.keep = keep
        self.archive = archive
        self.durable = durable

    def take(
        self,
        state: Fold,
        workers: set[int],
        retention: RetentionState | None,
        active_end: int,
    ) -> Path:
        """Write a snapshot of ``state`` (the log written out to its end,
        ``active_end`` bytes into the last segment), with the events at the
        ``workers`` positions, and rotate the old snapshots out; returns its
        path.  The segments it lets go are ``let_go``'s."""
        index = self.index
        next_pos = state.next_pos
        # A log that never released anything keeps every position readable
        # (a restarted server's orchestrator reads it from 0).
        low = low_water(state) if index.released_any else index.base
        if low < next_pos:
            si = bisect.bisect_right(index.firsts, low) - 1
            seg_first = index.firsts[si]
            offset = index.offs[low - index.base]
        else:
            seg_first = index.firsts[-1]
            offset = active_end
        pinned = []
        for p in sorted(workers):
            if p >= 0:
                pinned.append(index.pinned[p] if p < index.base else self.reader.event(p))
        snap = SnapshotFile(
            next_pos=next_pos,
            fold=state.snapshot(),
            index_from=low,
            index_segment=seg_first,
            index_offset=offset,
            pinned=tuple(pinned),
            retention=retention,
        )
        snap_dir = self.root / SNAPSHOT_DIR
        path = write_snapshot(snap_dir, snap, fsync=self.durable)
        self.snaps = [s for s in self.snaps if s[0] != next_pos]
        self.snaps.append((next_pos, low))
        while len(self.snaps) > self.keep:
            old, _ = self.snaps.pop(0)
            (snap_dir / snapshot_name(old)).unlink(missing_ok=True)
        return path

    def let_go(self, workers: set[int]) -> None:
        """Let go of the sealed segments every kept snapshot is past: delete
        them (or move them to ``DIR/archive``), oldest first, so a crash
        leaves a suffix of them, which a reopen reads as before.  The
        events at the ``workers`` positions among them stay readable."""
        index = self.index
        cut = min(low for _, low in self.snaps) if self.snaps else 0
        firsts = index.firsts
        k = 0
        while k < len(index.segs) - 1 and firsts[k + 1] <= cut:
            k += 1
        if not k:
            return
        self._pin(workers, firsts[k])
        self.reader.forget()
        archive = self.root / ARCHIVE_DIR if self.archive else None
        if archive is not None:
            archive.mkdir(exist_ok=True)
        for seg in index.segs[:k]:
            src = Path(seg.path)
            if archive is not None:
                os.replace(src, archive / src.name)
            else:
                src.unlink(missing_ok=True)
        if archive is not None and self.durable:
            fsync_dir(archive)
        if self.durable:
            fsync_dir(self.root)
        index.drop_segments(k)

    def _pin(self, workers: set[int], gone_below: int) -> None:
        """Keep the workers' events below ``gone_below`` in the index (read
        now, while their segments are there); forget the other pinned ones."""
        index = self.index
        pinned: dict[int, Event] = {p: ev for p, ev in index.pinned.items() if p in workers}
        for p in sorted(workers):
            if index.base <= p < gone_below and p not in pinned:
                pinned[p] = self.reader.event(p)
        index.pinned = pinned
