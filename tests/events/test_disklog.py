"""DiskLog: format, rotation, reads, indexes, recovery, durability policies."""

from __future__ import annotations

import asyncio
import os
import struct
import zlib
from pathlib import Path

import msgspec
import pytest

from omnix.events.clock import ManualClock
from omnix.events.codec import encode_event
from omnix.events.disklog import (
    HEADER_SIZE,
    CorruptLog,
    DiskLog,
    LogConfig,
    LogFailed,
    LogLocked,
    iter_log,
)
from omnix.events.log import LogClosed, MemoryLog
from omnix.events.reducer import IllegalTransition
from omnix.events.types import (
    Admitted,
    Chunk,
    Released,
    RequestSpec,
    Routed,
    StageStarted,
    WorkerJoined,
    WorkerLost,
)
from tests.events.conftest import interleaved, request_events
from tests.waiting import wait_until

SMALL = LogConfig(fsync="none", segment_bytes=4096)


def fill(log, n_requests: int = 40, chunks: int = 3):
    for ev in interleaved(n_requests, chunks):
        log.append(ev)
    return list(log.read())


def segs(root: Path) -> list[Path]:
    return sorted(root.glob("*.seg"))


def records(seg: Path) -> list[tuple[int, int]]:
    """(offset, total length) of every record in a segment."""
    data = seg.read_bytes()
    out, i = [], HEADER_SIZE
    while i + 8 <= len(data):
        n = struct.unpack_from("<I", data, i)[0]
        out.append((i, 8 + n))
        i += 8 + n
    return out


# -- format, rotation, reads ------------------------------------------------


def test_rotation_and_segment_headers(tmp_path: Path) -> None:
    with DiskLog(tmp_path, SMALL, clock=ManualClock()) as log:
        events = fill(log)
        paths = log.segment_paths()
    assert len(paths) > 3, "4 KiB segments rotate"
    assert paths == segs(tmp_path)
    first = 0
    for p in paths:
        assert p.stat().st_size <= 4096 + 200
        raw = p.read_bytes()
        magic, version, flags, first_pos, crc = struct.unpack_from("<8sHHQI", raw)
        assert (magic, version, flags) == (b"OMNIXLOG", 1, 0)
        assert zlib.crc32(raw[:20]) == crc
        assert first_pos == first == int(p.stem)
        first += len(records(p))
    assert first == len(events)
    # Each record is [u32 length][u32 crc32(payload)][codec.encode_event(ev)].
    pos = 0
    for p in paths:
        raw = p.read_bytes()
        for off, total in records(p):
            n, crc = struct.unpack_from("<II", raw, off)
            payload = raw[off + 8 : off + total]
            assert n == len(payload) and crc == zlib.crc32(payload)
            assert payload == encode_event(events[pos])
            pos += 1


def test_read_from_any_position_matches_memory_log(tmp_path: Path) -> None:
    mem = MemoryLog(clock=ManualClock())
    with DiskLog(tmp_path, SMALL, clock=ManualClock()) as log:
        events = fill(log)
        fill(mem)
        assert events == list(mem.read())
        n = len(events)
        for start in (0, 1, 17, n // 2, n - 1, n, n + 5):
            assert list(log.read(start)) == events[start:]
        for start, stop in ((3, 9), (0, 1), (100, 300), (n - 3, n + 10), (50, 50)):
            assert list(log.read(start, stop)) == events[start:stop]
        for pos in (0, 99, n - 1):
            assert log.get(pos) == events[pos]
        with pytest.raises(IndexError, match=f"no event at position {n} \\(log has {n}\\)"):
            log.get(n)
    with DiskLog(tmp_path, SMALL) as again:  # the same after reopening
        assert list(again.read(123, 200)) == events[123:200]


def test_read_sees_buffered_events(tmp_path: Path) -> None:
    # Under "batch" the newest records are still in the user-space buffer.
    cfg = LogConfig(fsync="batch", batch_interval_ms=60_000)
    with DiskLog(tmp_path, cfg, clock=ManualClock()) as log:
        evs = request_events("r", chunks=2)
        for ev in evs:
            log.append(ev)
        assert log.written_pos == 0 and log.durable_pos == 0
        assert [e.pos for e in log.read()] == list(range(len(evs)))
        assert log.get(3).request_id == "r"  # type: ignore[union-attr]


def test_request_index(tmp_path: Path) -> None:
    with DiskLog(tmp_path, SMALL, clock=ManualClock()) as log:
        events = fill(log, n_requests=30)
        log.append(WorkerJoined(worker_id="w/0", stage="w", replica=0, engine="x", capacity=1))
        want = [e for e in events if e.request_id == "req-7"]
        assert log.events_for("req-7") == want
        assert log.positions_for("req-7") == [e.pos for e in want]
        assert log.positions_for("nope") == [] and log.events_for("nope") == []
    with DiskLog(tmp_path, SMALL) as again:  # rebuilt on open
        assert again.events_for("req-7") == want


def test_appends_index_as_a_reopen_does(tmp_path: Path) -> None:
    # The append path indexes each record inline (segwriter.py), a reopen
    # through LogIndex.add: the two must build the same index.
    joined = WorkerJoined(
        worker_id="thinker/0", stage="thinker", replica=0, engine="scripted", capacity=4
    )
    with DiskLog(tmp_path, SMALL, clock=ManualClock()) as log:
        log.append(joined)
        fill(log, 12, chunks=2)
        log.append(Released(request_ids=("req-0", "req-3", "req-7"), reason="count"))
        log.append(WorkerLost(worker_id="thinker/0", stage="thinker", replica=0, reason="gone"))
        for ev in interleaved(5, chunks=1):
            log.append(msgspec.structs.replace(ev, request_id="more-" + ev.request_id))
        index = log._index
        live = (list(index.offs), list(index.prev), dict(index.last), index.released_any)
        assert len(index.segs) > 1 and index.released_any
    with DiskLog(tmp_path, SMALL) as again:
        index = again._index
        assert (list(index.offs), list(index.prev), dict(index.last), index.released_any) == live


def test_state_is_rebuilt_on_open(tmp_path: Path) -> None:
    with DiskLog(tmp_path, SMALL, clock=ManualClock()) as log:
        fill(log)
        log.append(request_events("open-one")[0])
        digest = log.state.digest()
        n = len(log)
    with DiskLog(tmp_path, SMALL, clock=ManualClock()) as again:
        assert again.state.digest() == digest and len(again) == n
        assert again.state.requests["open-one"].status == "admitted"
        # ... and it keeps validating against the rebuilt state.
        with pytest.raises(IllegalTransition, match="req-3: illegal chunk"):
            again.append(
                Chunk(request_id="req-3", stage="thinker", replica=0, index=3, modality="text")
            )
        again.append(request_events("open-one")[1])
        assert again.recovery.events == n


def test_iter_log_reads_beside_a_live_writer(tmp_path: Path) -> None:
    with DiskLog(tmp_path, SMALL, clock=ManualClock()) as log:
        events = fill(log)
        log.sync()
        assert list(iter_log(tmp_path)) == events
        # A half-written record at the tail (a writer mid-append) ends the
        # iteration quietly, and is not cut off: iter_log never writes.
        last = segs(tmp_path)[-1]
        size = last.stat().st_size
        with last.open("ab") as f:
            f.write(b"\x40\x00\x00\x00\x12")
        assert list(iter_log(tmp_path)) == events
        assert last.stat().st_size == size + 5
        os.truncate(last, size)


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    with DiskLog(tmp_path, SMALL):
        with pytest.raises(LogLocked, match=f"already open \\(held by pid {os.getpid()}\\)"):
            DiskLog(tmp_path, SMALL)
    DiskLog(tmp_path, SMALL).close()  # released on close


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="fsync must be"):
        LogConfig(fsync="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_interval_ms must be > 0"):
        LogConfig(batch_interval_ms=0)
    with pytest.raises(ValueError, match="segment_bytes must be at least 4096"):
        LogConfig(segment_bytes=100)


def test_close_is_idempotent_and_reads_still_work(tmp_path: Path) -> None:
    log = DiskLog(tmp_path, LogConfig(fsync="batch"), clock=ManualClock())
    events = fill(log, n_requests=5)
    log.close()
    log.close()
    assert log.durable_pos == len(events)
    assert list(log.read()) == events
    with pytest.raises(LogClosed):
        log.append(request_events("late")[0])


# -- recovery --------------------------------------------------------------


def _closed_log(root: Path, n_requests: int = 40) -> list:
    with DiskLog(root, SMALL, clock=ManualClock()) as log:
        return fill(log, n_requests)


@pytest.mark.parametrize("cut", [1, 5, 8, 9, -1])
def test_torn_tail_is_truncated(tmp_path: Path, cut: int) -> None:
    events = _closed_log(tmp_path)
    last = segs(tmp_path)[-1]
    off, length = records(last)[-1]
    keep = off + (cut if cut > 0 else length - 1)
    os.truncate(last, keep)  # the last append died part-way through
    with DiskLog(tmp_path, SMALL) as log:
        assert log.recovery.truncated_bytes == keep - off
        assert log.recovery.truncated_at == f"{last}:{off}"
        assert list(log.read()) == events[:-1]
        log.append(events[-1])  # the log goes on from there
    assert last.stat().st_size == off + length


def test_torn_tail_of_zeros_is_truncated(tmp_path: Path) -> None:
    # A crash after the file grew but before the data landed: zeros.
    events = _closed_log(tmp_path)
    last = segs(tmp_path)[-1]
    with last.open("ab") as f:
        f.write(bytes(1 << 20))  # a whole write buffer's worth
    with DiskLog(tmp_path, SMALL) as log:
        assert log.recovery.truncated_bytes == 1 << 20
        assert list(log.read()) == events


def test_bad_checksum_on_the_last_record_is_a_torn_tail(tmp_path: Path) -> None:
    events = _closed_log(tmp_path)
    last = segs(tmp_path)[-1]
    off, length = records(last)[-1]
    _flip(last, off + length - 2)
    with DiskLog(tmp_path, SMALL) as log:
        assert "checksum" in log.recovery.truncated_reason
        assert list(log.read()) == events[:-1]


def _flip(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x5A
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("where", ["payload", "length", "crc"])
def test_damage_in_the_middle_of_the_last_segment_is_refused(tmp_path: Path, where: str) -> None:
    _closed_log(tmp_path)
    last = segs(tmp_path)[-1]
    recs = records(last)
    assert len(recs) > 4
    off, length = recs[len(recs) // 2]
    _flip(last, {"payload": off + 8 + length // 2, "length": off + 1, "crc": off + 5}[where])
    before = last.read_bytes()
    with pytest.raises(CorruptLog) as info:
        DiskLog(tmp_path, SMALL)
    err = info.value
    assert err.path == str(last) and err.offset == off
    assert err.pos == int(last.stem) + len(recs) // 2
    assert f"{last} at byte {off} (position {err.pos})" in str(err)
    assert "valid record follows" in str(err)
    assert last.read_bytes() == before, "a refused log is left as it was"
    with pytest.raises(CorruptLog):
        list(iter_log(tmp_path))


def test_damage_in_a_sealed_segment_is_refused(tmp_path: Path) -> None:
    _closed_log(tmp_path)
    first = segs(tmp_path)[0]
    off, length = records(first)[-1]  # even its very last record
    _flip(first, off + length - 1)
    with pytest.raises(
        CorruptLog, match=r"00000000000000000000\.seg at byte \d+ \(position \d+\): record checksum"
    ):
        DiskLog(tmp_path, SMALL)


def test_damaged_segment_header_and_missing_segment_are_refused(tmp_path: Path) -> None:
    _closed_log(tmp_path)
    paths = segs(tmp_path)
    _flip(paths[1], 12)
    with pytest.raises(CorruptLog, match="header checksum"):
        DiskLog(tmp_path, SMALL)
    _flip(paths[1], 12)
    paths[1].unlink()
    with pytest.raises(CorruptLog, match="a segment is missing"):
        DiskLog(tmp_path, SMALL)


@pytest.mark.parametrize("header_bytes", [0, 7, HEADER_SIZE])
def test_torn_rotation_leaves_a_usable_log(tmp_path: Path, header_bytes: int) -> None:
    events = _closed_log(tmp_path)
    # The process died while creating the next segment.
    nxt = tmp_path / f"{len(events):020d}.seg"
    header = struct.pack("<8sHHQ", b"OMNIXLOG", 1, 0, len(events))
    header += struct.pack("<I", zlib.crc32(header))
    nxt.write_bytes(header[:header_bytes])
    with DiskLog(tmp_path, SMALL) as log:
        assert list(log.read()) == events
        if header_bytes < HEADER_SIZE:
            assert log.recovery.removed_segments == (nxt.name,)
        log.append(request_events("after")[0])
    assert list(iter_log(tmp_path))[-1].request_id == "after"  # type: ignore[union-attr]


# -- durability policies ----------------------------------------------------


def test_always_is_durable_on_return(tmp_path: Path) -> None:
    with DiskLog(tmp_path, LogConfig(fsync="always"), clock=ManualClock()) as log:
        for ev in request_events("r"):
            log.append(ev)
            assert log.durable_pos == log.written_pos == len(log)


def test_always_group_commit_shares_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real(fd))[1])
    with DiskLog(tmp_path, LogConfig(fsync="always"), clock=ManualClock()) as log:
        calls.clear()
        with log.group_commit():
            for ev in request_events("r", chunks=5):
                log.append(ev)
            assert log.durable_pos == 0
        assert log.durable_pos == len(log) == 10
        assert len(calls) == 1


async def test_batch_flush_waits_for_the_group_fsync(tmp_path: Path) -> None:
    cfg = LogConfig(fsync="batch", batch_interval_ms=20)
    with DiskLog(tmp_path, cfg, clock=ManualClock()) as log:
        for ev in request_events("r", chunks=50):
            log.append(ev)
        assert log.durable_pos == 0  # acknowledged, not yet durable
        flushes = [asyncio.create_task(log.flush()) for _ in range(20)]  # one fsync serves all
        got = await asyncio.wait_for(asyncio.gather(*flushes), 5)
        assert got == [len(log)] * 20 and log.durable_pos == len(log)
        # Without anyone waiting the flusher still syncs within the interval.
        log.append(request_events("s")[0])
        await wait_until(lambda: log.durable_pos == len(log), "the flusher's sync", timeout=2.0)
        assert log.durable_pos == len(log)


async def test_none_never_fsyncs_unless_asked(tmp_path: Path) -> None:
    cfg = LogConfig(fsync="none", batch_interval_ms=5)
    with DiskLog(tmp_path, cfg, clock=ManualClock()) as log:
        for ev in request_events("r"):
            log.append(ev)
        # written to the OS by the flusher thread
        await wait_until(lambda: log.written_pos == len(log), "the flusher's write", timeout=2.0)
        assert log.written_pos == len(log) and log.durable_pos == 0
        assert await log.flush() == len(log)
        assert log.durable_pos == len(log)


def test_write_failure_poisons_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = DiskLog(tmp_path, LogConfig(fsync="always"), clock=ManualClock())
    evs = request_events("r")
    log.append(evs[0])

    def enospc(fd: int, data: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", enospc)
    with pytest.raises(LogFailed, match=r"could not store position 1: .*No space left"):
        log.append(evs[1])
    monkeypatch.undo()
    with pytest.raises(LogFailed, match="reopen it to recover"):
        log.append(evs[1])
    log.close()
    with DiskLog(tmp_path) as again:  # the truth is what reached the disk
        assert len(again) == 1 and again.state.requests["r"].status == "admitted"


def test_appends_reads_and_the_flusher_interleave_safely(tmp_path: Path) -> None:
    # A flusher ticking every 0.5 ms takes bytes off the buffer while appends
    # add to it and reads copy from it; small segments rotate underneath.
    cfg = LogConfig(
        fsync="batch", batch_interval_ms=0.5, write_buffer_bytes=700, segment_bytes=8192
    )
    events = interleaved(120, chunks=6)
    with DiskLog(tmp_path, cfg, clock=ManualClock()) as log:
        for i, ev in enumerate(events):
            stored = log.append(ev)
            if i % 7 == 0:
                assert log.get(stored.pos) == stored
            if i % 101 == 0:
                assert [e.pos for e in log.read(max(0, i - 50))] == list(
                    range(max(0, i - 50), i + 1)
                )
        written = list(log.read())
    assert [e.pos for e in written] == list(range(len(events)))
    with DiskLog(tmp_path, cfg) as again:
        assert again.recovery.truncated_bytes == 0
        assert list(again.read()) == written


def test_a_stored_event_the_reducer_refuses_is_corrupt_at_its_position(tmp_path: Path) -> None:
    # A well-formed record (right length, checksum, position) whose event
    # the reducer refuses: a chunk index skipped in the middle of a stream,
    # where reopening folds chunks in bulk.  Recovery must still name it.
    rid = "streaming"
    with DiskLog(tmp_path, SMALL, clock=ManualClock()) as log:
        log.append(Admitted(request_id=rid, pipeline="p", spec=RequestSpec(prompt="hi")))
        log.append(Routed(request_id=rid, stage="thinker", replica=0, seq=0, sources=(), last=True))
        log.append(StageStarted(request_id=rid, stage="thinker", replica=0))
        for i in range(6):
            log.append(
                Chunk(
                    request_id=rid, stage="thinker", replica=0, index=i, modality="text", text="x"
                )
            )
        events = list(log.read())
    bad = msgspec.structs.replace(events[-1], index=9, pos=len(events))
    payload = encode_event(bad)
    seg = segs(tmp_path)[-1]
    offset = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(struct.pack("<II", len(payload), zlib.crc32(payload)) + payload)
    with pytest.raises(CorruptLog) as err:
        DiskLog(tmp_path, SMALL, clock=ManualClock())
    text = str(err.value)
    assert f"position {len(events)}" in text or f"pos {len(events)}" in text, text
    assert str(offset) in text, text
    assert "illegal for this omnix's reducer" in text, text
