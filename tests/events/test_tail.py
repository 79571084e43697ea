"""Tail subscriptions, listeners and IllegalTransition messages, on both backends."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

import pytest

from omnix.events.log import EventLog
from omnix.events.reducer import IllegalTransition
from omnix.events.types import (
    CancelRequested,
    Chunk,
    Event,
    Finished,
    Routed,
    WorkerJoined,
)
from tests.events.conftest import interleaved, request_events
from tests.waiting import wait_until


async def take(it, n: int, within: float = 5.0) -> list[Event]:
    """The next ``n`` events of a tail, or TimeoutError after ``within`` s."""
    out: list[Event] = []
    async with asyncio.timeout(within):
        async for ev in it:
            out.append(ev)
            if len(out) == n:
                break
    return out


async def test_tail_from_a_position_then_live(make_log) -> None:
    log: EventLog = make_log()
    for ev in interleaved(3):
        log.append(ev)
    n = len(log)
    it = log.tail(5)
    first = await take(it, n - 5)
    assert [e.pos for e in first] == list(range(5, n))

    async def later() -> None:
        # The tail reads them live: it is parked at the log's end (white-box: the log's own test).
        await wait_until(lambda: log._waiters, "the tail to wait at the log's end")
        for ev in request_events("live", chunks=2):
            log.append(ev)
            await asyncio.sleep(0)

    task = asyncio.create_task(later())
    live = await take(it, 6)
    await task
    assert [e.pos for e in live] == list(range(n, n + 6))
    assert {e.request_id for e in live} == {"live"}  # type: ignore[union-attr]


async def test_tail_one_request(make_log) -> None:
    log: EventLog = make_log()
    for ev in interleaved(4):
        log.append(ev)
    it = log.tail(0, request_id="req-2")
    got = await take(it, 8)
    assert got == log.events_for("req-2")
    ends = asyncio.create_task(take(it, 1, within=0.2))
    await wait_until(lambda: log._req_waiters.get("req-2"), "the tail to wait for req-2")
    log.append(request_events("other")[0])  # wakes the tail; not its request
    with pytest.raises(TimeoutError):
        await ends


async def test_tail_ends_when_the_log_closes(make_log) -> None:
    log: EventLog = make_log()
    log.append(request_events("r")[0])

    got: list[Event] = []

    async def drain() -> list[Event]:
        async for ev in log.tail(0):
            got.append(ev)
        return got

    task = asyncio.create_task(drain())
    await wait_until(lambda: len(got) == 1, "the tail to read position 0")  # then it waits
    log.append(request_events("r")[1])
    await wait_until(lambda: len(got) == 2, "the tail to read position 1")
    log.close()
    got = await asyncio.wait_for(task, 5)
    assert [e.pos for e in got] == [0, 1]


async def test_a_slow_subscriber_does_not_grow_memory(make_log) -> None:
    """The log's storage is the buffer: a paused tail holds one batch at most."""
    log: EventLog = make_log()
    events = interleaved(150, chunks=10)  # 2,400 events
    half = len(events) // 2

    def appended_bytes(batch: list[Event]) -> int:
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        for ev in batch:
            log.append(ev)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        return grown

    alone = appended_bytes(events[:half])
    # A subscriber that has started (it is suspended inside the tail) and
    # then stops consuming while 1,200 events go by.
    sub = log.tail(half - 1)
    assert [e.pos for e in await take(sub, 1)] == [half - 1]
    with_sub = appended_bytes(events[half:])
    assert with_sub < alone * 1.25 + 64 * 1024, (alone, with_sub)
    got = await take(sub, len(events) - half)
    assert [e.pos for e in got] == list(range(half, len(events)))


def test_listeners_see_every_event_in_order_even_nested(make_log) -> None:
    log: EventLog = make_log()
    seen: list[int] = []
    log.add_listener(lambda ev: seen.append(ev.pos))

    def cancel_on_first_chunk(ev: Event) -> None:
        if isinstance(ev, Chunk) and ev.index == 0:
            log.append(CancelRequested(request_id=ev.request_id, reason="client"))

    log.add_listener(cancel_on_first_chunk)
    for ev in request_events("r", chunks=2)[:5]:
        log.append(ev)
    assert seen == list(range(len(log)))
    assert type(log.get(4)) is CancelRequested


def test_illegal_transition_names_the_request_and_both_events(make_log) -> None:
    log: EventLog = make_log()
    for ev in request_events("req-9", chunks=1):
        log.append(ev)
    n = len(log)
    with pytest.raises(IllegalTransition) as info:
        log.append(Chunk(request_id="req-9", stage="thinker", replica=0, index=1, modality="text"))
    msg = str(info.value)
    assert msg.startswith(f"req-9: illegal chunk refused as pos {n} (nothing stored): "), msg
    assert f"(after finished at pos {n - 1})" in msg, msg
    assert info.value.event.pos == n  # the position it was offered
    assert info.value.key == "req-9" and isinstance(info.value.event, Chunk)
    assert len(log) == n

    log.append(request_events("req-10")[0])
    with pytest.raises(
        IllegalTransition,
        match=r"req-10: illegal admitted .*already admitted \(after admitted at pos \d+\)",
    ):
        log.append(request_events("req-10")[0])
    with pytest.raises(
        IllegalTransition, match=r"req-10: illegal chunk .*stage 'talker' was never routed"
    ):
        log.append(Chunk(request_id="req-10", stage="talker", replica=0, index=0, modality="codec"))
    log.append(
        Routed(request_id="req-10", stage="thinker", replica=0, seq=0, sources=(), last=True)
    )
    with pytest.raises(
        IllegalTransition, match=r"req-10: illegal finished .*stage 'thinker' is still routed"
    ):
        log.append(Finished(request_id="req-10"))
    w = WorkerJoined(worker_id="thinker/0", stage="thinker", replica=0, engine="x", capacity=1)
    log.append(w)
    with pytest.raises(
        IllegalTransition,
        match=r"thinker/0: illegal worker_joined .*already joined \(after joined at pos \d+\)",
    ):
        log.append(w)
