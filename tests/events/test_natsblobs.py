"""A replicated log's blobs travel on its stream: a follower holds every
blob an event it applied references (a big one in parts too), and a
snapshot that purges the stream first publishes again the blobs still
held, so a log reopened from it has them (``omnix.events.natsblobs``)."""

from __future__ import annotations

import asyncio

import msgspec
import numpy as np

from omnix.events.clock import ManualClock
from omnix.events.natslog import NatsLog
from omnix.events.retention import Retention, RetentionPolicy
from omnix.events.types import Chunk, Event
from tests.events.conftest import request_events


def with_blob(rid: str, log: NatsLog, data: np.ndarray) -> list[Event]:
    """``rid``'s events, its first chunk carrying ``data`` put in ``log.blobs``."""
    ref = log.blobs.put_array(data, "audio/pcm")
    out = []
    for ev in request_events(rid):
        if isinstance(ev, Chunk) and ev.index == 0:
            ev = msgspec.structs.replace(ev, modality="audio", text="", blob=ref)
        out.append(ev)
    return out


async def test_a_follower_holds_the_blobs_of_the_events_it_applied(nats_server, log_name):
    leader = await NatsLog.open(nats_server.url, name=log_name, clock=ManualClock())
    follower = await NatsLog.follow(nats_server.url, name=log_name)
    try:
        small = np.arange(1000, dtype=np.float32)
        big = np.random.default_rng(0).random(400_000).astype(np.float32)  # 1.6 MB: parts
        for rid, data in (("small", small), ("big", big)):
            for ev in with_blob(rid, leader, data):
                leader.append(ev)
        await leader.flush()
        await asyncio.wait_for(follower.wait_for(leader.next_pos - 1), 10)
        for rid, data in (("small", small), ("big", big)):
            (chunk,) = [ev for ev in follower.events_for(rid) if isinstance(ev, Chunk) and ev.blob]
            assert chunk.blob is not None
            assert np.array_equal(follower.blobs.get_array(chunk.blob), data)
    finally:
        await follower.aclose()
        await leader.aclose()


async def test_a_reopened_log_holds_a_long_requests_blob_after_purges(nats_server, log_name):
    leader = await NatsLog.open(
        nats_server.url, name=log_name, clock=ManualClock(), snapshot_every=200
    )
    Retention(leader, RetentionPolicy(window_s=None, max_requests=5, max_bytes=None), leader.blobs)
    try:
        held = np.full(500, 7, dtype=np.int16)
        long_life = with_blob("long", leader, held)
        for ev in long_life[:4]:  # admitted, running, its blob chunk logged
            leader.append(ev)
        for i in range(120):  # many short requests: released, snapshots, purges
            for ev in request_events(f"short-{i}"):
                leader.append(ev)
            if i % 10 == 0:
                await leader.flush()
        await leader.flush()
        await leader._snapshots.wait()
        info = await leader.conn.js.stream_info(leader.names.stream)
        assert info.state.first_seq > 1  # purged
        reopened = await NatsLog.follow(nats_server.url, name=log_name)
        try:
            (chunk,) = [ev for ev in reopened.events_for("long") if isinstance(ev, Chunk)]
            assert chunk.blob is not None
            assert np.array_equal(reopened.blobs.get_array(chunk.blob), held)
        finally:
            await reopened.aclose()
    finally:
        await leader.aclose()
