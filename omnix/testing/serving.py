"""Serving scripted pipelines in-process, for HTTP tests and ``omnix bench http``.

Owns: ``InProcessRuntime``, a real-time stage runtime that runs each
stage's engine (``ScriptedEngine`` for ``kind = "scripted"``) as asyncio
tasks in the server's own process, emitting the same events a worker
would (StageStarted, Chunk, Progress, then StageFinished or StageFailed),
and ``serve_scripted``, which starts an ``Omni`` plus ``HttpServer`` on
either it or the real ``StageRuntime``.

It measures and tests the HTTP layer without process hops.  Never a
product default: ``omnix serve`` always runs real workers.

Does not own worker semantics (``omnix.stages.worker`` does; this mirrors
its per-request contract from docs/CONTRACTS.md) nor any decision.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from omnix.events.blobs import BlobStore
from omnix.events.types import (
    Chunk,
    Event,
    Progress,
    Scaled,
    StageFailed,
    StageFinished,
    StageStarted,
    WorkerJoined,
)
from omnix.pipelines.config import EngineArgs, PipelineConfig
from omnix.stages.ending import ending
from omnix.stages.engine import Engine, load_engine
from omnix.transport.work import EngineOutput, GenerateRequest, InputPiece, WorkItem

if TYPE_CHECKING:
    from omnix.api import Omni
    from omnix.http.app import HttpServer
    from omnix.http.options import HttpOptions
    from omnix.orchestrator.runtime import Runtime
    from omnix.stages.options import RuntimeOptions


class _Inputs:
    def __init__(self) -> None:
        self.items: list[InputPiece] = []
        self.closed = False
        self.event = asyncio.Event()

    def push(self, pieces: tuple[InputPiece, ...], last: bool) -> None:
        self.items.extend(pieces)
        self.closed = self.closed or last
        self.event.set()

    async def stream(self) -> AsyncIterator[InputPiece]:
        while True:
            while self.items:
                yield self.items.pop(0)
            if self.closed:
                return
            self.event.clear()
            await self.event.wait()


class _Exec:
    def __init__(self, work: WorkItem) -> None:
        self.rid = work.request_id
        self.stage = work.stage
        self.replica = work.replica
        self.inputs = _Inputs()
        self.task: asyncio.Task[None] | None = None
        # A continuation's chunks are numbered on from those delivered.
        self.chunks = work.resume.chunks if work.resume is not None else 0
        self.aborted = False
        self.done = False


class InProcessRuntime:
    """The ``Runtime`` protocol (``omnix.orchestrator.runtime``), in process."""

    def __init__(
        self,
        pipeline: PipelineConfig,
        emit: Callable[[Event], None],
        blobs: BlobStore,
        *,
        engine_factory: Callable[[EngineArgs], Engine] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.emit = emit
        self.blobs = blobs
        self._factory = engine_factory
        self.engines: dict[tuple[str, int], Engine] = {}
        self._execs: dict[tuple[str, str], _Exec] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # replicas starting or draining

    async def start(self) -> None:
        for st in self.pipeline.stages:
            for rep in range(st.min_replicas):
                await self._start_replica(st.name, rep)

    async def _start_replica(self, stage: str, replica: int) -> None:
        args = self.pipeline.stage(stage).engine
        kind = args.__struct_config__.tag
        assert isinstance(kind, str), kind  # engine configs are tagged by name
        engine = self._factory(args) if self._factory else load_engine(kind, args)
        info = await engine.start()
        self.engines[(stage, replica)] = engine
        self.emit(
            WorkerJoined(
                worker_id=f"{stage}/{replica}",
                stage=stage,
                replica=replica,
                engine=info.engine,
                capacity=info.capacity,
            )
        )

    async def shutdown(self) -> None:
        tasks = [ex.task for ex in self._execs.values() if ex.task is not None]
        tasks += list(self._tasks)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        self._execs.clear()
        for engine in self.engines.values():
            await engine.close()

    def send(self, work: WorkItem) -> None:
        key = (work.request_id, work.stage)
        ex = self._execs.get(key)
        if work.seq == 0:
            if ex is not None and not ex.done:
                return
            # A first execution, or a continuation of one that failed.
            ex = _Exec(work)
            self._execs[key] = ex
            ex.inputs.push(work.pieces, work.last)
            ex.task = asyncio.get_running_loop().create_task(self._run(ex, work))
            return
        if ex is not None and not ex.aborted:
            ex.inputs.push(work.pieces, work.last)

    def abort(self, request_id: str, stage: str, replica: int) -> None:
        ex = self._execs.get((request_id, stage))
        if ex is None or ex.done or ex.aborted:
            return
        ex.aborted = True
        engine = self.engines[(stage, replica)]
        asyncio.get_running_loop().create_task(engine.abort(request_id))
        if ex.task is not None:
            ex.task.cancel()

    def scale(self, ev: Scaled) -> None:
        """Start a replica's engine (it joins once started), or drain one:
        once no execution runs on it, its engine closes and it leaves."""
        loop = asyncio.get_running_loop()
        if ev.op == "start":
            self._tasks.add(loop.create_task(self._start_replica(ev.stage, ev.replica)))
        elif ev.op == "drain":
            self._tasks.add(loop.create_task(self._drain(ev.stage, ev.replica)))

    async def _drain(self, stage: str, replica: int) -> None:
        while running := [
            ex.task
            for ex in self._execs.values()
            if ex.stage == stage and ex.replica == replica and not ex.done and ex.task is not None
        ]:
            await asyncio.wait(running)
        engine = self.engines.pop((stage, replica), None)
        if engine is None:
            return  # never started: nothing to leave
        await engine.close()
        self.emit(Scaled(stage=stage, replica=replica, op="left", replicas=-1, reason="drained"))

    def release(self, request_id: str) -> None:
        for key in [k for k in self._execs if k[0] == request_id]:
            ex = self._execs.pop(key)
            if ex.task is not None and not ex.done:
                ex.task.cancel()

    async def _run(self, ex: _Exec, work: WorkItem) -> None:
        rid, stage, replica = ex.rid, ex.stage, ex.replica
        self.emit(StageStarted(request_id=rid, stage=stage, replica=replica))
        engine = self.engines[(stage, replica)]
        last: EngineOutput | None = None
        try:
            async for out in engine.generate(
                GenerateRequest(
                    rid,
                    stage,
                    work.params,
                    work.seed,
                    work.resume,
                    work.feeds,
                    work.input_streams,
                ),
                ex.inputs.stream(),
            ):
                last = out
                if out.has_payload:
                    blob = None
                    if out.array is not None:
                        blob = self.blobs.put_array(out.array, out.media_type)
                    elif out.data:
                        blob = self.blobs.put(out.data, out.media_type)
                    self.emit(
                        Chunk(
                            request_id=rid,
                            stage=stage,
                            replica=replica,
                            index=ex.chunks,
                            modality=out.modality,
                            text=out.text,
                            token_ids=tuple(out.token_ids),
                            blob=blob,
                            piece=out.piece,
                            logprobs=out.logprobs,
                            reasoning=out.reasoning,
                            tool_calls=out.tool_calls,
                        )
                    )
                    ex.chunks += 1
                elif out.total > 0:
                    self.emit(
                        Progress(
                            request_id=rid,
                            stage=stage,
                            replica=replica,
                            step=out.step,
                            total=out.total,
                        )
                    )
        except asyncio.CancelledError:
            ex.done = True
            if ex.aborted:
                self.emit(self._aborted(ex))
            return
        except Exception as exc:
            ex.done = True
            if ex.aborted:
                self.emit(self._aborted(ex))
            else:
                self.emit(
                    StageFailed(
                        request_id=rid,
                        stage=stage,
                        replica=replica,
                        message=f"{type(exc).__name__}: {exc}",
                    )
                )
            return
        ex.done = True
        reason, failure = ending(last, ex.aborted, stage, ex.chunks)
        if failure:
            self.emit(StageFailed(request_id=rid, stage=stage, replica=replica, message=failure))
            return
        self.emit(
            StageFinished(
                request_id=rid,
                stage=stage,
                replica=replica,
                chunks=ex.chunks,
                finish_reason=reason,
                prompt_tokens=last.prompt_tokens if last is not None else 0,
                output_tokens=last.output_tokens if last is not None else 0,
            )
        )

    @staticmethod
    def _aborted(ex: _Exec) -> StageFinished:
        return StageFinished(
            request_id=ex.rid,
            stage=ex.stage,
            replica=ex.replica,
            chunks=ex.chunks,
            finish_reason="aborted",
        )


@contextlib.asynccontextmanager
async def serve_scripted(
    pipeline: PipelineConfig,
    options: HttpOptions | None = None,
    *,
    processes: bool = False,
    telemetry: Any = False,
    runtime_options: RuntimeOptions | None = None,
    omni_options: dict[str, Any] | None = None,
) -> AsyncIterator[HttpServer]:
    """An ``Omni`` serving ``pipeline`` over HTTP on a free loopback port,
    answering as ``options`` say.

    ``processes=True`` runs real worker processes (``StageRuntime`` with
    ``runtime_options``); otherwise ``InProcessRuntime``.  Yields the
    ``HttpServer`` (``.url``, ``.omni``)."""
    from omnix.api import Omni

    if processes:
        omni = Omni(pipeline, runtime_options=runtime_options, **(omni_options or {}))
    else:
        # runtime_options beside the in-process runtime: Omni's ValueError.
        omni = Omni(
            pipeline,
            runtime_factory=InProcessRuntime,
            runtime_options=runtime_options,
            **(omni_options or {}),
        )
    async with serve_omni(omni, options, telemetry=telemetry) as server:
        yield server


@contextlib.asynccontextmanager
async def serve_omni(
    omni: Omni,
    options: HttpOptions | None = None,
    *,
    grace_s: float = 1.0,
    telemetry: Any = True,
    ready_timeout_s: float = 120.0,
) -> AsyncIterator[HttpServer]:
    """Start ``omni`` (not started yet), wait until every stage can take
    work (``Omni.wait_ready``), and an ``HttpServer`` on it (on a free
    loopback port); on exit shut ``omni`` down (``grace_s``) and close the
    server."""
    from omnix.http.app import HttpServer

    await omni.start()
    server = HttpServer(omni, options, telemetry=telemetry)
    try:
        await omni.wait_ready(ready_timeout_s)
        await server.start()
        yield server
    finally:
        await omni.shutdown(grace_s=grace_s)
        await server.close()


if TYPE_CHECKING:
    _runtime: type[Runtime] = InProcessRuntime
