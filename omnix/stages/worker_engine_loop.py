"""A stage worker's engine loop: one request run on the engine, as records.

Owns: ``EngineLoop``, which runs each request as a plain asyncio task
(``run``): ``Started`` once, an ``Output`` per output with a payload (its
index continues a migrated execution's), a ``ProgressRec`` per progress
step, then exactly one of ``Done`` (``finish_reason="aborted"`` only when
acknowledging an abort) or ``Error`` (the engine raised, or ended the
request as aborted when nobody asked: the stage failed, and the
orchestrator retries or fails it).  A request's slot is freed before its
end is recorded.  An engine that dies (``EngineDead``) stops the worker:
its exit makes the runtime record the replica lost.

Why plain tasks, each cancelled once on abort or shutdown, and not an
anyio task group under cancel scopes: an engine's clean-up on
cancellation must get to run (vLLM's ``generate`` awaits its own abort in
``except CancelledError``, and ``VllmEngine`` closes its stream in a
``finally``), which a cancel scope, cancelling again at every await, cuts
short; shutdown waits a bounded time for them, where a task group waits for
every child however long; and a task group plus a cancel scope costs ~40 us
more per request than ``create_task`` on a small machine, paid 32 times
over by a burst of 32 admissions.

Does not own which requests run (``worker_requests.py``), aborts
(``worker_control.py``) nor sending (``worker_outbox.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable

from omnix.stages.ending import ending
from omnix.stages.engine import EngineDead
from omnix.stages.worker_outbox import Outbox
from omnix.stages.worker_process import EXIT_ENGINE_FAILED
from omnix.stages.worker_requests import Req, Requests
from omnix.transport import messages as m
from omnix.transport.work import EngineOutput, GenerateRequest, WorkItem

log = logging.getLogger("omnix.worker")


class EngineLoop:
    def __init__(
        self,
        stage: str,
        requests: Requests,
        outbox: Outbox,
        *,
        stop: Callable[[int, str], None],
        stopping: Callable[[], bool],
    ) -> None:
        self.stage = stage
        self._requests = requests
        self._outbox = outbox
        self._stop = stop
        self._stopping = stopping

    def run(self, req: Req, item: WorkItem) -> None:
        """Run ``req`` (started by ``item``, its seq 0) in a task of its own."""
        assert self._outbox.loop is not None
        req.task = self._outbox.loop.create_task(self._execute(req, item))
        req.task.add_done_callback(functools.partial(self._on_task_done, req))

    async def _execute(self, req: Req, item: WorkItem) -> None:
        rid = req.rid
        req.started = True
        record = self._outbox.record
        record(m.Started(rid))
        engine = self._requests.engine
        assert engine is not None
        gen = engine.generate(
            GenerateRequest(
                rid,
                item.stage,
                item.params,
                item.seed,
                item.resume,
                item.feeds,
                item.input_streams,
            ),
            req.inputs,
        )
        try:
            await self._stream(req, gen)
        except asyncio.CancelledError:
            raise  # an abort (acknowledged in _on_task_done) or shutdown
        except EngineDead as exc:
            # Not this request's failure: the worker is useless now.  Its
            # exit makes the runtime record the replica lost (its requests
            # continue elsewhere) and start a new one.
            self._finished(req)
            log.error("stage %s's engine died: %s", self.stage, exc)
            self._stop(EXIT_ENGINE_FAILED, f"its engine died: {exc}")
            return
        except Exception as exc:
            self._finished(req)
            if req.aborted:  # some engines raise when aborted: that is the ack
                record(_done(req, "aborted"))
                return
            log.warning(
                "request %s failed on stage %s: %s: %s", rid, self.stage, type(exc).__name__, exc
            )
            # A ValueError is the request's own input refused (an unknown
            # voice, a prompt too long): another replica would refuse it too.
            record(m.Error(rid, f"{type(exc).__name__}: {exc}", not isinstance(exc, ValueError)))
            return
        self._finished(req)
        # (vLLM's engine core aborts what runs when it shuts down: ``ending``
        # makes that a failure, not a finish the orchestrator never asked for.)
        reason, failure = ending(req.last, req.aborted, self.stage, req.chunks)
        if failure:
            log.warning("request %s: %s", rid, failure)
            record(m.Error(rid, failure))
            return
        record(_done(req, reason))
        # The end of a request is latency-critical (the next stage or the
        # client waits on it): send now rather than one loop turn later.
        self._outbox.flush()

    async def _stream(self, req: Req, gen: AsyncIterator[EngineOutput]) -> None:
        """Record each of the engine's outputs as it comes."""
        rid = req.rid
        record = self._outbox.record
        async for out in gen:
            req.last = out
            if out.has_payload:
                record(
                    m.Output(
                        rid,
                        req.chunks,
                        out.modality,
                        out.text,
                        out.token_ids,
                        out.array,
                        out.data,
                        out.media_type,
                        out.piece,
                        out.logprobs,
                        out.reasoning,
                        out.tool_calls,
                    )
                )
                req.chunks += 1
            elif out.total > 0:
                record(m.ProgressRec(rid, out.step, out.total, out.preview, out.media_type))
            # else: payload-free finish metadata, not a chunk

    def _finished(self, req: Req) -> None:
        """The request is over here: free its slot *before* its Done or Error
        is recorded.  The server returns the credit on that record and may
        send the next request at once; the task's done callback (which also
        pops) runs a loop turn later, and a new request read in between
        must not find this one still counted (it would be refused as over
        capacity)."""
        req.done = True
        self._requests.active.pop(req.rid, None)

    def _on_task_done(self, req: Req, task: asyncio.Task[None]) -> None:
        self._requests.active.pop(req.rid, None)
        if req.done:
            return
        req.done = True
        record = self._outbox.record
        if task.cancelled():
            if req.aborted:
                if not req.started:
                    record(m.Started(req.rid))
                record(_done(req, "aborted"))
            elif not self._stopping():
                # Nobody asked: the engine raised CancelledError by itself.
                # Report it, or the request would wait for its stage forever.
                if not req.started:
                    record(m.Started(req.rid))
                record(m.Error(req.rid, "the engine's generate() was cancelled without an abort"))
            # else: cancelled by this worker's shutdown; the server is going away
            return
        exc = task.exception()
        record(m.Error(req.rid, f"worker error: {type(exc).__name__}: {exc}"))


def _done(req: Req, reason: str) -> m.Done:
    last = req.last
    if last is None:  # the engine yielded nothing
        return m.Done(req.rid, req.chunks, reason)
    return m.Done(req.rid, req.chunks, reason, last.prompt_tokens, last.output_tokens)
