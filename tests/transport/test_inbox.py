"""The inbox: every waiting message decoded and handed to its type's handler, in order."""

from __future__ import annotations

import asyncio
import logging

import msgspec
import pytest

from omnix.transport import messages as m
from omnix.transport.codec import FrameEncoder
from omnix.transport.inbox import Inbox, Route, ignore
from omnix.transport.sockets import MAX_DRAIN, readable, send_frames
from tests.waiting import wait_until

log = logging.getLogger("test.inbox")

PROTOCOL = {m.ABORT: m.Abort, m.SHUTDOWN: m.Shutdown}


def test_routes_must_cover_the_protocol_exactly(pair):
    router, _ = pair
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="no route for"):
            Inbox(
                loop,
                router,
                PROTOCOL,
                [Route(m.ABORT, m.Abort, ignore)],
                routed=True,
                log=log,
                unknown_hint="",
            )
        with pytest.raises(ValueError, match="two routes"):
            Inbox(
                loop,
                router,
                PROTOCOL,
                [Route(m.ABORT, m.Abort, ignore), Route(m.ABORT, m.Abort, ignore)],
                routed=True,
                log=log,
                unknown_hint="",
            )
        with pytest.raises(TypeError, match="decodes"):
            Inbox(
                loop,
                router,
                PROTOCOL,
                [Route(m.ABORT, m.Shutdown, ignore), Route(m.SHUTDOWN, m.Shutdown, ignore)],
                routed=True,
                log=log,
                unknown_hint="",
            )
    finally:
        loop.close()


async def test_dispatches_in_order_with_the_sender_and_skips_bad_messages(pair, caplog):
    router, dealer = pair
    got: list[tuple[bytes, object]] = []
    malformed: list[msgspec.DecodeError] = []

    def on_bad_shutdown(exc: msgspec.DecodeError) -> bool:
        malformed.append(exc)
        return True

    inbox = Inbox(
        asyncio.get_running_loop(),
        router,
        PROTOCOL,
        [
            Route(m.ABORT, m.Abort, lambda peer, msg: got.append((peer, msg))),
            Route(
                m.SHUTDOWN,
                m.Shutdown,
                lambda peer, msg: got.append((peer, msg)),
                on_malformed=on_bad_shutdown,
            ),
        ],
        routed=True,
        log=log,
        unknown_hint="a newer peer?",
    )
    enc = FrameEncoder()
    send_frames(dealer, enc.encode(m.ABORT, m.Abort("r1")))
    send_frames(dealer, [b"?", b""])  # a type the protocol does not list
    send_frames(dealer, [m.ABORT, b"\xc1"])  # not msgpack
    send_frames(dealer, [m.SHUTDOWN, b"\xc1"])  # handled by its route's on_malformed
    send_frames(dealer, enc.encode(m.SHUTDOWN, m.Shutdown("bye")))
    with caplog.at_level(logging.ERROR, logger="test.inbox"):
        await wait_until(lambda: len(got) == 2, "both messages handled")
    inbox.close()
    assert got == [(b"w1", m.Abort("r1")), (b"w1", m.Shutdown("bye"))]
    assert len(malformed) == 1
    assert "ignoring a message of unknown type b'?' (a newer peer?)" in caplog.text
    assert "ignoring a malformed b'A' message" in caplog.text
    assert "malformed b'S'" not in caplog.text


async def test_a_dealer_gets_no_peer_and_a_flood_is_read_in_turns(pair):
    router, dealer = pair
    dealer.send(b"hi")  # the router may send only to a peer it has heard from
    assert router.poll(5000)
    router.recv_multipart()
    got: list[tuple[bytes, str]] = []
    turns: list[int] = []
    loop = asyncio.get_running_loop()
    inbox = Inbox(
        loop,
        dealer,
        PROTOCOL,
        [
            Route(m.ABORT, m.Abort, lambda peer, msg: got.append((peer, msg.request_id))),
            Route(m.SHUTDOWN, m.Shutdown, ignore),
        ],
        routed=False,
        log=log,
        unknown_hint="",
    )
    enc = FrameEncoder()
    n = 2 * MAX_DRAIN + 10
    for i in range(n):
        send_frames(router, enc.encode(m.ABORT, m.Abort(f"r{i}"), b"w1"))

    def count_turn() -> None:  # runs between the inbox's callbacks
        turns.append(len(got))
        if len(got) < n:
            loop.call_soon(count_turn)

    loop.call_soon(count_turn)
    await wait_until(lambda: len(got) == n, "the flood handled")
    inbox.close()
    assert got == [(b"", f"r{i}") for i in range(n)]
    # Other callbacks ran while the flood was read: it was read in turns.
    assert any(0 < t < n for t in turns)


async def test_a_handler_that_closes_the_inbox_stops_the_reading(pair):
    router, dealer = pair
    got: list[str] = []
    inbox: Inbox | None = None

    def on_abort(peer: bytes, msg: m.Abort) -> None:
        got.append(msg.request_id)
        assert inbox is not None
        inbox.close()

    inbox = Inbox(
        asyncio.get_running_loop(),
        router,
        PROTOCOL,
        [Route(m.ABORT, m.Abort, on_abort), Route(m.SHUTDOWN, m.Shutdown, ignore)],
        routed=True,
        log=log,
        unknown_hint="",
    )
    enc = FrameEncoder()
    for rid in ("a", "b"):
        send_frames(dealer, enc.encode(m.ABORT, m.Abort(rid)))
    await wait_until(lambda: got, "the first message handled")
    # The second has reached the socket and stays there, unread.
    await wait_until(lambda: readable(router), "b to wait on the socket")
    assert got == ["a"]
