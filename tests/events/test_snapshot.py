"""Snapshots and retention on disk: a reopen folds a snapshot plus a short
suffix, segments go (or are archived) as the window passes, a damaged
snapshot is reported and skipped, and readers of the directory follow."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from omnix.events.blobs import DiskBlobStore
from omnix.events.clock import ManualClock
from omnix.events.disklog import CorruptLog, DiskLog, LogConfig, iter_log
from omnix.events.log import EventReleased, MemoryLog
from omnix.events.reducer import Fold, fold
from omnix.events.retention import Retention, RetentionPolicy
from omnix.events.snapshot import load_newest, snapshot_paths
from omnix.events.types import Released, WorkerJoined

from .test_retention import MS, lifecycle, start

POLICY = RetentionPolicy(window_s=None, max_requests=20, max_bytes=None)


def config(**kw) -> LogConfig:
    base = {"fsync": "none", "segment_bytes": 16 << 10, "snapshot_every": 1000}
    return LogConfig(**{**base, **kw})


def run(
    root: Path,
    n: int,
    *,
    cfg: LogConfig,
    first: int = 0,
    clock: ManualClock | None = None,
    policy: RetentionPolicy = POLICY,
    blobs: DiskBlobStore | None = None,
) -> tuple[str, int]:
    """Append ``n`` one-stage requests through a DiskLog with retention;
    return the fold's digest and the log's length at close."""
    clock = clock or ManualClock()
    with DiskLog(root, cfg, clock) as log:
        ret = Retention(log, policy, blobs)
        if log.next_pos == 0:
            log.append(WorkerJoined(worker_id="s/0", stage="s", replica=0, engine="x", capacity=8))
        for i in range(first, first + n):
            refs = [blobs.put(f"audio {i}".encode())] if blobs is not None else []
            for ev in lifecycle(f"r{i}", refs):
                log.append(ev)
                clock.advance(MS)
        assert ret.requests_retained <= 20
        return log.state.digest(), log.next_pos


def test_reopen_after_a_long_history_folds_a_short_suffix(tmp_path: Path) -> None:
    root = tmp_path / "log"
    digest, n = run(root, 3000, cfg=config())
    assert n > 3000 * 8
    with DiskLog(root, config()) as log:
        rec = log.recovery
        assert rec.snapshot.endswith(".snap")
        # Only what followed the newest snapshot is folded (<= snapshot_every
        # appends), and only the retained requests' records are read.
        assert rec.folded <= 1000
        assert rec.indexed <= 1000 + 20 * 9 + 50
        assert log.state.digest() == digest and log.next_pos == n
        assert len(log.state.requests) == 20
        ret = Retention(log, POLICY)
        assert ret.requests_retained == 20 and ret.status("r0") == "released"
        assert ret.status("r2999") == "retained"
        assert type(log.events_for("r2999")[0]).__name__ == "Admitted"
        assert log.events_for("r5") == []
        with pytest.raises(EventReleased):
            log.get(log.index_base)
        # The worker's join is kept for readers (a trace exports it).
        assert type(log.get(0)) is WorkerJoined
        # Appending goes on, and a second reopen agrees.
        for ev in lifecycle("after", []):
            log.append(ev)
        digest2 = log.state.digest()
    with DiskLog(root, config()) as log:
        assert log.state.digest() == digest2


def test_segments_go_as_the_window_passes(tmp_path: Path) -> None:
    root = tmp_path / "log"
    run(root, 300, cfg=config())
    before = sorted(p.name for p in root.glob("*.seg"))
    run(root, 3000, cfg=config(), first=300)
    after = sorted(p.name for p in root.glob("*.seg"))
    assert before[0] not in after
    # Disk use is bounded by the window: a few segments, not the history.
    total = sum(p.stat().st_size for p in root.glob("*.seg"))
    assert total < 8 * (16 << 10)
    assert len(snapshot_paths(root / "snapshots")) == 2
    # Offline readers start at the first segment left.
    events = list(iter_log(root))
    assert events[0].pos == int(after[0][:-4])


def test_archived_segments_stay_readable(tmp_path: Path) -> None:
    root = tmp_path / "log"
    digest, n = run(root, 2000, cfg=config(archive=True))
    archived = sorted((root / "archive").glob("*.seg"))
    assert archived and archived[0].name == f"{0:020d}.seg"
    events = list(iter_log(root))
    assert [ev.pos for ev in events] == list(range(n))
    # The whole history folds from the archive: releases included.
    assert fold(events).digest() == digest
    # An offline reader that keeps released requests (trace export from an
    # archive) folds every request of the history.
    whole = MemoryLog(events=events, keep_released=True)
    assert len(whole.state.requests) == 2000 and whole.next_pos == n
    assert len(whole.events_for("r0")) == 8


def test_blobs_of_released_requests_are_deleted_on_disk(tmp_path: Path) -> None:
    blobs = DiskBlobStore(tmp_path / "blobs")
    run(tmp_path / "log", 200, cfg=config(), blobs=blobs)
    assert len(blobs.digests()) <= 21  # the retained requests' own (one may wait a release)


def test_a_flipped_byte_snapshot_is_reported_and_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "log"
    digest, n = run(root, 1500, cfg=config())
    newest = snapshot_paths(root / "snapshots")[-1]
    raw = bytearray(newest.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    newest.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="omnix.events.disklog"):
        with DiskLog(root, config()) as log:
            rec = log.recovery
            assert log.state.digest() == digest and log.next_pos == n
    assert rec.snapshots_ignored and newest.name in rec.snapshots_ignored[0]
    assert "digest mismatch" in rec.snapshots_ignored[0]
    assert rec.snapshot and Path(rec.snapshot).name != newest.name  # the older one
    assert any(newest.name in r.getMessage() for r in caplog.records)
    # The offline loader reports it too.
    snap, path, skipped = load_newest(root / "snapshots")
    assert snap is not None and path is not None and path.name != newest.name and skipped


def test_no_snapshot_and_no_deletion_folds_every_segment(tmp_path: Path) -> None:
    root = tmp_path / "log"
    digest, n = run(root, 300, cfg=config(snapshot_every=0))
    assert not snapshot_paths(root / "snapshots")
    with DiskLog(root, config(snapshot_every=0)) as log:
        assert log.recovery.folded == n and log.state.digest() == digest


def test_every_snapshot_damaged_after_deletion_is_refused_clearly(tmp_path: Path) -> None:
    root = tmp_path / "log"
    run(root, 2000, cfg=config())
    for p in snapshot_paths(root / "snapshots"):
        raw = bytearray(p.read_bytes())
        raw[-1] ^= 0xFF
        p.write_bytes(bytes(raw))
    with pytest.raises(CorruptLog, match="no valid snapshot covers them"):
        DiskLog(root, config())


def test_a_leftover_temporary_snapshot_is_removed(tmp_path: Path) -> None:
    root = tmp_path / "log"
    digest, _ = run(root, 200, cfg=config())
    tmp = root / "snapshots" / ".tmp-crashed"
    tmp.write_bytes(b"half a snapshot")
    with DiskLog(root, config()) as log:
        assert log.state.digest() == digest
    assert not tmp.exists()


def test_in_flight_requests_survive_snapshots_and_deletion(tmp_path: Path) -> None:
    root = tmp_path / "log"
    clock = ManualClock()
    with DiskLog(root, config(), clock) as log:
        Retention(log, POLICY)
        for ev in start("long"):
            log.append(ev)
        for i in range(2000):
            for ev in lifecycle(f"r{i}", []):
                log.append(ev)
        first_segments = sorted(root.glob("*.seg"))
    # The long request pins the segment holding its start: nothing before
    # or after it that is still needed was let go.
    with DiskLog(root, config(), clock) as log:
        assert log.state.requests["long"].status == "running"
        assert [type(e).__name__ for e in log.events_for("long")] == [
            "Admitted",
            "Routed",
            "StageStarted",
        ]
        assert sorted(root.glob("*.seg")) == first_segments
        assert log.index_base == 0


def test_a_fold_snapshot_round_trips_released_bookkeeping() -> None:
    f = Fold()
    evs = [*lifecycle("a", []), *lifecycle("b", [])]
    for i, ev in enumerate(evs):
        f.apply(ev.__class__(**{**{k: getattr(ev, k) for k in ev.__struct_fields__}, "pos": i}))
    f.apply(Released(request_ids=("a",), reason="count", pos=len(evs)))
    g = Fold(f.snapshot())
    assert g.ended == ["b"] and g.ended_dropped == 1 and g.digest() == f.digest()


def test_snapshot_files_are_not_pickles(tmp_path: Path) -> None:
    root = tmp_path / "log"
    run(root, 1200, cfg=config())
    data = snapshot_paths(root / "snapshots")[-1].read_bytes()
    assert data[:8] == b"OMNIXSNP" and b"\x80\x04\x95" not in data[:64]
    assert os.path.getsize(snapshot_paths(root / "snapshots")[-1]) < 64 << 10
