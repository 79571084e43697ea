"""Fixtures for the transport tests: a connected ROUTER/DEALER pair."""

from __future__ import annotations

import pytest
import zmq

from omnix.transport.sockets import make_dealer, make_router


@pytest.fixture
def pair(tmp_path):
    ctx = zmq.Context()
    router, ep = make_router(ctx, f"ipc://{tmp_path}/t.sock")
    dealer = make_dealer(ctx, ep, b"w1")
    yield router, dealer
    dealer.close(0)
    router.close(0)
    ctx.term()
