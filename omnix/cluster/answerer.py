"""The leader's side of its frontends' calls.

Owns: ``FrontendCallAnswerer``, which answers the calls of ``wire.Call`` on the log's
calls subject (NATS request/reply, a queue group so one leader answers
each) by calling the leader's ``Omni`` exactly as its own HTTP handlers do,
and replies once what the call appended is acknowledged by the log, so a
frontend that follows the log is about to see it.  Only a leader opens
one; a deposed leader closes it (``close``) before it steps down.

Does not own judging a request (``Omni.submit_group``), the wire format
(``wire``) nor the NATS connection (the server's).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, assert_never

from omnix.api import DuplicateRequestId, ProfilingOff, ShuttingDown
from omnix.cluster import wire
from omnix.orchestrator.scaling import ScaleRefused
from omnix.pipelines.plan import RequestError

if TYPE_CHECKING:
    from omnix.api import Omni

log = logging.getLogger("omnix.cluster")


class FrontendCallAnswerer:
    """Answers a log's frontend calls with ``omni``."""

    def __init__(self, omni: Omni, nc: Any, log_name: str) -> None:
        self.omni = omni
        self._nc = nc
        self.subject = wire.calls_subject(log_name)
        self._sub: Any = None

    async def open(self) -> None:
        self._sub = await self._nc.subscribe(self.subject, queue="leader", cb=self._on_call)

    async def close(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await sub.unsubscribe()

    async def _on_call(self, msg: Any) -> None:
        try:
            reply = await self.answer(wire.decode_call(msg.data))
        except Exception as exc:  # a frontend must get an answer, not a timeout
            log.exception("a frontend's call failed")
            reply = wire.CallError(kind="internal", message=f"{type(exc).__name__}: {exc}")
        if msg.reply:
            await msg.respond(wire.encode(reply))

    async def answer(self, call: wire.Call) -> wire.Reply:
        omni = self.omni
        try:
            match call:
                case wire.AdmitCall():
                    media = [(blob.array(), blob.ref.media_type) for blob in call.media]
                    events = omni.submit_group(call.members, media)
                    await omni.log.flush()
                    return wire.Appended(events=tuple(events))
                case wire.CancelCall():
                    return await self._done(omni.cancel(call.request_id, call.reason))
                case wire.InputCall():
                    audio = call.audio.array() if call.audio is not None else None
                    return await self._done(
                        omni.append_input(call.request_id, call.text, call.last, audio)
                    )
                case wire.RecordCall():
                    for blob in call.blobs:
                        blob.store(omni.blobs)
                    stored = omni.record(call.event)
                    await omni.log.flush()
                    return wire.Appended(session=stored)
                case wire.DeleteCall():
                    return await self._done(omni.delete(call.request_id))
                case wire.ProfileCall():
                    reports = await omni.profile(call.action, call.stages)
                    return wire.Profiled(
                        reports=tuple((r.stage, r.replica, r.ok, r.detail) for r in reports)
                    )
                case wire.EnginesCall():
                    return wire.Engines(engines=tuple(omni.engines()))
                case wire.ScaleCall():
                    replicas = await omni.set_replicas(call.stage, call.count)
                    await omni.log.flush()
                    return wire.Replicas(replicas=replicas)
                case _:
                    assert_never(call)
        except DuplicateRequestId as exc:
            return wire.CallError(kind="duplicate", message=str(exc), request_id=exc.request_id)
        except RequestError as exc:
            return wire.CallError(
                kind="request", message=exc.message, param=exc.param, code=exc.code
            )
        except ShuttingDown as exc:
            return wire.CallError(kind="shutting_down", message=str(exc))
        except ScaleRefused as exc:
            return wire.CallError(kind="scale", message=str(exc), code=exc.code, status=exc.status)
        except ProfilingOff as exc:
            return wire.CallError(kind="profiling_off", message=str(exc))
        except ValueError as exc:
            return wire.CallError(kind="value", message=str(exc))

    async def _done(self, ok: bool) -> wire.Done:
        await self.omni.log.flush()
        return wire.Done(ok=ok)
