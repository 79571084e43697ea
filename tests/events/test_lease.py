"""The leader lease on a real JetStream KV bucket (``omnix.events.lease``)."""

from __future__ import annotations

import asyncio
import time

import msgspec

from omnix.events.lease import LeaderLease, LeaseLost


class Endpoints(msgspec.Struct, frozen=True):
    http: str
    workers: str


async def test_acquire_renew_and_a_second_holder_refused(nats_server, log_name):
    a = await LeaderLease.open(
        nats_server.url,
        name=log_name,
        holder="a",
        endpoints=Endpoints("http://a", "tcp://a"),
        ttl=0.6,
    )
    b = await LeaderLease.open(nats_server.url, name=log_name, holder="b", ttl=0.6)
    try:
        assert await b.current() is None
        assert await a.acquire()
        rev = a.revision
        assert not await b.acquire()
        cur = await b.current(Endpoints)
        assert (
            cur is not None
            and cur.holder == "a"
            and cur.endpoints == Endpoints("http://a", "tcp://a")
        )
        await asyncio.sleep(1.0)  # longer than the TTL: renewals keep it
        assert a.held and a.revision > rev
        assert not await b.acquire()
        assert (await b.current()).holder == "a"
    finally:
        await a.close()
        await b.close()


async def test_a_standby_takes_over_once_the_holder_stops_renewing(nats_server, log_name):
    ttl = 0.6
    a = await LeaderLease.open(nats_server.url, name=log_name, holder="a", ttl=ttl)
    b = await LeaderLease.open(nats_server.url, name=log_name, holder="b", ttl=ttl)
    try:
        assert await a.acquire()
        standby = asyncio.create_task(b.acquire_when_free())
        await asyncio.sleep(2 * ttl)
        assert not standby.done()  # renewed: the standby waits
        await a.close()  # stops renewing without releasing: a crash
        died = time.monotonic()
        await asyncio.wait_for(standby, 5)
        took = time.monotonic() - died
        assert took <= ttl + 0.3, took
        assert (await b.current()).holder == "b"
    finally:
        await b.close()


async def test_release_hands_over_at_once(nats_server, log_name):
    a = await LeaderLease.open(nats_server.url, name=log_name, holder="a", ttl=1.5)
    b = await LeaderLease.open(nats_server.url, name=log_name, holder="b", ttl=1.5)
    try:
        assert await a.acquire()
        standby = asyncio.create_task(b.acquire_when_free())
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        await a.release()
        await asyncio.wait_for(standby, 5)
        assert time.monotonic() - t0 < 0.5
        assert b.held and (await b.current()).holder == "b"
    finally:
        await a.close()
        await b.close()


async def test_a_holder_whose_key_was_taken_loses_the_lease(nats_server, log_name):
    lost: list[LeaseLost] = []
    a = await LeaderLease.open(
        nats_server.url, name=log_name, holder="a", ttl=0.6, on_lost=lost.append
    )
    try:
        assert await a.acquire()
        await a.kv.put(
            "leader", b'{"holder":"x","ttl_s":0.6,"endpoints":null}'
        )  # someone else wrote
        for _ in range(50):
            if lost:
                break
            await asyncio.sleep(0.05)
        assert lost and not a.held and "another holder took it" in str(lost[0])
    finally:
        await a.close()


async def test_takeover_with_the_default_ttl_is_within_3_s(nats_server, log_name):
    a = await LeaderLease.open(nats_server.url, name=log_name, holder="a")
    b = await LeaderLease.open(nats_server.url, name=log_name, holder="b")
    try:
        assert a.ttl == 1.5 and await a.acquire()
        standby = asyncio.create_task(b.acquire_when_free())
        await asyncio.sleep(0.5)
        await a.close()
        died = time.monotonic()
        await asyncio.wait_for(standby, 5)
        assert time.monotonic() - died < 3.0
    finally:
        await b.close()


async def test_a_holder_cut_off_from_nats_gives_the_lease_up_within_its_ttl(own_nats):
    lost: list[LeaseLost] = []
    a = await LeaderLease.open(own_nats.url, holder="a", ttl=0.6, on_lost=lost.append)
    try:
        assert await a.acquire()
        await asyncio.sleep(0.3)
        own_nats.kill()
        cut = time.monotonic()
        for _ in range(100):
            if lost:
                break
            await asyncio.sleep(0.02)
        # By its own clock, before any standby could have taken it over.
        assert lost and time.monotonic() - cut <= 0.6 + 0.1
        assert "not renewed" in str(lost[0]) and not a.held
    finally:
        await a.close()


async def test_holders_follows_the_leader(nats_server, log_name):
    a = await LeaderLease.open(
        nats_server.url, name=log_name, holder="a", endpoints=Endpoints("http://a", "tcp://a")
    )
    b = await LeaderLease.open(
        nats_server.url, name=log_name, holder="b", endpoints=Endpoints("http://b", "tcp://b")
    )
    watcher = await LeaderLease.open(nats_server.url, name=log_name, holder="w")
    seen = []

    async def follow():
        async for cur in watcher.holders(Endpoints):
            seen.append(cur.endpoints.http if cur is not None else None)
            if seen[-1] == "http://b":
                return

    try:
        task = asyncio.create_task(follow())
        await asyncio.sleep(0.2)
        assert await a.acquire()
        await asyncio.sleep(0.3)
        await a.release()
        assert await b.acquire()
        await asyncio.wait_for(task, 5)
        assert seen[0] is None and "http://a" in seen and seen[-1] == "http://b"
    finally:
        await a.close()
        await b.close()
        await watcher.close()
