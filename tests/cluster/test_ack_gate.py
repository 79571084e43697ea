"""On a replicated log a worker acts on an event only once JetStream
acknowledged it (``Dispatcher(wait_for_ack=True)``, ``AckGate``): a piece
routed while NATS is away reaches the runtime only after NATS is back and
the event is acked, so a takeover can never find work its log lacks."""

from __future__ import annotations

import asyncio

from omnix.events.blobs import MemoryBlobStore
from omnix.events.natslog import NatsLog
from omnix.events.types import Admitted, CancelRequested, RequestSpec, Routed, Scaled
from omnix.orchestrator.dispatch import Dispatcher
from omnix.pipelines.validate import parse_pipeline
from omnix.testing.nats_server import NatsServer
from omnix.transport.work import WorkItem

CFG = parse_pipeline(
    """
name = "ack-gate"
[[stages]]
name = "thinker"
engine = { kind = "scripted" }
[outputs]
text = "thinker"
"""
)


class Calls:
    """The runtime calls the dispatcher makes, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def start(self) -> None: ...

    def send(self, work: WorkItem) -> None:
        self.calls.append(("send", work.request_id))

    def abort(self, request_id: str, stage: str, replica: int) -> None:
        self.calls.append(("abort", request_id))

    def release(self, request_id: str) -> None:
        self.calls.append(("release", request_id))

    def scale(self, ev: Scaled) -> None: ...

    async def shutdown(self) -> None: ...


async def settle(log: NatsLog) -> None:
    await log.flush()
    for _ in range(5):
        await asyncio.sleep(0)  # the gate's task runs what the ack let through


async def test_work_reaches_the_runtime_only_once_acknowledged(own_nats: NatsServer) -> None:
    log = await NatsLog.open(own_nats.url, name="gate")
    runtime = Calls()
    log.add_listener(Dispatcher(log, runtime, MemoryBlobStore(), CFG, wait_for_ack=True))
    try:
        log.append(Admitted(request_id="r", pipeline=CFG.name, spec=RequestSpec(prompt="hi")))
        log.append(
            Routed(request_id="r", stage="thinker", replica=0, seq=0, sources=(0,), last=True)
        )
        assert runtime.calls == []  # appended, not acknowledged yet
        await settle(log)
        assert runtime.calls == [("send", "r")]

        own_nats.kill()
        await asyncio.sleep(0.3)
        log.append(CancelRequested(request_id="r", reason="client"))
        await asyncio.sleep(1.0)
        assert runtime.calls == [("send", "r")]  # NATS away: the abort waits
        own_nats.start()
        await asyncio.wait_for(settle(log), 30)
        assert runtime.calls == [("send", "r"), ("abort", "r")]
    finally:
        await log.aclose()
