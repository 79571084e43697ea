"""An R=3 log on a real three-node JetStream cluster survives kill -9 of a node."""

from __future__ import annotations

import asyncio

import pytest

from omnix.events.natslog import NatsLog
from omnix.testing.nats_server import NatsCluster
from tests.events.conftest import request_events


@pytest.fixture
def cluster(tmp_path):
    with NatsCluster(tmp_path / "cluster") as c:
        yield c


async def test_r3_stream_survives_kill_9_of_a_node(cluster):
    leader = await NatsLog.open(cluster.url, name="r3", replicas=3, timeout_s=30)
    follower = await NatsLog.follow(cluster.url, name="r3", replicas=3, timeout_s=30)
    try:
        info = await leader.conn.js.stream_info(leader.names.stream)
        assert info.config.num_replicas == 3
        for k in range(20):
            for ev in request_events(f"a{k}"):
                leader.append(ev)
        await leader.flush()
        # Kill the node that leads the stream's raft group: the worst one.
        victim = next(n for n in cluster.nodes if n.name == info.cluster.leader)
        victim.kill()
        for k in range(20):
            for ev in request_events(f"b{k}"):
                leader.append(ev)
            await asyncio.sleep(0.01)
        await asyncio.wait_for(leader.flush(), 30)
        assert leader.durable_pos == leader.next_pos
        await asyncio.wait_for(follower.wait_for(leader.next_pos - 1), 30)
        assert list(follower.read()) == list(leader.read())
        assert follower.state.digest() == leader.state.digest()
    finally:
        await follower.aclose()
        await leader.aclose()
