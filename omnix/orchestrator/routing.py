"""Routing and forwarding: which input pieces go to which replica, and when.

Owns: ``Router``: the live requests' plans; starting a request's source
stages on its admission; forwarding upstream chunks along each edge (every
``every`` chunks, at a sentence end, or once the source finishes) and
closing a stage's input once every upstream has finished (fan-in); a
``hidden`` chunk (a thinker's context for its talker) goes on alone, at once;
a chunk of reasoning or of a tool call alone goes nowhere (only the answer is
spoken);
placing a stage on a replica and routing its pending pieces (``Routed``,
a continuation's first one saying how many chunks it resumes after);
giving freed credits to queued requests, oldest first; and giving back a
request's slots and queue places when it ends.

Does not own which event leads to what (``decide.py`` reacts and calls
these), where a stage may run (``placement.py`` picks), the plans'
shape (``plans.py``), nor whether a stopped stage continues
(``decide.py``'s continuation rule).
"""

from __future__ import annotations

from omnix.events.reducer import Fold
from omnix.events.types import Admitted, Chunk, Event, InputAppended, Routed, StageFinished
from omnix.orchestrator.placement import Placement
from omnix.orchestrator.plans import Plan
from omnix.pipelines.config import EdgeConfig
from omnix.pipelines.plan import PipelineGraph
from omnix.pipelines.validate import SENTENCE_ENDS

__all__ = ["Router"]


class Router:
    """Routes the live requests' pieces over ``placement``'s replicas."""

    def __init__(self, graph: PipelineGraph, placement: Placement) -> None:
        self.graph = graph
        self.placement = placement
        #: the live requests' plans, in admission order
        self.live: dict[str, Plan] = {}

    def start(self, plan: Plan, ev: Admitted, state: Fold) -> list[Event]:
        """A request admitted: its source stages get the admission as their
        one and last piece (their first, when its input streams)."""
        self.live[plan.request_id] = plan
        out: list[Event] = []
        last = not ev.spec.input_streams
        for stage in self.graph.sources(plan.needed):
            plan.targets[stage].pending.append(((ev.pos,), last))
            out += self.flush(plan, stage, ev, state)
        return out

    def append_input(self, plan: Plan, ev: InputAppended, state: Fold) -> list[Event]:
        """More input for a request whose input streams: its source stages'
        next piece (their last, when it says so), unless it is cancelling."""
        if state.requests[ev.request_id].status == "cancelling":
            return []
        out: list[Event] = []
        for stage in self.graph.sources(plan.needed):
            plan.targets[stage].pending.append(((ev.pos,), ev.last))
            out += self.flush(plan, stage, ev, state)
        return out

    def forward(self, ev: Chunk, state: Fold) -> list[Event]:
        """An upstream chunk of a live request not being cancelled: buffered
        on each edge out of its stage, and forwarded as a piece once the
        edge's rule says so.  (``react`` calls it straight for every chunk.)"""
        plan = self.live.get(ev.request_id)
        if plan is None or state.requests[ev.request_id].status == "cancelling":
            return []
        out: list[Event] = []
        for edge in self.graph.out_edges[ev.stage]:
            buf = plan.edges.get((edge.source, edge.target))
            if buf is None:
                continue
            if ev.modality == "hidden":
                # A thinker's context for its talker is a piece of its own,
                # sent at once, ahead of the text it precedes (whatever the
                # edge's rule): the talker needs it before anything else, and
                # joined to text it could not be told apart.
                if buf.positions:
                    plan.targets[edge.target].pending.append((tuple(buf.positions), False))
                    buf.positions.clear()
                plan.targets[edge.target].pending.append(((ev.pos,), False))
                out += self.flush(plan, edge.target, ev, state)
                continue
            if ev.reasoning or ev.tool_calls:
                if not ev.text:
                    # Only the answer is spoken: a chunk of reasoning or of
                    # a tool call alone goes to no downstream stage.  (No
                    # chunk recorded before schema v10 has either, so the
                    # rule changes no recorded decision.)
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
                out += self.flush(plan, edge.target, ev, state)
        return out

    def upstream_finished(self, plan: Plan, ev: StageFinished, state: Fold) -> list[Event]:
        """A stage finished: each stage downstream of it gets what is left,
        and its input closes once every upstream has finished."""
        out: list[Event] = []
        for edge in self.graph.out_edges[ev.stage]:
            buf = plan.edges.get((edge.source, edge.target))
            if buf is None:
                continue
            buf.source_done = True
            out += self._close_input(plan, edge.target, ev, state)
        return out

    def _close_input(self, plan: Plan, target: str, ev: Event, state: Fold) -> list[Event]:
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
        return self.flush(plan, target, ev, state)

    def flush(self, plan: Plan, stage: str, ev: Event, state: Fold) -> list[Event]:
        """Route ``stage``'s pending pieces, placing the stage first if needed
        (or queueing the request for a replica when none is free)."""
        tgt = plan.targets[stage]
        if not tgt.pending:
            return []
        if tgt.done:
            # It stopped early (max_tokens, a stop string): it takes no more
            # input, and the request finishes when the rest does.
            tgt.pending.clear()
            return []
        if tgt.replica < 0:
            queue = self.placement.queues[stage]
            rep = self.placement.pick(state, stage)
            if rep < 0:
                if not tgt.queued_ts:
                    tgt.queued_ts = ev.ts_ns or 1
                    queue[plan.request_id] = None
                return []
            tgt.replica = rep
            tgt.active = True
            tgt.attempts += 1
            tgt.queued_ts = 0
            queue.pop(plan.request_id, None)
            self.placement.take_slot(stage, rep)
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

    def drain(self, stage: str, ev: Event, state: Fold) -> list[Event]:
        """Give freed credits of ``stage`` to queued requests, oldest first."""
        queue = self.placement.queues[stage]
        out: list[Event] = []
        while queue:
            if self.placement.pick(state, stage) < 0:
                break
            rid = next(iter(queue))
            plan = self.live.get(rid)
            if plan is None:  # pragma: no cover - terminal requests leave the queue
                queue.pop(rid)
                continue
            out += self.flush(plan, stage, ev, state)
        return out

    def release_slot(self, plan: Plan, stage: str) -> None:
        """``stage`` of the request stopped (finished or failed): it is done
        with its input and gives its replica's slot back."""
        tgt = plan.targets.get(stage)
        if tgt is not None and tgt.active:
            tgt.active = False
            self.placement.free_slot(stage, tgt.replica)
        if tgt is not None:
            tgt.done = True

    def unqueue(self, plan: Plan) -> None:
        """The request waits for no replica any more (it is cancelled)."""
        for stage, tgt in plan.targets.items():
            if tgt.queued_ts:
                self.placement.queues[stage].pop(plan.request_id, None)
                tgt.queued_ts = 0

    def retire(self, ev: Event, request_id: str, state: Fold) -> list[Event]:
        """The request ended: its plan goes, its slots and queue places are
        given back, and the freed credits go to queued requests."""
        plan = self.live.pop(request_id, None)
        if plan is None:
            return []
        stages: list[str] = []
        for stage, tgt in plan.targets.items():
            if tgt.active:
                self.placement.free_slot(stage, tgt.replica)
                tgt.active = False
                stages.append(stage)
            if tgt.queued_ts:
                self.placement.queues[stage].pop(plan.request_id, None)
        out: list[Event] = []
        for stage in stages:
            out += self.drain(stage, ev, state)
        return out
