"""Real NATS servers and real omnix processes for the multi-host tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from omnix.testing.nats_server import NatsServer


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A ``nats-server -js`` of the test's own (the test may kill it)."""
    with NatsServer(tmp_path / "nats") as srv:
        yield srv
