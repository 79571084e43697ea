"""The requests a stage worker runs, and how their input reaches the engine.

Owns: ``Requests``, the worker's table of running requests and its memory
of aborted ids, and the feeding of WORK into it: a seq-0 item starts a
request (unless the worker is stopping, the id runs already or was
aborted, no engine is loaded, or the worker is at capacity: each refused
with a log line or an ``Error`` record); later pieces are pushed into the
request's ``Inputs``, the queue-backed async iterator ``engine.generate``
reads.  ``Req`` is one running request's bookkeeping.

Does not own running the engine (``worker_engine_loop.py``), aborts
(``worker_control.py``) nor the socket (``worker_outbox.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Callable

from omnix.stages.engine import Engine
from omnix.stages.worker_outbox import Outbox
from omnix.transport import messages as m
from omnix.transport.work import EngineOutput, InputPiece, WorkItem

log = logging.getLogger("omnix.worker")

ABORTED_MEMORY = 4096  # recently aborted request ids remembered to drop late work


class Inputs:
    """The async iterator ``engine.generate`` reads a request's pieces from."""

    __slots__ = ("_closed", "_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[InputPiece] = deque()
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None

    def push(self, pieces: tuple[InputPiece, ...], last: bool) -> None:
        self._items.extend(pieces)
        if last:
            self._closed = True
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def __aiter__(self) -> Inputs:
        return self

    async def __anext__(self) -> InputPiece:
        while not self._items:
            if self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


class Req:
    __slots__ = (
        "aborted",
        "chunks",
        "done",
        "inputs",
        "last",
        "next_seq",
        "rid",
        "started",
        "task",
    )

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.inputs = Inputs()
        self.task: asyncio.Task[None] | None = None
        self.chunks = 0
        self.next_seq = 1
        self.started = False
        self.done = False
        self.aborted = False
        self.last: EngineOutput | None = None  # the engine's latest output (finish metadata)


class Requests:
    """``active``: the requests running here by id; ``aborted``: ids
    recently aborted (their late work is dropped)."""

    def __init__(
        self,
        outbox: Outbox,
        *,
        run: Callable[[Req, WorkItem], None],
        stopping: Callable[[], bool],
        who: Callable[[], str],
    ) -> None:
        self._outbox = outbox
        self._run = run
        self._stopping = stopping
        self._who = who
        self.engine: Engine | None = None
        self.capacity = 0
        self.active: dict[str, Req] = {}
        self.aborted: OrderedDict[str, None] = OrderedDict()

    def remember_aborted(self, rid: str) -> None:
        self.aborted[rid] = None
        if len(self.aborted) > ABORTED_MEMORY:
            self.aborted.popitem(last=False)

    def on_work_batch(self, _: bytes, items: list[WorkItem]) -> None:
        for item in items:
            self.on_work(item)

    def on_work(self, item: WorkItem) -> None:
        rid = item.request_id
        req = self.active.get(rid)
        if item.seq == 0:
            self._start(item, req)
            return
        if req is None or req.aborted:
            if rid not in self.aborted:
                log.debug(
                    "request %s: piece %d for a request not running here; dropped", rid, item.seq
                )
            return
        if item.seq != req.next_seq:
            log.error(
                "request %s: piece seq %d, expected %d (pieces out of order)",
                rid,
                item.seq,
                req.next_seq,
            )
        req.next_seq = item.seq + 1
        req.inputs.push(item.pieces, item.last)

    def _start(self, item: WorkItem, running: Req | None) -> None:
        """A new request (seq 0): run it, or say why not."""
        rid = item.request_id
        if self._stopping():
            log.warning("request %s arrived while this worker is stopping; dropped", rid)
            return
        if running is not None:
            log.error("request %s: a second seq 0 while it runs; dropped", rid)
            return
        if rid in self.aborted:
            log.info("request %s was aborted; dropping its work", rid)
            return
        if self.engine is None:
            self._outbox.record(m.Error(rid, "worker received work before its engine was ready"))
            return
        if len(self.active) >= self.capacity:
            log.error("request %s: over capacity (%d running); refused", rid, len(self.active))
            self._outbox.record(
                m.Error(
                    rid,
                    f"worker {self._who()} is at its capacity of {self.capacity} "
                    "requests; the runtime should not have sent more (credit accounting bug)",
                )
            )
            return
        req = Req(rid)
        if item.resume is not None:
            # A migrated execution: its outputs continue the stage's
            # chunk indices where the lost replica's stopped.
            req.chunks = item.resume.chunks
        req.inputs.push(item.pieces, item.last)
        self.active[rid] = req
        self._run(req, item)
