"""Crash safety with a real process: SIGKILL a writer at random moments.

A child appends with fsync="always" and reports every acknowledged
position over a pipe; the parent kills it at random times, reopens the log
and checks that every acknowledged event is there, byte for byte, and that
recovery left no partial record.  Then it damages the log on purpose: a
flipped byte mid-file must be reported, a torn tail must be cut.
"""

from __future__ import annotations

import os
import random
import selectors
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from omnix.events.codec import encode_event
from omnix.events.disklog import HEADER_SIZE, CorruptLog, DiskLog, iter_log

CHILD = Path(__file__).with_name("crash_child.py")
ROOT = Path(__file__).resolve().parents[2]


def run_and_kill(logdir: Path, tag: str, rng: random.Random) -> dict[int, int]:
    """Start a writer, SIGKILL it at a random moment; return its acks."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(logdir), tag], stdout=subprocess.PIPE, env=env, cwd=ROOT
    )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    buf = b""
    acks: dict[int, int] = {}
    kill_at = None
    deadline = time.monotonic() + 30
    try:
        while True:
            now = time.monotonic()
            assert now < deadline, "the writer never became ready"
            if kill_at is not None and now >= kill_at:
                proc.send_signal(signal.SIGKILL)
                break
            for _ in sel.select(timeout=0.005):
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError(f"the writer exited early (rc={proc.wait()})")
                buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                a, b = line.split()
                if a == b"ready":
                    kill_at = time.monotonic() + rng.uniform(0.02, 0.35)
                else:
                    acks[int(a)] = int(b)
        proc.wait(10)
        # Whatever the child wrote before dying is in the pipe: those
        # appends returned, so they were acknowledged too.
        os.set_blocking(fd, True)
        buf += proc.stdout.read()
        for line in buf.split(b"\n"):
            if line and not line.startswith(b"ready"):
                a, b = line.split()
                acks[int(a)] = int(b)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        sel.close()
    return acks


@pytest.mark.slow
def test_sigkill_loses_no_acknowledged_event(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("OMNIX_CRASH_SEED", "1")))
    logdir = tmp_path / "log"
    acked: dict[int, int] = {}
    rounds = 6
    for r in range(rounds):
        acked.update(run_and_kill(logdir, f"round{r}", rng))
        with DiskLog(logdir) as log:
            n = len(log)
            missing = [p for p in acked if p >= n]
            assert not missing, (
                f"round {r}: acknowledged positions {missing[:5]} lost (log has {n})"
            )
            for pos, crc in acked.items():
                assert zlib.crc32(encode_event(log.get(pos))) == crc, f"event {pos} differs"
            # Recovery leaves whole records only: the next open is clean.
            size_after = [p.stat().st_size for p in log.segment_paths()]
        with DiskLog(logdir) as again:
            assert again.recovery.truncated_bytes == 0
            assert [p.stat().st_size for p in again.segment_paths()] == size_after
            assert len(again) == n
    assert len(acked) > 50, "the writer should have acknowledged many events"
    assert len(list(logdir.glob("*.seg"))) > 2, "kills should span segment rotations"

    # A byte flipped in the middle of the log is reported, not skipped.
    events = list(iter_log(logdir))
    segs = sorted(logdir.glob("*.seg"))
    victim = segs[len(segs) // 2]
    raw = bytearray(victim.read_bytes())
    mid = HEADER_SIZE + (len(raw) - HEADER_SIZE) // 2
    raw[mid] ^= 0xFF
    victim.write_bytes(bytes(raw))
    with pytest.raises(CorruptLog) as info:
        DiskLog(logdir)
    assert info.value.path == str(victim) and info.value.offset <= mid
    raw[mid] ^= 0xFF
    victim.write_bytes(bytes(raw))

    # A torn tail (half a record) is cut, and every event before it kept.
    last = segs[-1]
    with last.open("ab") as f:
        f.write(b"\x30\x00\x00\x00\xde\xad\xbe\xef" + b"\x01" * 20)
    with DiskLog(logdir) as log:
        assert log.recovery.truncated_bytes == 28
        assert list(log.read()) == events


RETENTION_CHILD = Path(__file__).with_name("crash_retention_child.py")


def run_retention_and_kill(
    logdir: Path, tag: str, rng: random.Random, phase: bytes
) -> dict[int, tuple[int, str]]:
    """Start the retention writer; SIGKILL it shortly after it enters
    ``phase`` (``b"S"``: writing a snapshot, ``b"D"``: deleting segments);
    return its acks (position -> (crc, request id))."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(RETENTION_CHILD), str(logdir), tag],
        stdout=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    buf = b""
    acks: dict[int, tuple[int, str]] = {}
    kill_at = None
    seen_phase = 0
    skip = rng.randrange(0, 4)  # which occurrence of the phase to kill in
    deadline = time.monotonic() + 30

    def take(lines: list[bytes]) -> None:
        nonlocal kill_at, seen_phase
        for line in lines:
            if line == phase:
                seen_phase += 1
                if kill_at is None and seen_phase > skip:
                    kill_at = time.monotonic() + rng.uniform(0.0, 0.003)
            elif line and line[:1] not in (b"S", b"s", b"D", b"d", b"r"):
                a, b, rid = line.split()
                acks[int(a)] = (int(b), rid.decode())

    try:
        while True:
            now = time.monotonic()
            assert now < deadline, f"the writer never reached phase {phase!r}"
            if kill_at is not None and now >= kill_at:
                proc.send_signal(signal.SIGKILL)
                break
            for _ in sel.select(timeout=0.0005):
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError(f"the writer exited early (rc={proc.wait()})")
                buf += chunk
            *lines, buf = buf.split(b"\n")
            take(lines)
        proc.wait(10)
        os.set_blocking(fd, True)
        buf += proc.stdout.read()
        take(buf.split(b"\n"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        sel.close()
    return acks


@pytest.mark.slow
@pytest.mark.parametrize(
    "phase", [b"S", b"D"], ids=["during-snapshot-write", "during-segment-deletion"]
)
def test_sigkill_during_snapshot_or_deletion_loses_nothing_retained(
    tmp_path: Path, phase: bytes
) -> None:
    from omnix.events.log import EventReleased

    rng = random.Random(int(os.environ.get("OMNIX_CRASH_SEED", "1")) + phase[0])
    logdir = tmp_path / "log"
    acked: dict[int, tuple[int, str]] = {}
    for r in range(5):
        acked.update(run_retention_and_kill(logdir, f"round{r}", rng, phase))
        with DiskLog(logdir) as log:
            n = len(log)
            missing = [p for p in acked if p >= n]
            assert not missing, (
                f"round {r}: acknowledged positions {missing[:5]} lost (log has {n})"
            )
            retained = log.state.requests
            for pos, (crc, rid) in acked.items():
                if rid in retained:
                    # Acknowledged and retained: there, byte for byte.
                    assert zlib.crc32(encode_event(log.get(pos))) == crc, f"event {pos} differs"
                else:
                    with pytest.raises(EventReleased):
                        log.get(pos)
            assert log.recovery.snapshot or r == 0
            # Whatever the kill interrupted, a second open agrees.
            digest = log.state.digest()
        with DiskLog(logdir) as again:
            assert again.state.digest() == digest and len(again) == n
            assert again.recovery.truncated_bytes == 0
    assert not list((logdir / "snapshots").glob(".tmp-*"))
    assert len(acked) > 200
