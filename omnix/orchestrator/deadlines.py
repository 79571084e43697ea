"""Due times: when a live request's timeouts fall due, and what an expiry decides.

Owns: ``due_times`` (the request's deadline, each needed stage's timeout
while it waits for a replica or stays silent for ``timeout_s``, and the
wait for abort acknowledgements while it is cancelled: a pure function of
the plan and the fold) and ``expired``, the decision a ``DeadlineExpired``
leads to: cancel at the request's deadline, end a cancel whose aborts were
never acknowledged, fail a request a restarted server found too old to
resume, fail a stage that timed out.

Does not own the clock (``timers.py`` compares the due times with it and
appends ``DeadlineExpired``), nor what else the orchestrator keeps
(``plans.py``, ``placement.py``).
"""

from __future__ import annotations

from omnix.events.reducer import RequestState
from omnix.events.types import CancelRequested, DeadlineExpired, Event, Failed
from omnix.orchestrator.cancellation import cancelled
from omnix.orchestrator.plans import Plan
from omnix.pipelines.config import PipelineConfig

__all__ = ["due_times", "expired"]


def due_times(pipeline: PipelineConfig, plan: Plan, rs: RequestState) -> list[tuple[int, str]]:
    """``(due_ns, scope)`` for each timeout of a live request, earliest first."""
    if rs.terminal:
        return []
    if rs.status == "cancelling":
        return [(rs.cancel_ts + _ns(pipeline.abort_timeout_s), "abort")]
    out: list[tuple[int, str]] = []
    if rs.deadline_ns:
        out.append((rs.deadline_ns, "request"))
    for stage, tgt in plan.targets.items():
        timeout = _ns(pipeline.stage(stage).timeout_s)
        if tgt.queued_ts:
            out.append((tgt.queued_ts + timeout, stage))
        elif tgt.active:
            st = rs.stage(stage)
            if st is not None and st.active:
                out.append((st.last_activity_ts + timeout, stage))
    out.sort()
    return out


def expired(
    pipeline: PipelineConfig, plan: Plan, rs: RequestState, ev: DeadlineExpired
) -> list[Event]:
    """The decisions ``ev`` leads to (its ``scope`` says which timeout)."""
    cancelling = rs.status == "cancelling"
    if ev.scope == "request":
        if cancelling:
            return []
        return [
            CancelRequested(
                request_id=ev.request_id, ts_ns=ev.ts_ns, reason="deadline", cause=ev.pos
            )
        ]
    if ev.scope == "resume":
        # A restarted server found this request older than it resumes.
        if cancelling:
            return []
        return [
            Failed(
                request_id=ev.request_id,
                ts_ns=ev.ts_ns,
                reason="not_resumed",
                message="the server restarted too long after this request was admitted "
                "to resume it (omnix serve --resume-within)",
                cause=ev.pos,
            )
        ]
    if ev.scope == "abort":
        return [cancelled(rs, ev.ts_ns, ev.pos)] if cancelling else []
    tgt = plan.targets.get(ev.scope)
    if tgt is None or tgt.done or cancelling:
        return []
    timeout_s = pipeline.stage(ev.scope).timeout_s
    waiting = "a replica" if tgt.replica < 0 else "output"
    return [
        Failed(
            request_id=ev.request_id,
            ts_ns=ev.ts_ns,
            reason="stage_timeout" if tgt.replica >= 0 else "no_replica",
            message=f"stage {ev.scope!r} waited {timeout_s:g}s for {waiting}",
            stage=ev.scope,
            cause=ev.pos,
        )
    ]


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)
