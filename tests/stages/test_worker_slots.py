"""A worker frees a finished request's slot before it reports the end.

The server returns a credit when it reads a request's ``Done`` and may send
the next request at once; if that request is read before the finished
task's done callback runs (a loop turn later), it must not be refused as
over capacity.  Found by ``omnix bench engines`` on a loaded machine; here
the next request is delivered synchronously from inside the send of the
``Done``, the earliest moment a server could answer.
"""

from __future__ import annotations

import asyncio

from omnix.engines.scripted import ScriptedEngine
from omnix.pipelines.config import ScriptedArgs
from omnix.stages.worker import Worker
from omnix.transport import messages as m
from omnix.transport.work import InputPiece, WorkItem


def _work(rid: str) -> WorkItem:
    return WorkItem(rid, "s", 0, 0, True, (InputPiece(text="x"),))


async def test_next_request_read_right_after_done_is_not_over_capacity() -> None:
    worker = Worker("ipc:///nonexistent", "s")
    requests, outbox = worker.requests, worker._outbox
    outbox.loop = asyncio.get_running_loop()
    requests.engine = ScriptedEngine(ScriptedArgs(chunks_per_piece=1, capacity=1))
    await requests.engine.start()
    requests.capacity = 1
    sent: list[m.Record] = []
    both_done = asyncio.Event()

    def send(mtype: bytes, records: list[m.Record]) -> None:
        sent.extend(records)
        for rec in records:
            if rec == m.Done("r1", 1, "stop", 1, 1):
                requests.on_work(_work("r2"))  # the server's immediate answer
            if isinstance(rec, (m.Done, m.Error)) and rec.request_id == "r2":
                both_done.set()

    outbox.send = send  # type: ignore[method-assign]
    outbox.sock = object()  # type: ignore[assignment]  # flush only checks it is set
    requests.on_work(_work("r1"))
    await asyncio.wait_for(both_done.wait(), 5.0)
    errors = [r for r in sent if isinstance(r, m.Error)]
    assert errors == []
    assert [r for r in sent if isinstance(r, m.Done)] == [
        m.Done("r1", 1, "stop", 1, 1),
        m.Done("r2", 1, "stop", 1, 1),
    ]
