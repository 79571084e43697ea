"""A replicated log's snapshots, purges and reopens; retention bounds a
follower; a leader killed with SIGKILL loses nothing it acknowledged."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from omnix.events.clock import ManualClock
from omnix.events.jetstream import StreamRefused
from omnix.events.log import MemoryLog
from omnix.events.natslog import NatsLog
from omnix.events.retention import Retention, RetentionPolicy
from tests.events.conftest import interleaved, request_events

POLICY = RetentionPolicy(window_s=None, max_requests=10, max_bytes=None)


def waves(n: int, per_wave: int = 4, chunks: int = 4) -> list:
    """``n`` waves of ``per_wave`` concurrent requests, one wave after another."""
    out = []
    for w in range(n):
        lives = [request_events(f"w{w}-{i}", chunks) for i in range(per_wave)]
        for k in range(max(len(x) for x in lives)):
            out.extend(life[k] for life in lives if k < len(life))
    return out


async def _append(log, events, every=100):
    for i, ev in enumerate(events):
        log.append(ev)
        if i % every == 0:
            await log.flush()  # acknowledged as a server's streams wait for it


async def test_snapshots_purge_and_reopen_equal_the_whole_fold(nats_server, log_name):
    events = waves(40) + interleaved(3, chunks=2)[:5]  # 3 in flight at the end
    leader = await NatsLog.open(
        nats_server.url, name=log_name, clock=ManualClock(), snapshot_every=300
    )
    Retention(leader, POLICY)
    follower = await NatsLog.follow(nats_server.url, name=log_name, clock=ManualClock())
    try:
        peak = 0

        def watch(ev):
            nonlocal peak
            peak = max(peak, follower.held_events)

        follower.add_listener(watch)
        await _append(leader, events)
        await leader.flush()
        auto = leader.snapshot_count
        assert auto >= 2  # every 300 appends, once acknowledged (the latest may be on its way)
        await leader.snapshot()
        info = await leader.conn.js.stream_info(leader.names.stream)
        assert info.state.first_seq > 1, "the messages no snapshot needs are purged"
        store = await leader.conn.js.object_store(leader.names.snapshots)
        kept = [o for o in await store.list(ignore_deletes=True) if not o.deleted]
        assert len(kept) == 2
        await asyncio.wait_for(follower.wait_for(leader.next_pos - 1), 10)
        # Retention's releases bound the follower's memory as the leader's.
        assert follower.held_events == leader.held_events
        assert peak < 300 and len(events) > 1400
    finally:
        await follower.aclose()
        await leader.aclose()

    reference = MemoryLog(clock=ManualClock())
    Retention(reference, POLICY)
    for ev in events:
        reference.append(ev)
    for reopen in (NatsLog.follow, NatsLog.open):
        again = await reopen(nats_server.url, name=log_name, clock=ManualClock())
        try:
            assert again.snapshot_pos > 0
            assert again.state.digest() == reference.state.digest()
            assert list(again.read()) == list(reference.read())
            for rid in list(reference.state.requests):
                assert again.events_for(rid) == reference.events_for(rid)
        finally:
            await again.aclose()
    # A reopened leader goes on from the next position, retention too.
    again = await NatsLog.open(nats_server.url, name=log_name, clock=ManualClock())
    Retention(again, POLICY)
    more = interleaved(3, chunks=2)[5:]
    await _append(again, more)
    await again.flush()
    for ev in more:
        reference.append(ev)
    assert again.state.digest() == reference.state.digest()
    await again.aclose()


CHILD = Path(__file__).with_name("nats_crash_child.py")
ROOT = str(Path(__file__).resolve().parents[2])


async def test_a_leader_killed_with_sigkill_keeps_what_it_acknowledged(nats_server, log_name):
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), nats_server.url, log_name, stdout=subprocess.PIPE, env=env
    )
    acked = 0
    try:
        assert proc.stdout is not None
        while acked < 3000:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert line, "the child exited"
            acked = int(line)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
    leader = await NatsLog.open(nats_server.url, name=log_name)
    try:
        assert leader.next_pos >= acked
        assert [ev.pos for ev in leader.read()] == list(range(leader.next_pos))
        first = leader.next_pos
        ev = leader.append(interleaved(1)[0])
        assert ev.pos == first
        await leader.flush()
    finally:
        await leader.aclose()


async def test_a_stream_purged_without_its_snapshots_is_refused(nats_server, log_name):
    leader = await NatsLog.open(nats_server.url, name=log_name)
    await _append(leader, waves(3))
    await leader.flush()
    await leader.conn.js.purge_stream(leader.names.stream, seq=2)  # not omnix's purge
    await leader.aclose()
    with pytest.raises(StreamRefused, match=r"no snapshot .* covers what was purged"):
        await NatsLog.follow(nats_server.url, name=log_name)
