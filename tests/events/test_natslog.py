"""The log replicated on a real JetStream stream: leader, follower, fencing,
acknowledgement, group commit, refusals (``omnix.events.natslog``)."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.api import StreamConfig

from omnix.events.clock import ManualClock
from omnix.events.jetstream import (
    LogFenced,
    NatsUnreachable,
    ReplicaDiverged,
    StreamRefused,
    connect,
)
from omnix.events.log import MemoryLog
from omnix.events.natslog import NatsLog, NotLeader
from omnix.events.segments import LogError
from omnix.events.types import SCHEMA_VERSION, Admitted, Finished, RequestSpec
from omnix.testing.nats_server import free_port
from tests.events.conftest import interleaved, request_events


async def test_follower_folds_the_leaders_appends_in_order(nats_server, log_name):
    leader = await NatsLog.open(nats_server.url, name=log_name, clock=ManualClock())
    follower = await NatsLog.follow(nats_server.url, name=log_name)
    try:
        seen = []
        follower.add_listener(seen.append)
        tail = []

        async def tail_one():
            async for ev in follower.tail(0, request_id="req-1"):
                tail.append(ev)
                if isinstance(ev, Finished):
                    return

        task = asyncio.create_task(tail_one())
        events = interleaved(5)
        for ev in events:
            leader.append(ev)
        await leader.flush()
        await asyncio.wait_for(follower.wait_for(len(events) - 1), 10)
        await asyncio.wait_for(task, 10)
        assert list(follower.read()) == list(leader.read())
        assert [ev.pos for ev in seen] == list(range(len(events)))
        assert follower.state.digest() == leader.state.digest()
        assert tail == leader.events_for("req-1")
        assert follower.durable_pos == follower.next_pos == len(events)
        with pytest.raises(NotLeader, match="a follower never writes"):
            follower.append(events[0])
    finally:
        await follower.aclose()
        await leader.aclose()


async def test_acknowledged_means_acked_by_jetstream(nats_server, log_name):
    mem = MemoryLog()
    for ev in request_events("m"):
        mem.append(ev)
    assert mem.durable_pos == mem.next_pos and await mem.flush() == mem.next_pos

    leader = await NatsLog.open(nats_server.url, name=log_name)
    try:
        for ev in request_events("a"):
            leader.append(ev)
        # Nothing was published yet: the publisher runs between appends.
        assert leader.durable_pos == 0 and leader.pending == leader.next_pos
        assert await leader.flush() == leader.next_pos == leader.durable_pos
        info = await leader.conn.js.stream_info(leader.names.stream)
        assert info.state.messages >= 1 and info.state.last_seq == leader._last_seq
    finally:
        await leader.aclose()


async def test_group_commit_publishes_many_appends_as_few_messages(nats_server, log_name):
    leader = await NatsLog.open(nats_server.url, name=log_name)
    try:
        events = interleaved(400, chunks=20)  # 10,000 events
        for ev in events:
            leader.append(ev)
        await leader.flush()
        info = await leader.conn.js.stream_info(leader.names.stream)
        assert info.state.messages <= 4, info.state
        assert info.state.bytes < 2 * 1024 * 1024
    finally:
        await leader.aclose()
    reopened = await NatsLog.open(nats_server.url, name=log_name)
    try:
        assert list(reopened.read()) == list(leader.read())
    finally:
        await reopened.aclose()


async def test_a_second_leader_fences_the_first(nats_server, log_name):
    fenced: list[LogFenced] = []
    first = await NatsLog.open(nats_server.url, name=log_name, on_fenced=fenced.append)
    standby = await NatsLog.follow(nats_server.url, name=log_name)
    try:
        for ev in request_events("a"):
            first.append(ev)
        await first.flush()
        await standby.promote()
        assert standby.next_pos == first.next_pos
        standby.append(request_events("b")[0])
        await standby.flush()
        # The deposed leader does not know yet: its next publish is refused.
        first.append(request_events("c")[0])
        with pytest.raises(
            LogFenced, match=f"another leader appended to stream {first.names.stream}"
        ):
            await first.flush()
        assert fenced and first.closed and not first.available
        with pytest.raises(LogFenced):
            first.append(request_events("d")[0])
        assert standby.available and standby.leading
    finally:
        await standby.aclose()
        await first.aclose()
    again = await NatsLog.follow(nats_server.url, name=log_name)
    try:
        assert "c" not in again.state.requests and "b" in again.state.requests
    finally:
        await again.aclose()


async def test_a_follower_refuses_a_gap(nats_server, log_name):
    leader = await NatsLog.open(nats_server.url, name=log_name)
    follower = await NatsLog.follow(nats_server.url, name=log_name)
    try:
        for ev in request_events("a"):
            leader.append(ev)
        await leader.flush()
        await follower.wait_for(leader.next_pos - 1)
        # A writer that skips positions (published straight to the stream).
        from omnix.events.codec import encode_events

        ev = request_events("b")[0]
        bad = [ev.__class__(**{**{f: getattr(ev, f) for f in ev.__struct_fields__}, "pos": 99})]
        await leader.conn.js.publish(
            leader.names.subject,
            encode_events(bad),
            headers={
                "Omnix-First-Pos": "99",
                "Omnix-Log-Id": leader.log_id,
                "Omnix-Schema": str(SCHEMA_VERSION),
            },
        )
        for _ in range(100):
            if follower.closed:
                break
            await asyncio.sleep(0.05)
        assert isinstance(follower.failure, ReplicaDiverged)
        assert "a gap or a duplicate" in str(follower.failure)
    finally:
        await follower.aclose()
        await leader.aclose()


async def test_refusals_are_one_clear_line(nats_server, log_name):
    port = free_port()
    with pytest.raises(NatsUnreachable) as exc:
        await NatsLog.open(f"nats://127.0.0.1:{port}", name=log_name)
    assert f"nats://127.0.0.1:{port}" in str(exc.value) and "\n" not in str(exc.value)
    assert isinstance(exc.value, LogError)
    with pytest.raises(LogError, match="nats://HOST:PORT"):
        await NatsLog.open("http://127.0.0.1:1", name=log_name)
    with pytest.raises(LogError, match="log name"):
        await NatsLog.open(nats_server.url, name="no spaces")

    conn = await connect(nats_server.url)
    try:
        # A stream omnix did not create.
        await conn.js.add_stream(
            StreamConfig(name=f"OMNIX_LOG_{log_name}x", subjects=[f"omnix.log.{log_name}x"])
        )
        with pytest.raises(StreamRefused, match="was not created by omnix"):
            await NatsLog.open(nats_server.url, name=f"{log_name}x")
        # A newer omnix's log.
        await conn.js.add_stream(
            StreamConfig(
                name=f"OMNIX_LOG_{log_name}y",
                subjects=[f"omnix.log.{log_name}y"],
                metadata={
                    "omnix_log": f"{log_name}y",
                    "omnix_log_id": "abc",
                    "omnix_schema": str(SCHEMA_VERSION + 1),
                },
            )
        )
        with pytest.raises(StreamRefused, match=r"newer omnix.*upgrade omnix"):
            await NatsLog.follow(nats_server.url, name=f"{log_name}y")
    finally:
        await conn.close()
    # Another omnix log (its id is not the one expected).
    leader = await NatsLog.open(nats_server.url, name=log_name)
    await leader.aclose()
    with pytest.raises(StreamRefused, match="holds another omnix log"):
        await NatsLog.follow(nats_server.url, name=log_name, log_id="someone-else")


async def test_a_message_of_a_newer_schema_is_refused(nats_server, log_name):
    leader = await NatsLog.open(nats_server.url, name=log_name)
    await leader.conn.js.publish(
        leader.names.subject,
        bytes([SCHEMA_VERSION + 1]) + b"\x90",
        headers={
            "Omnix-First-Pos": "0",
            "Omnix-Log-Id": leader.log_id,
            "Omnix-Schema": str(SCHEMA_VERSION + 1),
        },
    )
    await leader.aclose()
    with pytest.raises(StreamRefused, match=r"schema .* newer .* upgrade omnix"):
        await NatsLog.follow(nats_server.url, name=log_name)


async def test_nats_restarted_mid_run_pending_events_land(own_nats):
    leader = await NatsLog.open(own_nats.url, name="restart")
    standing = await NatsLog.follow(own_nats.url, name="restart")  # stays open throughout
    try:
        for ev in request_events("a"):
            leader.append(ev)
        await leader.flush()
        acked = leader.durable_pos
        own_nats.kill()
        for _ in range(100):
            if not leader.available:
                break
            await asyncio.sleep(0.02)
        assert not leader.available  # admissions answer 503 meanwhile
        for ev in request_events("b"):
            leader.append(ev)
        await asyncio.sleep(0.5)
        assert leader.durable_pos == acked  # not acknowledged while NATS is away
        own_nats.start()  # same port, same store directory
        await asyncio.wait_for(leader.flush(), 30)
        assert leader.durable_pos == leader.next_pos and leader.available
        await asyncio.wait_for(standing.wait_for(leader.next_pos - 1), 30)
        assert list(standing.read()) == list(leader.read())
    finally:
        await standing.aclose()
        await leader.aclose()
    follower = await NatsLog.follow(own_nats.url, name="restart")
    try:
        assert list(follower.read()) == list(leader.read())
    finally:
        await follower.aclose()


async def test_plain_nats_client_sees_one_message_per_batch(nats_server, log_name):
    """The stream's messages carry the headers the docs name."""
    leader = await NatsLog.open(nats_server.url, name=log_name)
    for ev in request_events("a"):
        leader.append(ev)
    await leader.flush()
    nc = await nats.connect(nats_server.url)
    try:
        msg = await nc.jetstream().get_msg(leader.names.stream, seq=1)
        assert msg.headers["Omnix-First-Pos"] == "0"
        assert msg.headers["Omnix-Log-Id"] == leader.log_id
        assert msg.headers["Omnix-Schema"] == str(SCHEMA_VERSION)
        assert msg.headers["Nats-Msg-Id"].startswith(leader.log_id)
    finally:
        await nc.close()
        await leader.aclose()


async def test_available_is_false_while_too_many_events_wait_for_acks(nats_server, log_name):
    leader = await NatsLog.open(nats_server.url, name=log_name, max_pending=10)
    try:
        assert leader.available
        for ev in interleaved(3):  # 24 events, appended without a yield
            leader.append(ev)
        assert leader.pending == 24 and not leader.available
        await leader.flush()
        assert leader.pending == 0 and leader.available
    finally:
        await leader.aclose()
    assert not leader.available  # closed


async def test_a_standby_started_first_then_promoted_after_the_leader_died(nats_server, log_name):
    # The standby opens first: it creates the stream the leader then finds.
    standby = await NatsLog.follow(nats_server.url, name=log_name, clock=ManualClock())
    leader = await NatsLog.open(nats_server.url, name=log_name, clock=ManualClock())
    try:
        assert leader.log_id == standby.log_id
        events = interleaved(4)
        for ev in events[:20]:
            leader.append(ev)
        await leader.flush()
        for ev in events[20:25]:
            leader.append(ev)  # appended, never published: the leader "dies" now
        leader.close()
        await standby.promote()
        assert standby.next_pos == 20  # everything acknowledged, nothing else
        for ev in events[20:]:
            standby.append(ev)
        await standby.flush()
        assert list(standby.read()) == list(MemoryLog(ManualClock(), events).read())
    finally:
        await standby.aclose()
        await leader.aclose()


async def test_an_event_bigger_than_a_message_goes_in_parts(nats_server, log_name):
    leader = await NatsLog.open(nats_server.url, name=log_name)
    follower = await NatsLog.follow(nats_server.url, name=log_name)
    try:
        big = RequestSpec(prompt="x" * (3 << 20), outputs=("text",))  # 3 MiB: over 1 MiB
        huge = Admitted(request_id="big", pipeline="p", spec=big)
        events = [*request_events("small"), huge, *request_events("after")]
        for ev in events:
            leader.append(ev)
        await leader.flush()
        info = await leader.conn.js.stream_info(leader.names.stream)
        assert info.state.messages >= 4  # the big one in parts
        await asyncio.wait_for(follower.wait_for(leader.next_pos - 1), 10)
        assert list(follower.read()) == list(leader.read())
        await follower.promote()  # a follower in step with parts leads on
        follower.append(request_events("next")[0])
        await follower.flush()
    finally:
        await follower.aclose()
        await leader.aclose()
    again = await NatsLog.follow(nats_server.url, name=log_name)
    try:
        assert again.events_for("big")[0].spec.prompt == "x" * (3 << 20)
        assert "next" in again.state.requests
    finally:
        await again.aclose()


async def test_a_batch_cut_short_by_its_leaders_death_is_skipped(nats_server, log_name):
    leader = await NatsLog.open(nats_server.url, name=log_name)
    standby = await NatsLog.follow(nats_server.url, name=log_name)
    for ev in request_events("a"):
        leader.append(ev)
    await leader.flush()
    # The leader dies after the first part of a two-part batch.
    await leader.conn.js.publish(
        leader.names.subject,
        b"\x07half a batch",
        headers={
            "Omnix-First-Pos": str(leader.next_pos),
            "Omnix-Log-Id": leader.log_id,
            "Omnix-Schema": str(SCHEMA_VERSION),
            "Omnix-Part": "1/2",
        },
    )
    leader.close()
    try:
        await standby.promote()
        for ev in request_events("b"):
            standby.append(ev)
        await standby.flush()
    finally:
        await standby.aclose()
        await leader.aclose()
    again = await NatsLog.follow(nats_server.url, name=log_name)
    try:
        assert list(again.read()) == list(standby.read())
    finally:
        await again.aclose()
