"""The orchestrator's decisions: a pure function of (pipeline config, log).

Owns: ``Orchestrator``, which admits or rejects requests and, for every
event appended to the log, returns the decision events that follow from it
(``Routed``, a continuation of a lost or failed stage included,
``CancelRequested`` on a deadline, ``Cancelled``, ``Failed``, ``Finished``),
plus ``due_times`` (when a request's timeouts fall due, for the timer to
compare with the wall clock).

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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_args

from omnix.events.reducer import Fold, RequestState, worker_id
from omnix.events.types import (
    Admitted,
    Cancelled,
    CancelReason,
    CancelRequested,
    Chunk,
    DeadlineExpired,
    Event,
    Failed,
    FailReason,
    Finished,
    Rejected,
    RequestSpec,
    Routed,
    StageFailed,
    StageFinished,
    WorkerJoined,
    WorkerLost,
)
from omnix.pipelines.config import EdgeConfig, PipelineConfig
from omnix.pipelines.plan import PipelineGraph
from omnix.pipelines.validate import SENTENCE_ENDS

#: 1: a stage with ``retry = true`` re-runs only while it has produced
#:    nothing, at most twice (``RULES_V1_MAX_ATTEMPTS``).
#: 2: a stage whose ``retries`` allows it continues after the chunks it
#:    delivered (``Routed.resume``), up to ``max_retries`` times; with no
#:    ready replica the continuation waits for one (a restarted replica).
RULES_VERSION = 2
RULES_V1_MAX_ATTEMPTS = 2

#: The fold keeps a request's cancel reason as a plain ``str``; this maps it
#: back to the ``CancelReason`` it was recorded as.
_CANCEL_REASONS: dict[str, CancelReason] = {r: r for r in get_args(CancelReason)}

_E = TypeVar("_E", bound=Event)
# A reaction filed under its event's type.  The table erases the parameter
# type; ``_reaction`` checks each entry when the table is built.
_Reaction = Callable[[Any, Fold], list[Event]]


def _reaction(
    cls: type[_E], fn: Callable[[_E, Fold], list[Event]]
) -> tuple[type[object], _Reaction]:
    return cls, fn


@dataclass(slots=True)
class _EdgeBuf:
    """Upstream chunk positions not yet forwarded along one edge."""

    positions: list[int] = field(default_factory=list)
    text_tail: str = ""
    source_done: bool = False


@dataclass(slots=True)
class _Target:
    """One needed stage of one request: its input pieces and placement."""

    pending: list[tuple[tuple[int, ...], bool]] = field(default_factory=list)
    routed: list[tuple[tuple[int, ...], bool]] = field(default_factory=list)
    replica: int = -1  # -1: not placed yet
    active: bool = False  # holds a slot of its replica
    done: bool = False
    queued_ts: int = 0  # waiting for a replica since (0: not waiting)
    attempts: int = 0
    resume: int = 0  # the next placement continues after this many chunks


@dataclass(slots=True)
class _Plan:
    request_id: str
    admitted_pos: int
    needed: tuple[str, ...]
    targets: dict[str, _Target]
    edges: dict[tuple[str, str], _EdgeBuf]


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
        self._live: dict[str, _Plan] = {}
        self._load: dict[str, int] = {}
        self._replicas: dict[str, list[int]] = {n: [] for n in self.graph.stage_names}
        self._queues: dict[str, dict[str, None]] = {n: {} for n in self.graph.stage_names}
        # Per event type, exact (events are final): one dict lookup per
        # event, where a chain of ``is`` tests costs one test per type.
        # Routed, StageStarted, Progress and Rejected decide nothing.
        self._reactions: dict[type[object], _Reaction] = dict(
            (
                _reaction(StageFinished, self._on_stage_finished),
                _reaction(Admitted, self._on_admitted),
                _reaction(CancelRequested, self._on_cancel_requested),
                _reaction(StageFailed, self._on_stage_failed),
                _reaction(DeadlineExpired, self._on_deadline),
                _reaction(Finished, self._on_terminal),
                _reaction(Cancelled, self._on_terminal),
                _reaction(Failed, self._on_terminal),
                _reaction(WorkerJoined, self._on_worker_joined),
                _reaction(WorkerLost, self._on_worker_lost),
            )
        )

    # -- introspection (tests, /ready, timers) ----------------------------
    @property
    def live_requests(self) -> tuple[str, ...]:
        return tuple(self._live)

    def queue_length(self, stage: str) -> int:
        return len(self._queues[stage])

    def load(self, stage: str, replica: int) -> int:
        return self._load.get(worker_id(stage, replica), 0)

    def ready_replicas(self, stage: str) -> int:
        return len(self._replicas[stage])

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
        for stage in needed:
            if not self._replicas[stage]:
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
            if len(self._queues[stage]) >= cfg.max_queue and self._pick(state, stage) < 0:
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

    # -- reaction -----------------------------------------------------------
    def react(self, ev: Event, state: Fold) -> list[Event]:
        """Decisions that follow from ``ev`` (already appended and folded)."""
        if type(ev) is Chunk:  # the most frequent event, tested before the table
            return self._on_chunk(ev, state)
        react = self._reactions.get(type(ev))
        return react(ev, state) if react is not None else []

    # -- handlers -----------------------------------------------------------
    def _on_admitted(self, ev: Admitted, state: Fold) -> list[Event]:
        needed = self.graph.needed_stages(tuple(ev.spec.outputs))
        edges = {
            (e.source, e.target): _EdgeBuf()
            for n in needed
            for e in self.graph.out_edges[n]
            if e.target in needed
        }
        plan = _Plan(ev.request_id, ev.pos, needed, {n: _Target() for n in needed}, edges)
        self._live[ev.request_id] = plan
        out: list[Event] = []
        for stage in self.graph.sources(needed):
            plan.targets[stage].pending.append(((ev.pos,), True))
            out += self._flush(plan, stage, ev, state)
        return out

    def adopt(self, ev: Admitted) -> None:
        """Know a request in flight whose history cannot be re-derived (a
        restart after retention released what it depended on): a plan with
        nothing placed, so the server can end it (``DeadlineExpired(resume)``
        fails it) without a load or queue place it does not hold."""
        needed = self.graph.needed_stages(tuple(ev.spec.outputs))
        edges = {
            (e.source, e.target): _EdgeBuf()
            for n in needed
            for e in self.graph.out_edges[n]
            if e.target in needed
        }
        targets = {n: _Target(done=True) for n in needed}
        self._live[ev.request_id] = _Plan(ev.request_id, ev.pos, needed, targets, edges)

    def _on_chunk(self, ev: Chunk, state: Fold) -> list[Event]:
        plan = self._live.get(ev.request_id)
        if plan is None or state.requests[ev.request_id].status == "cancelling":
            return []
        out: list[Event] = []
        for edge in self.graph.out_edges[ev.stage]:
            buf = plan.edges.get((edge.source, edge.target))
            if buf is None:
                continue
            buf.positions.append(ev.pos)
            if edge.forward == "finish":
                continue
            if edge.forward == "sentence":
                buf.text_tail = (buf.text_tail + ev.text)[-8:]
                boundary = buf.text_tail.rstrip(" ").endswith(SENTENCE_ENDS)
            else:
                boundary = False
            if boundary or len(buf.positions) >= edge.every:
                plan.targets[edge.target].pending.append((tuple(buf.positions), False))
                buf.positions.clear()
                buf.text_tail = ""
                out += self._flush(plan, edge.target, ev, state)
        return out

    def _on_stage_finished(self, ev: StageFinished, state: Fold) -> list[Event]:
        plan = self._live.get(ev.request_id)
        if plan is None:
            return []
        self._release_slot(plan, ev.stage)
        rs = state.requests[ev.request_id]
        out: list[Event] = []
        if rs.status == "cancelling":
            out += self._maybe_cancelled(rs, ev)
        else:
            for edge in self.graph.out_edges[ev.stage]:
                buf = plan.edges.get((edge.source, edge.target))
                if buf is None:
                    continue
                buf.source_done = True
                out += self._close_input(plan, edge.target, ev, state)
            if all(self._stage_status(rs, n) == "finished" for n in plan.needed):
                out.append(Finished(request_id=ev.request_id, ts_ns=ev.ts_ns, cause=ev.pos))
        out += self._drain(ev.stage, ev, state)
        return out

    def _on_stage_failed(self, ev: StageFailed, state: Fold) -> list[Event]:
        plan = self._live.get(ev.request_id)
        if plan is None:
            return []
        self._release_slot(plan, ev.stage)
        out = self._stage_gone(plan, ev.stage, ev, state, "stage_error", ev.message)
        return out + self._drain(ev.stage, ev, state)

    def _on_worker_joined(self, ev: WorkerJoined, state: Fold) -> list[Event]:
        reps = self._replicas[ev.stage]
        if ev.replica not in reps:
            reps.append(ev.replica)
            reps.sort()
        self._load[ev.worker_id] = 0
        return self._drain(ev.stage, ev, state)

    def _on_worker_lost(self, ev: WorkerLost, state: Fold) -> list[Event]:
        reps = self._replicas[ev.stage]
        if ev.replica in reps:
            reps.remove(ev.replica)
        self._load.pop(ev.worker_id, None)
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
        self, plan: _Plan, stage: str, ev: Event, state: Fold, reason: FailReason, message: str
    ) -> list[Event]:
        """A stage of a live request stopped without finishing (its replica
        was lost, or it failed): continue it elsewhere, or fail the request.
        A continuation re-sends every piece routed so far, its first one
        saying how many chunks the stage already delivered (``resume``)."""
        rs = state.requests[plan.request_id]
        if rs.status == "cancelling":
            return self._maybe_cancelled(rs, ev)
        st = rs.stage(stage)
        tgt = plan.targets[stage]
        if st is not None and self._may_retry(stage, st.chunks, tgt.attempts):
            # Every piece routed so far goes again, first to whichever
            # replica is free next; the stage continues after its chunks.
            tgt.pending = tgt.routed + tgt.pending
            tgt.routed = []
            tgt.replica = -1
            tgt.done = False
            tgt.resume = st.chunks
            return self._flush(plan, stage, ev, state)
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
        for stage, tgt in plan.targets.items():
            if tgt.queued_ts:
                self._queues[stage].pop(plan.request_id, None)
                tgt.queued_ts = 0
        return self._maybe_cancelled(state.requests[ev.request_id], ev)

    def _on_deadline(self, ev: DeadlineExpired, state: Fold) -> list[Event]:
        plan = self._live.get(ev.request_id)
        if plan is None:
            return []
        rs = state.requests[ev.request_id]
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
            if not cancelling:
                return []
            return [
                Cancelled(
                    request_id=ev.request_id,
                    ts_ns=ev.ts_ns,
                    reason=_CANCEL_REASONS[rs.cancel_reason],
                    cause=ev.pos,
                )
            ]
        tgt = plan.targets.get(ev.scope)
        if tgt is None or tgt.done or cancelling:
            return []
        cfg = self.pipeline.stage(ev.scope)
        waiting = "a replica" if tgt.replica < 0 else "output"
        return [
            Failed(
                request_id=ev.request_id,
                ts_ns=ev.ts_ns,
                reason="stage_timeout" if tgt.replica >= 0 else "no_replica",
                message=f"stage {ev.scope!r} waited {cfg.timeout_s:g}s for {waiting}",
                stage=ev.scope,
                cause=ev.pos,
            )
        ]

    def _on_terminal(self, ev: Cancelled | Failed | Finished, state: Fold) -> list[Event]:
        plan = self._live.pop(ev.request_id, None)
        if plan is None:
            return []
        stages: list[str] = []
        for stage, tgt in plan.targets.items():
            if tgt.active:
                self._dec_load(stage, tgt.replica)
                tgt.active = False
                stages.append(stage)
            if tgt.queued_ts:
                self._queues[stage].pop(plan.request_id, None)
        out: list[Event] = []
        for stage in stages:
            out += self._drain(stage, ev, state)
        return out

    # -- helpers ------------------------------------------------------------
    def _maybe_cancelled(self, rs: RequestState, ev: Event) -> list[Event]:
        if rs.active_stages():
            return []
        return [
            Cancelled(
                request_id=rs.request_id,
                ts_ns=ev.ts_ns,
                reason=_CANCEL_REASONS[rs.cancel_reason],
                cause=rs.cancel_pos,
            )
        ]

    @staticmethod
    def _stage_status(rs: RequestState, name: str) -> str:
        st = rs.stage(name)
        return st.status if st is not None else "pending"

    def _close_input(self, plan: _Plan, target: str, ev: Event, state: Fold) -> list[Event]:
        """An upstream of ``target`` finished: forward what is left, and
        close the input once every upstream has finished (fan-in)."""
        ins: tuple[EdgeConfig, ...] = tuple(
            e for e in self.graph.in_edges[target] if (e.source, e.target) in plan.edges
        )
        bufs = [plan.edges[(e.source, e.target)] for e in ins]
        if not all(b.source_done for b in bufs):
            return []
        sources: list[int] = []
        for b in bufs:
            sources += b.positions
            b.positions.clear()
        plan.targets[target].pending.append((tuple(sources), True))
        return self._flush(plan, target, ev, state)

    def _pick(self, state: Fold, stage: str) -> int:
        """The ready replica of ``stage`` with the least outstanding work and
        a free credit (ties: lowest index); -1 when none."""
        best, best_load = -1, 0
        for rep in self._replicas[stage]:
            wid = worker_id(stage, rep)
            ws = state.workers.get(wid)
            if ws is None or not ws.alive:
                continue
            load = self._load.get(wid, 0)
            if load < ws.capacity and (best < 0 or load < best_load):
                best, best_load = rep, load
        return best

    def _flush(self, plan: _Plan, stage: str, ev: Event, state: Fold) -> list[Event]:
        """Route ``stage``'s pending pieces, placing the stage first if needed."""
        tgt = plan.targets[stage]
        if not tgt.pending:
            return []
        if tgt.done:
            # It stopped early (max_tokens, a stop string): it takes no more
            # input, and the request finishes when the rest does.
            tgt.pending.clear()
            return []
        if tgt.replica < 0:
            rep = self._pick(state, stage)
            if rep < 0:
                if not tgt.queued_ts:
                    tgt.queued_ts = ev.ts_ns or 1
                    self._queues[stage][plan.request_id] = None
                return []
            tgt.replica = rep
            tgt.active = True
            tgt.attempts += 1
            tgt.queued_ts = 0
            self._queues[stage].pop(plan.request_id, None)
            wid = worker_id(stage, rep)
            self._load[wid] = self._load.get(wid, 0) + 1
        out: list[Event] = []
        for sources, last in tgt.pending:
            seq = len(tgt.routed)
            out.append(
                Routed(
                    request_id=plan.request_id,
                    ts_ns=ev.ts_ns,
                    stage=stage,
                    replica=tgt.replica,
                    seq=seq,
                    sources=sources,
                    last=last,
                    cause=ev.pos,
                    resume=tgt.resume if seq == 0 else 0,
                )
            )
            tgt.routed.append((sources, last))
        tgt.pending.clear()
        return out

    def _drain(self, stage: str, ev: Event, state: Fold) -> list[Event]:
        """Give freed credits of ``stage`` to queued requests, oldest first."""
        queue = self._queues[stage]
        out: list[Event] = []
        while queue:
            if self._pick(state, stage) < 0:
                break
            rid = next(iter(queue))
            plan = self._live.get(rid)
            if plan is None:  # pragma: no cover - terminal requests leave the queue
                queue.pop(rid)
                continue
            out += self._flush(plan, stage, ev, state)
        return out

    def _release_slot(self, plan: _Plan, stage: str) -> None:
        tgt = plan.targets.get(stage)
        if tgt is not None and tgt.active:
            tgt.active = False
            self._dec_load(stage, tgt.replica)
        if tgt is not None:
            tgt.done = True

    def _dec_load(self, stage: str, replica: int) -> None:
        wid = worker_id(stage, replica)
        if wid in self._load and self._load[wid] > 0:
            self._load[wid] -= 1

    # -- timeouts -------------------------------------------------------------
    def due_times(self, request_id: str, state: Fold) -> list[tuple[int, str]]:
        """``(due_ns, scope)`` for each timeout of a live request, earliest
        first.  The timer appends ``DeadlineExpired(scope)`` once the wall
        clock passes one; the decision is then made by ``react``."""
        plan = self._live.get(request_id)
        rs = state.requests.get(request_id)
        if plan is None or rs is None or rs.terminal:
            return []
        out: list[tuple[int, str]] = []
        if rs.status == "cancelling":
            return [(rs.cancel_ts + _s(self.pipeline.abort_timeout_s), "abort")]
        if rs.deadline_ns:
            out.append((rs.deadline_ns, "request"))
        for stage, tgt in plan.targets.items():
            timeout = _s(self.pipeline.stage(stage).timeout_s)
            if tgt.queued_ts:
                out.append((tgt.queued_ts + timeout, stage))
            elif tgt.active:
                st = rs.stage(stage)
                if st is not None and st.active:
                    out.append((st.last_activity_ts + timeout, stage))
        out.sort()
        return out


def _s(seconds: float) -> int:
    return int(seconds * 1_000_000_000)
