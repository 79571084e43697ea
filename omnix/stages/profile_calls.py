"""The runtime's side of profiling: ask replicas to start or stop, gather answers.

Owns: ``ProfileCalls`` (send PROFILE to every ready replica of the stages
named, wait for each PROFILED answer up to a timeout) and ``ProfileReport``
(one replica's answer).  Does not own the profiler itself, which runs in
the worker (``profiler.py``, or the engine's own), nor where traces go
(``StageRuntime.profile_dir``, told to each worker in its WELCOME).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import msgspec

from omnix.pipelines.config import PipelineConfig
from omnix.stages.errors import RuntimeConfigError
from omnix.stages.slots import Slot, SlotTable
from omnix.stages.wire import Wire
from omnix.transport import messages as m


class ProfileReport(msgspec.Struct, frozen=True):
    """One replica's answer to a profiler start or stop: ``detail`` is where
    its traces go (start), the file written (stop), or what went wrong."""

    stage: str
    replica: int
    ok: bool
    detail: str


class ProfileCalls:
    def __init__(self, pipeline: PipelineConfig, slots: SlotTable, wire: Wire) -> None:
        self.pipeline = pipeline
        self._slots = slots
        self._wire = wire
        self._waits: dict[str, asyncio.Future[m.Profiled]] = {}  # by worker token

    def on_profiled(self, identity: bytes, msg: m.Profiled) -> None:
        wait = self._waits.pop(msg.token, None)
        if wait is not None and not wait.done():
            wait.set_result(msg)

    async def call(
        self, action: m.ProfileAction, stages: Iterable[str], timeout_s: float
    ) -> list[ProfileReport]:
        """Start or stop the profiler of every ready replica of ``stages``;
        each replica's answer (a replica that does not answer within
        ``timeout_s`` is reported as such).  Raises ``RuntimeConfigError``
        when a stage does not exist."""
        names = list(stages)
        known = {st.name for st in self.pipeline.stages}
        if unknown := [n for n in names if n not in known]:
            raise RuntimeConfigError(
                f"pipeline {self.pipeline.name!r} has no stage {', '.join(map(repr, unknown))} "
                f"(stages: {', '.join(sorted(known))})"
            )
        loop = self._wire.loop
        assert loop is not None
        asked: list[tuple[Slot, asyncio.Future[m.Profiled]]] = []
        for name in names:
            for slot in self._slots.stage(name):
                if slot.state != "ready" or slot.token is None:
                    continue
                wait = loop.create_future()
                self._waits[slot.token] = wait
                asked.append((slot, wait))
                self._wire.send_to(slot, m.PROFILE, m.Profile(action))
        if asked:
            await asyncio.wait([w for _, w in asked], timeout=timeout_s)
        reports = []
        for slot, wait in asked:
            if wait.done():
                got = wait.result()
                reports.append(ProfileReport(slot.stage, slot.replica, got.ok, got.detail))
            else:
                if slot.token is not None:
                    self._waits.pop(slot.token, None)
                reports.append(
                    ProfileReport(
                        slot.stage, slot.replica, False, f"no answer within {timeout_s:g} s"
                    )
                )
        return reports
