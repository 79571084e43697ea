"""Fixtures for the core's tests: a log of either backend, small event helpers."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from omnix.events.clock import ManualClock
from omnix.events.disklog import DiskLog, LogConfig
from omnix.events.log import EventLog, MemoryLog
from omnix.events.types import (
    Admitted,
    Chunk,
    Event,
    Finished,
    RequestSpec,
    Routed,
    StageFinished,
    StageStarted,
)
from omnix.testing.nats_server import NatsServer

SPEC = RequestSpec(prompt="hi", outputs=("text",))


def request_events(rid: str, chunks: int = 3, stage: str = "thinker") -> list[Event]:
    """A complete one-stage request: admitted ... finished."""
    return [
        Admitted(request_id=rid, pipeline="p", spec=SPEC),
        Routed(request_id=rid, stage=stage, replica=0, seq=0, sources=(), last=True),
        StageStarted(request_id=rid, stage=stage, replica=0),
        *(
            Chunk(request_id=rid, stage=stage, replica=0, index=i, modality="text", text=f"t{i}")
            for i in range(chunks)
        ),
        StageFinished(request_id=rid, stage=stage, replica=0, chunks=chunks),
        Finished(request_id=rid),
    ]


def interleaved(n_requests: int, chunks: int = 3) -> list[Event]:
    """Several requests' events, round-robin (as concurrent requests log)."""
    lives = [request_events(f"req-{i}", chunks) for i in range(n_requests)]
    out: list[Event] = []
    for k in range(max(len(x) for x in lives)):
        out.extend(life[k] for life in lives if k < len(life))
    return out


@pytest.fixture(params=["memory", "disk"])
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., EventLog]]:
    """A factory for a fresh log of each backend (closed at teardown)."""
    made: list[EventLog] = []

    def factory(**config: object) -> EventLog:
        if request.param == "memory":
            log: EventLog = MemoryLog(clock=ManualClock())
        else:
            cfg = LogConfig(**{"fsync": "none", **config})  # type: ignore[arg-type]
            log = DiskLog(tmp_path / f"log{len(made)}", cfg, clock=ManualClock())
        made.append(log)
        return log

    yield factory
    for log in made:
        log.close()


# -- real NATS servers (the replicated log's tests) -------------------------


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One real ``nats-server -js`` shared by the tests that do not restart
    or kill it (each uses its own log name: ``log_name``)."""
    with NatsServer(tmp_path_factory.mktemp("nats")) as srv:
        yield srv


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A server of the test's own, for tests that kill or restart it."""
    with NatsServer(tmp_path / "nats") as srv:
        yield srv


@pytest.fixture
def log_name(request: pytest.FixtureRequest) -> str:
    """A log (stream) name of the test's own on the shared server."""
    return "t" + hashlib.blake2b(request.node.nodeid.encode(), digest_size=6).hexdigest()
