"""What the HTTP layer needs of the process it serves for.

Owns: ``OmniProtocol``, the protocol the HTTP handlers are written against.  Two
things implement it structurally: ``omnix.api.Omni`` (the pipeline served
in this process: ``omnix serve``) and ``omnix.cluster.remote.RemoteOmni``
(a frontend that follows a replicated log and hands what it must append
to the leader: ``omnix frontend``).  Reads come from ``log`` and
``blobs``; the calls that append (``admit``, ``cancel``, ``append_input``,
``record``, ``delete``) are the only way a handler changes anything.

Also ``Unavailable``, what either raises for "not now, retry" (503).

Does not own either implementation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Literal, Protocol

import numpy as np

from omnix.events.blobs import BlobStore
from omnix.events.log import EventLog
from omnix.events.reducer import RequestState
from omnix.events.retention import RequestStatusKind, Retention
from omnix.events.types import (
    Admitted,
    CancelReason,
    Event,
    Rejected,
    RequestSpec,
    SessionChanged,
)
from omnix.orchestrator.scaling import StageReplicas
from omnix.pipelines.config import PipelineConfig
from omnix.pipelines.plan import PipelineGraph
from omnix.stages.profile_calls import ProfileReport
from omnix.transport.work import EngineInfo


class Unavailable(RuntimeError):
    """The pipeline cannot take a request right now, for a while only: its
    replicated log is unreachable, or no leader answers a frontend (a
    failover).  Nothing was admitted; the HTTP layer answers 503 with
    Retry-After and this message."""


class OmniProtocol(Protocol):
    """A served pipeline as its HTTP handlers see it (see the module docstring)."""

    pipeline: PipelineConfig
    graph: PipelineGraph
    log: EventLog
    blobs: BlobStore
    retention: Retention | None

    @property
    def accepting(self) -> bool: ...

    def state(self, request_id: str) -> RequestState | None: ...

    def request_status(self, request_id: str) -> RequestStatusKind: ...

    def ready(self) -> dict[str, int]: ...

    def engines(self) -> list[tuple[str, int, EngineInfo]]: ...

    def events(self, request_id: str, start: int = 0) -> AsyncIterator[Event]: ...

    async def admit(
        self,
        members: Sequence[tuple[str, RequestSpec]],
        media: Sequence[tuple[np.ndarray, str]] = (),
    ) -> list[Admitted | Rejected]: ...

    async def set_replicas(self, stage: str, count: int) -> StageReplicas: ...

    def cancel(self, request_id: str, reason: CancelReason = "client") -> bool: ...

    def append_input(
        self,
        request_id: str,
        text: str = "",
        last: bool = False,
        audio: np.ndarray | None = None,
    ) -> bool: ...

    def record(self, ev: SessionChanged) -> SessionChanged: ...

    def delete(self, request_id: str) -> bool: ...

    async def profile(
        self, action: Literal["start", "stop"], stages: Sequence[str] = ()
    ) -> list[ProfileReport]: ...

    async def shutdown(self, grace_s: float = 5.0) -> None: ...
