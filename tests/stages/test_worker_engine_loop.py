"""The worker's engine loop, in process against a fake engine: an engine
that ends a request as "aborted" when nobody asked for an abort has failed
the stage (an ``Error`` record), it did not acknowledge an abort (a
``Done(aborted)`` would end the stage as aborted while the request is not
cancelling, and nothing would ever finish the request)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from omnix.stages.worker import Worker
from omnix.transport import messages as m
from omnix.transport.work import EngineInfo, EngineOutput, GenerateRequest, InputPiece, WorkItem


class _AbortsOnItsOwn:
    """Yields one chunk, then a finish of "aborted" it was not asked for."""

    async def start(self) -> EngineInfo:
        return EngineInfo(engine="fake", capacity=1)

    def generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[EngineOutput]:
        yield EngineOutput(modality="text", text="hi")
        yield EngineOutput(modality="text", finish_reason="aborted", output_tokens=1)

    async def abort(self, request_id: str) -> None:
        raise AssertionError("nobody aborts here")

    async def close(self) -> None:
        pass


async def test_an_unasked_aborted_finish_is_an_error_not_an_acknowledgement() -> None:
    worker = Worker("ipc:///nonexistent", "s")
    requests, outbox = worker.requests, worker._outbox
    outbox.loop = asyncio.get_running_loop()
    requests.engine = _AbortsOnItsOwn()
    requests.capacity = 1
    sent: list[m.Record] = []
    ended = asyncio.Event()

    def send(mtype: bytes, records: list[m.Record]) -> None:
        sent.extend(records)
        if any(isinstance(r, (m.Done, m.Error)) for r in records):
            ended.set()

    outbox.send = send  # type: ignore[method-assign]
    outbox.sock = object()  # type: ignore[assignment]  # flush only checks it is set
    requests.on_work(WorkItem("r", "s", 0, 0, True, (InputPiece(text="x"),)))
    await asyncio.wait_for(ended.wait(), 5.0)
    await asyncio.sleep(0)  # the task's done callback: it must add nothing
    assert [type(r) for r in sent] == [m.Started, m.Output, m.Error]
    error = sent[-1]
    assert isinstance(error, m.Error)
    assert "aborted the request on its own" in error.message
    assert "r" not in requests.active
