"""A frontend's stand-in for ``Omni``: reads from a followed log, writes through the leader.

Owns: ``RemoteOmni``, what ``omnix frontend`` serves the HTTP API with.
Everything a response is rendered from is read from the replicated log
this process follows (and the blobs that come with it), so a stream
survives the leader's death: the standby that takes over appends to the
same log, and the follower goes on.  What must be appended (an admission,
a cancel, more input, a session's change, a delete) is a call to the
leader (``wire``), retried across a failover for ``failover_wait_s``.

Admission is judged twice, on purpose: here first (the same pure
``validate_request`` the leader runs), so bad input gets its 4xx without
a round trip, and by the leader, which alone decides.  An admission
whose answer was lost (the leader died after appending it) is retried
with the same request ids; the new leader refuses them as duplicates,
and the followed log holds what the first attempt appended.

Cancels, input pieces, session changes and deletes leave in the order
they were made, one at a time (a request's input pieces must not
overtake each other).  Their yes/no is answered from the followed log
(the call goes out after); an input piece whose answer was lost in a
failover may be sent twice (docs/multihost.md).

Does not own judging (the leader's ``Omni``), the log, or the HTTP layer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import numpy as np

from omnix.api import DuplicateRequestId, ProfilingOff, ShuttingDown, request_events
from omnix.cluster import wire
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
    WorkerJoined,
)
from omnix.front import Unavailable
from omnix.orchestrator.scaling import ScaleRefused, StageReplicas
from omnix.pipelines.plan import PipelineGraph, RequestError, validate_request
from omnix.stages.profile_calls import ProfileReport
from omnix.transport.work import EngineInfo

log = logging.getLogger("omnix.frontend")


class LeaderUnavailable(Unavailable):
    """No leader answered for ``failover_wait_s``: the HTTP layer says 503."""


class RemoteOmni:
    """The HTTP API's ``Omni`` on a frontend (``omnix.front.OmniProtocol``)."""

    retention: Retention | None = None

    def __init__(
        self,
        info: wire.LeaderInfo,
        log: EventLog,
        blobs: BlobStore,
        nc: Any,
        log_name: str,
        *,
        call_timeout_s: float = 2.0,
        failover_wait_s: float = 15.0,
    ) -> None:
        self.pipeline = info.pipeline
        self.graph = PipelineGraph(info.pipeline)
        self.log = log
        self.blobs = blobs
        self._nc = nc
        self.subject = wire.calls_subject(log_name)
        self.call_timeout_s = call_timeout_s
        self.failover_wait_s = failover_wait_s
        self._engines: list[tuple[str, int, EngineInfo]] = []
        self._outbox: asyncio.Queue[wire.Call] = asyncio.Queue()
        self._sender: asyncio.Task[None] | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._stopped = False

    # -- lifecycle ----------------------------------------------------------
    async def start(self) -> RemoteOmni:
        self._sender = asyncio.create_task(self._send_in_order(), name="omnix-frontend-calls")
        with contextlib.suppress(LeaderUnavailable):
            await self.refresh_engines()
        self.log.add_listener(self._on_event)
        return self

    def _on_event(self, ev: Event) -> None:
        # A replica joined (a new leader's, or a restarted one): ask again.
        if type(ev) is WorkerJoined and (self._refresh is None or self._refresh.done()):
            self._refresh = asyncio.get_running_loop().create_task(self._refresh_quietly())

    async def _refresh_quietly(self) -> None:
        with contextlib.suppress(LeaderUnavailable):
            await self.refresh_engines()

    async def shutdown(self, grace_s: float = 5.0) -> None:
        self._stopped = True
        self.log.remove_listener(self._on_event)
        if self._refresh is not None:
            self._refresh.cancel()
        if self._sender is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_s):
                    await self._outbox.join()
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender

    @property
    def accepting(self) -> bool:
        return not self._stopped and not self.log.closed

    # -- reads: the followed log --------------------------------------------
    def state(self, request_id: str) -> RequestState | None:
        return self.log.state.requests.get(request_id)

    def request_status(self, request_id: str) -> RequestStatusKind:
        if request_id in self.log.state.requests:
            return "retained"
        return "released" if self.log.released(request_id) else "unknown"

    def ready(self) -> dict[str, int]:
        """Ready replicas per stage, as the log records them."""
        out = dict.fromkeys(self.graph.stage_names, 0)
        for ws in self.log.state.workers.values():
            if ws.alive and ws.stage in out:
                out[ws.stage] += 1
        return out

    def engines(self) -> list[tuple[str, int, EngineInfo]]:
        """The leader's ready replicas, as it last answered."""
        return list(self._engines)

    async def events(self, request_id: str, start: int = 0) -> AsyncIterator[Event]:
        async for ev in request_events(self.log, request_id, start):
            yield ev

    # -- writes: calls to the leader ----------------------------------------
    async def admit(
        self,
        members: Sequence[tuple[str, RequestSpec]],
        media: Sequence[tuple[np.ndarray, str]] = (),
    ) -> list[Admitted | Rejected]:
        """``Omni.submit_group`` through the leader."""
        if self._stopped:
            raise ShuttingDown("the frontend is shutting down")
        for rid, _ in members:
            if rid in self.log.state.requests:
                raise DuplicateRequestId(rid)
        for _, spec in members:
            validate_request(self.graph, spec)
        call = wire.AdmitCall(
            members=tuple(members),
            media=tuple(wire.Blob.of_array(arr, mt) for arr, mt in media),
        )
        reply = await self._call(call)
        if isinstance(reply, wire.CallError) and reply.kind == "duplicate":
            # Not a duplicate when this frontend asked: an earlier attempt
            # of this call was appended and its answer lost in a failover.
            return await self._admitted(members, reply)
        if isinstance(reply, wire.CallError):
            _raise(reply)
        if not isinstance(reply, wire.Appended):
            raise RuntimeError(f"the leader answered an admission with {type(reply).__name__}")
        events = list(reply.events)
        if events:
            await self.log.wait_for(max(ev.pos for ev in events))
        return events

    async def _admitted(
        self, members: Sequence[tuple[str, RequestSpec]], refusal: wire.CallError
    ) -> list[Admitted | Rejected]:
        """The events an earlier attempt of this admission appended, read
        from the followed log; the leader's refusal if they are not this
        call's (another client took the id)."""
        out: list[Admitted | Rejected] = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.call_timeout_s):
                for rid, spec in members:
                    async for ev in request_events(self.log, rid):
                        if isinstance(ev, Admitted | Rejected) and ev.spec == spec:
                            out.append(ev)
                        break
        if len(out) != len(members):
            _raise(refusal)
        return out

    def cancel(self, request_id: str, reason: CancelReason = "client") -> bool:
        rs = self.state(request_id)
        if rs is None or rs.terminal:
            return False
        self._outbox.put_nowait(wire.CancelCall(request_id=request_id, reason=reason))
        return True

    def append_input(
        self,
        request_id: str,
        text: str = "",
        last: bool = False,
        audio: np.ndarray | None = None,
    ) -> bool:
        rs = self.state(request_id)
        if rs is None or rs.terminal or not rs.input_open:
            return False
        blob = None if audio is None else wire.Blob.of_array(audio, "")
        self._outbox.put_nowait(
            wire.InputCall(request_id=request_id, text=text, last=last, audio=blob)
        )
        return True

    def record(self, ev: SessionChanged) -> SessionChanged:
        refs = [part.blob for part in ev.media]
        self._outbox.put_nowait(wire.RecordCall(event=ev, blobs=wire.media_blobs(self.blobs, refs)))
        return ev

    def delete(self, request_id: str) -> bool:
        rs = self.state(request_id)
        if rs is None or not rs.terminal:
            return False
        self._outbox.put_nowait(wire.DeleteCall(request_id=request_id))
        return True

    async def profile(
        self, action: Literal["start", "stop"], stages: Sequence[str] = ()
    ) -> list[ProfileReport]:
        reply = await self._call(wire.ProfileCall(action=action, stages=tuple(stages)))
        if isinstance(reply, wire.CallError):
            _raise(reply)
        if not isinstance(reply, wire.Profiled):
            raise RuntimeError(f"the leader answered a profile call with {type(reply).__name__}")
        return [ProfileReport(s, r, ok, detail) for s, r, ok, detail in reply.reports]

    async def set_replicas(self, stage: str, count: int) -> StageReplicas:
        reply = await self._call(wire.ScaleCall(stage=stage, count=count))
        if isinstance(reply, wire.CallError):
            _raise(reply)
        if not isinstance(reply, wire.Replicas):
            raise RuntimeError(f"the leader answered a scale call with {type(reply).__name__}")
        return reply.replicas

    async def refresh_engines(self) -> None:
        reply = await self._call(wire.EnginesCall())
        if isinstance(reply, wire.Engines):
            self._engines = list(reply.engines)

    # -- sending --------------------------------------------------------------
    async def _call(self, call: wire.Call) -> wire.Reply:
        """One call, retried while no leader answers (a failover), for up
        to ``failover_wait_s``."""
        data = wire.encode(call)
        deadline = time.monotonic() + self.failover_wait_s
        while True:
            try:
                msg = await self._nc.request(self.subject, data, timeout=self.call_timeout_s)
                return wire.decode_reply(msg.data)
            except Exception as exc:  # no responders, a timeout, a reconnect
                if time.monotonic() >= deadline:
                    raise LeaderUnavailable(
                        f"no leader answered on {self.subject} for {self.failover_wait_s:g} s "
                        f"({type(exc).__name__}); retry shortly"
                    ) from None
                await asyncio.sleep(0.1)

    async def _send_in_order(self) -> None:
        while True:
            call = await self._outbox.get()
            try:
                reply = await self._call(call)
                if isinstance(reply, wire.CallError):
                    log.warning("the leader refused %s: %s", type(call).__name__, reply.message)
            except LeaderUnavailable as exc:
                log.error("%s was not delivered: %s", type(call).__name__, exc)
            finally:
                self._outbox.task_done()


def _raise(err: wire.CallError) -> None:
    """Raise on the frontend what the leader's ``Omni`` raised."""
    match err.kind:
        case "duplicate":
            raise DuplicateRequestId(err.request_id)
        case "request":
            raise RequestError(err.message, err.param, err.code)
        case "shutting_down":
            raise ShuttingDown(err.message)
        case "profiling_off":
            raise ProfilingOff(err.message)
        case "value":
            raise ValueError(err.message)
        case "scale":
            raise ScaleRefused(err.status, err.code, err.message)
        case "internal":
            raise RuntimeError(f"the leader failed the call: {err.message}")
