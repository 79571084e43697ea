"""The orchestrator's decisions: a pure function of (pipeline config, log).

Owns: ``Orchestrator``, which admits or rejects requests and, for every
event appended to the log, returns the decision events that follow from it
(``Routed``, a continuation of a lost or failed stage included,
``CancelRequested`` on a deadline, ``Cancelled``, ``Failed``, ``Finished``),
plus ``due_times`` (when a request's timeouts fall due, for the timer to
compare with the wall clock).

Here: admission, the reaction to each event kind (one ``match``, so the
checker fails when an event kind joins the union unhandled), and the
continuation rule for a stage that stopped without finishing.  The
bookkeeping the reactions share lives beside it: the plans
(``plans.py``), where stages run (``placement.py``), routing and
forwarding (``routing.py``), when a cancelled request ends
(``cancellation.py``), due times (``deadlines.py``) and when a stage
that scales starts or drains a replica (``scaling.py``: sampled at each
admission and each end of its executions, after that event's own
decisions).

Does not own effects (sending work and aborts: ``dispatch.py``), time
(``timers.py`` appends ``DeadlineExpired`` when a due time passes) or the
append loop (``sequencer.py``).

Rules that keep replay exact:
  * No clock, no randomness.  A decision's ``ts_ns`` is its cause's.
  * Everything it keeps besides the fold (plans, queues, load) is derived
    from the events it has been shown, in log order, so a fresh
    Orchestrator fed the same log makes the same decisions.
  * Only ordered containers: lists, tuples and insertion-ordered dicts, and
    ties broken by an explicit key (load, then replica index).

``RULES_VERSION`` names the decision logic.  A deliberate change of rules
bumps it and keeps the old behaviour reachable behind ``self.rules`` so
traces recorded under the old rules still replay (as Temporal keeps
logic flags in its histories).
"""

from __future__ import annotations

from typing import assert_never

from omnix.events.reducer import Fold, RequestState, worker_id
from omnix.events.types import (
    Admitted,
    Cancelled,
    CancelRequested,
    Chunk,
    DeadlineExpired,
    Event,
    Failed,
    FailReason,
    Finished,
    InputAppended,
    Progress,
    Rejected,
    Released,
    RequestSpec,
    Routed,
    Scaled,
    SessionChanged,
    StageFailed,
    StageFinished,
    StageStarted,
    WorkerJoined,
    WorkerLost,
)
from omnix.orchestrator.cancellation import cancelled_once_idle
from omnix.orchestrator.deadlines import due_times, expired
from omnix.orchestrator.placement import Placement
from omnix.orchestrator.plans import Plan, new_plan
from omnix.orchestrator.routing import Router
from omnix.orchestrator.scaling import Scaler
from omnix.pipelines.config import PipelineConfig
from omnix.pipelines.plan import PipelineGraph

#: 1: a stage with ``retry = true`` re-runs only while it has produced
#:    nothing, at most twice (``RULES_V1_MAX_ATTEMPTS``).
#: 2: a stage whose ``retries`` allows it continues after the chunks it
#:    delivered (``Routed.resume``), up to ``max_retries`` times; with no
#:    ready replica the continuation waits for one (a restarted replica).
RULES_VERSION = 2
RULES_V1_MAX_ATTEMPTS = 2


class Orchestrator:
    """Admission, routing, forwarding, cancellation and failure decisions."""

    def __init__(self, pipeline: PipelineConfig, *, rules: int = RULES_VERSION) -> None:
        if rules > RULES_VERSION:
            raise ValueError(
                f"decision rules v{rules} are newer than this omnix (v{RULES_VERSION}); upgrade omnix"
            )
        self.pipeline = pipeline
        self.rules = rules
        self.graph = PipelineGraph(pipeline)
        self._placement = Placement(self.graph.stage_names)
        self._router = Router(self.graph, self._placement)
        self._live: dict[str, Plan] = self._router.live
        self.scaler = Scaler(pipeline)

    # -- introspection (tests, /ready, timers) ----------------------------
    @property
    def live_requests(self) -> tuple[str, ...]:
        return tuple(self._live)

    def queue_length(self, stage: str) -> int:
        return len(self._placement.queues[stage])

    def load(self, stage: str, replica: int) -> int:
        return self._placement.load.get(worker_id(stage, replica), 0)

    def ready_replicas(self, stage: str) -> int:
        """Ready replicas that take new work (a draining one does not)."""
        return len(self._placement.replicas[stage])

    def idle_scale(self, state: Fold, ts_ns: int) -> list[Scaled]:
        """The drains due at log time ``ts_ns`` with nothing happening
        (``Scaler.idle``): inputs, for the server's sweep to append."""
        return self.scaler.idle(state, self._placement, ts_ns)

    def routable(self, stage: str, replica: int) -> bool:
        """Whether routing may give ``replica`` a new request."""
        return replica in self._placement.replicas[stage]

    # -- admission --------------------------------------------------------
    def admit(
        self, state: Fold, request_id: str, spec: RequestSpec, ts_ns: int = 0
    ) -> Admitted | Rejected:
        """Admit ``spec`` or refuse it; the caller appends the result.

        The spec must already be valid for the pipeline
        (``omnix.pipelines.plan.validate_request``).
        """
        name = self.pipeline.name
        needed = self.graph.needed_stages(tuple(spec.outputs))
        placement = self._placement
        for stage in needed:
            if not placement.replicas[stage]:
                return Rejected(
                    request_id=request_id,
                    ts_ns=ts_ns,
                    pipeline=name,
                    spec=spec,
                    reason="not_ready",
                    message=f"stage {stage!r} has no ready replica",
                )
        for stage in needed:
            cfg = self.pipeline.stage(stage)
            if len(placement.queues[stage]) >= cfg.max_queue and placement.pick(state, stage) < 0:
                return Rejected(
                    request_id=request_id,
                    ts_ns=ts_ns,
                    pipeline=name,
                    spec=spec,
                    reason="overloaded",
                    message=f"stage {stage!r} is at capacity and its queue is full "
                    f"({cfg.max_queue} waiting)",
                )
        return Admitted(request_id=request_id, ts_ns=ts_ns, pipeline=name, spec=spec)

    def adopt(self, ev: Admitted) -> None:
        """Know a request in flight whose history cannot be re-derived (a
        restart after retention released what it depended on): a plan with
        nothing placed, so the server can end it (``DeadlineExpired(resume)``
        fails it) without a load or queue place it does not hold."""
        self._live[ev.request_id] = new_plan(self.graph, ev, done=True)

    # -- reaction -----------------------------------------------------------
    def react(self, ev: Event, state: Fold) -> list[Event]:
        """Decisions that follow from ``ev`` (already appended and folded)."""
        # The two most frequent kinds by exact type, before the match: each
        # class pattern it tries and misses is an isinstance on a Struct
        # (~60 ns, against ~10 for ``type(ev) is X``).
        if type(ev) is Chunk:
            return self._router.forward(ev, state)
        if type(ev) is Routed:
            return []  # a decision of ours; what it implies is the dispatcher's
        match ev:
            case StageFinished():
                return self._on_stage_finished(ev, state)
            case StageStarted() | Progress() | Released() | SessionChanged():
                return []  # nothing to decide
            case Rejected():
                if not self._live:
                    self.scaler.reset()  # an idle point (see scaling.py)
                return []
            case Admitted():
                return self._on_admitted(ev, state)
            case Finished() | Cancelled() | Failed():
                return self._router.retire(ev, ev.request_id, state)
            case CancelRequested():
                return self._on_cancel_requested(ev, state)
            case StageFailed():
                return self._on_stage_failed(ev, state)
            case DeadlineExpired():
                return self._on_deadline(ev, state)
            case InputAppended():
                plan = self._live.get(ev.request_id)
                return [] if plan is None else self._router.append_input(plan, ev, state)
            case WorkerJoined():
                self._placement.joined(ev)
                return self._router.drain(ev.stage, ev, state)
            case WorkerLost():
                self.scaler.lost(ev)
                return self._on_worker_lost(ev, state)
            case Scaled():
                return self._on_scaled(ev, state)
            case _:
                assert_never(ev)

    # -- handlers -----------------------------------------------------------
    def _on_admitted(self, ev: Admitted, state: Fold) -> list[Event]:
        if not self._live:
            self.scaler.reset()  # an idle point (see scaling.py)
        out = self._router.start(new_plan(self.graph, ev), ev, state)
        return out + self.scaler.sample(ev, state, self._placement)

    def _on_scaled(self, ev: Scaled, state: Fold) -> list[Event]:
        """A replica started (it routes once it joins), drains (no new
        request goes to it from here on) or left after its drain."""
        self.scaler.applied(ev, state)
        if ev.op == "drain":
            self._placement.drain(ev.stage, ev.replica)
        elif ev.op == "left":
            self._placement.left(ev.stage, ev.replica)
        return []

    def _on_stage_finished(self, ev: StageFinished, state: Fold) -> list[Event]:
        plan = self._live.get(ev.request_id)
        if plan is None:
            return []
        router = self._router
        router.release_slot(plan, ev.stage)
        rs = state.requests[ev.request_id]
        out: list[Event] = []
        if rs.status == "cancelling":
            out += cancelled_once_idle(rs, ev)
        else:
            out += router.upstream_finished(plan, ev, state)
            if all(_stage_status(rs, n) == "finished" for n in plan.needed):
                out.append(Finished(request_id=ev.request_id, ts_ns=ev.ts_ns, cause=ev.pos))
        out += router.drain(ev.stage, ev, state)
        return out + self.scaler.sample(ev, state, self._placement, ev.stage)

    def _on_stage_failed(self, ev: StageFailed, state: Fold) -> list[Event]:
        plan = self._live.get(ev.request_id)
        if plan is None:
            return []
        self._router.release_slot(plan, ev.stage)
        out = self._stage_gone(
            plan, ev.stage, ev, state, "stage_error", ev.message, may_continue=ev.retry
        )
        out += self._router.drain(ev.stage, ev, state)
        return out + self.scaler.sample(ev, state, self._placement, ev.stage)

    def _on_worker_lost(self, ev: WorkerLost, state: Fold) -> list[Event]:
        self._placement.lost(ev)
        out: list[Event] = []
        for plan in list(self._live.values()):
            tgt = plan.targets.get(ev.stage)
            if tgt is None or not tgt.active or tgt.replica != ev.replica:
                continue
            tgt.active = False
            out += self._stage_gone(
                plan,
                ev.stage,
                ev,
                state,
                "stage_lost",
                f"replica {ev.worker_id} was lost ({ev.reason})",
            )
        return out

    def _stage_gone(
        self,
        plan: Plan,
        stage: str,
        ev: Event,
        state: Fold,
        reason: FailReason,
        message: str,
        may_continue: bool = True,
    ) -> list[Event]:
        """A stage of a live request stopped without finishing (its replica
        was lost, or it failed): continue it elsewhere, or fail the request
        (at once when not ``may_continue``: its engine refused the request's
        own input).  A continuation re-sends every piece routed so far, its
        first one saying how many chunks the stage already delivered
        (``resume``)."""
        rs = state.requests[plan.request_id]
        if rs.status == "cancelling":
            return cancelled_once_idle(rs, ev)
        st = rs.stage(stage)
        tgt = plan.targets[stage]
        if may_continue and st is not None and self._may_retry(stage, st.chunks, tgt.attempts):
            # Every piece routed so far goes again, first to whichever
            # replica is free next; the stage continues after its chunks.
            tgt.pending = tgt.routed + tgt.pending
            tgt.routed = []
            tgt.replica = -1
            tgt.done = False
            tgt.resume = st.chunks
            return self._router.flush(plan, stage, ev, state)
        return [
            Failed(
                request_id=plan.request_id,
                ts_ns=ev.ts_ns,
                reason=reason,
                message=message,
                stage=stage,
                cause=ev.pos,
            )
        ]

    def _may_retry(self, stage: str, chunks: int, attempts: int) -> bool:
        cfg = self.pipeline.stage(stage)
        if self.rules < 2:
            return cfg.retry is True and chunks == 0 and attempts < RULES_V1_MAX_ATTEMPTS
        return cfg.retries and attempts <= cfg.max_retries

    def _on_cancel_requested(self, ev: CancelRequested, state: Fold) -> list[Event]:
        plan = self._live.get(ev.request_id)
        if plan is None:
            return []
        self._router.unqueue(plan)
        return cancelled_once_idle(state.requests[ev.request_id], ev)

    def _on_deadline(self, ev: DeadlineExpired, state: Fold) -> list[Event]:
        plan = self._live.get(ev.request_id)
        if plan is None:
            return []
        return expired(self.pipeline, plan, state.requests[ev.request_id], ev)

    # -- timeouts -------------------------------------------------------------
    def due_times(self, request_id: str, state: Fold) -> list[tuple[int, str]]:
        """``(due_ns, scope)`` for each timeout of a live request, earliest
        first.  The timer appends ``DeadlineExpired(scope)`` once the wall
        clock passes one; the decision is then made by ``react``."""
        plan = self._live.get(request_id)
        rs = state.requests.get(request_id)
        if plan is None or rs is None:
            return []
        return due_times(self.pipeline, plan, rs)


def _stage_status(rs: RequestState, name: str) -> str:
    st = rs.stage(name)
    return st.status if st is not None else "pending"
