"""A harness for runtime tests: a real StageRuntime, a MemoryLog that
validates every emitted event through the reducer, and waiting helpers."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import pytest

from omnix.events.blobs import MemoryBlobStore
from omnix.events.log import MemoryLog
from omnix.events.reducer import IllegalTransition
from omnix.events.types import Admitted, Event, RequestSpec, Routed, WorkerJoined
from omnix.pipelines.config import PipelineConfig, ScriptedArgs, StageConfig
from omnix.stages.options import RuntimeOptions
from omnix.stages.runtime import StageRuntime
from omnix.transport.work import InputPiece, WorkItem


def scripted_pipeline(**stages: tuple[ScriptedArgs, int]) -> PipelineConfig:
    return PipelineConfig(
        name="test",
        stages=tuple(StageConfig(name=n, engine=a, replicas=r) for n, (a, r) in stages.items()),
    )


class Harness:
    def __init__(self, pipeline: PipelineConfig, **kw) -> None:
        self.log = MemoryLog()
        self.blobs = MemoryBlobStore()
        self.events: list[tuple[float, Event]] = []  # (monotonic time, event) as emitted
        self.illegal: list[str] = []
        self._changed = asyncio.Event()
        self._seq: dict[tuple[str, str], int] = {}
        kw.setdefault("forward_worker_output", True)
        self.rt = StageRuntime(pipeline, self._emit, self.blobs, RuntimeOptions(**kw))

    def _emit(self, ev: Event) -> None:
        self.events.append((time.monotonic(), ev))
        try:
            self.log.append(ev)
        except IllegalTransition as exc:
            self.illegal.append(str(exc))
        self._changed.set()

    async def wait_for(
        self,
        pred: Callable[[], object],
        timeout: float = 10.0,  # noqa: ASYNC109
        what: str = "",
    ) -> object:
        deadline = time.monotonic() + timeout
        while not (res := pred()):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"timed out waiting for {what or pred}; events: {self.kinds()}"
                )
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(left, 0.05))
            except TimeoutError:
                pass
        return res

    def of(self, cls: type, rid: str | None = None) -> list:
        return [
            e
            for _, e in self.events
            if isinstance(e, cls) and (rid is None or getattr(e, "request_id", None) == rid)
        ]

    def for_request(self, rid: str) -> list[Event]:
        return [e for _, e in self.events if getattr(e, "request_id", None) == rid]

    def kinds(self, rid: str | None = None) -> list[str]:
        evs = self.for_request(rid) if rid else [e for _, e in self.events]
        return [type(e).__name__ for e in evs]

    def joined_pids(self) -> list[int]:
        return [e.pid for e in self.of(WorkerJoined)]

    def send(
        self,
        rid: str,
        stage: str,
        replica: int = 0,
        pieces: tuple[InputPiece, ...] = (InputPiece(text="hi"),),
        last: bool = True,
        **kw,
    ) -> None:
        """Append Admitted/Routed as the orchestrator would, then send."""
        seq = self._seq.get((rid, stage), 0)
        if rid not in self.log.state.requests:
            self.log.append(
                Admitted(request_id=rid, pipeline="test", spec=RequestSpec(prompt="hi"))
            )
        self.log.append(
            Routed(request_id=rid, stage=stage, replica=replica, seq=seq, sources=(0,), last=last)
        )
        self._seq[(rid, stage)] = seq + 1
        self.rt.send(
            WorkItem(
                rid,
                stage,
                replica,
                seq,
                last,
                pieces,
                kw.pop("params", WorkItem.__struct_defaults__[0]),
                0,
            )
        )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); count it as gone only once reaped.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
async def harness_factory():
    made: list[Harness] = []

    def make(pipeline: PipelineConfig, **kw) -> Harness:
        h = Harness(pipeline, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        await h.rt.shutdown()
