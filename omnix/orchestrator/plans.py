"""A live request's plan: the stages it needs and what waits to reach each.

Owns: ``Plan`` (one live request: its needed stages, a ``Target`` per
stage with its input pieces and placement, an ``EdgeBuf`` per edge between
needed stages with the upstream chunks not yet forwarded) and ``new_plan``.
Plain bookkeeping, derived from the events the orchestrator was shown, in
ordered containers only.

Does not own what happens to a plan (``routing.py`` forwards and routes,
``decide.py`` reacts to events), where stages run (``placement.py``), nor
which stages a request needs (``omnix.pipelines.plan.PipelineGraph``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omnix.events.types import Admitted
from omnix.pipelines.plan import PipelineGraph

__all__ = ["EdgeBuf", "Piece", "Plan", "Target", "new_plan"]

#: An input piece of a stage: the positions of the events that make it up
#: (the admission for a source stage, upstream chunks otherwise) and
#: whether it closes the stage's input.
Piece = tuple[tuple[int, ...], bool]


@dataclass(slots=True)
class EdgeBuf:
    """Upstream chunk positions not yet forwarded along one edge."""

    positions: list[int] = field(default_factory=list)
    text_tail: str = ""
    source_done: bool = False


@dataclass(slots=True)
class Target:
    """One needed stage of one request: its input pieces and placement."""

    pending: list[Piece] = field(default_factory=list)
    routed: list[Piece] = field(default_factory=list)
    replica: int = -1  # -1: not placed yet
    active: bool = False  # holds a slot of its replica
    done: bool = False
    queued_ts: int = 0  # waiting for a replica since (0: not waiting)
    attempts: int = 0
    resume: int = 0  # the next placement continues after this many chunks


@dataclass(slots=True)
class Plan:
    request_id: str
    admitted_pos: int
    needed: tuple[str, ...]
    targets: dict[str, Target]
    edges: dict[tuple[str, str], EdgeBuf]


def new_plan(graph: PipelineGraph, ev: Admitted, *, done: bool = False) -> Plan:
    """The plan of an admitted request: a target per needed stage (each
    ``done`` already when the request is only adopted) and a buffer per
    edge between two of them."""
    needed = graph.needed_stages(tuple(ev.spec.outputs))
    edges = {
        (e.source, e.target): EdgeBuf()
        for n in needed
        for e in graph.out_edges[n]
        if e.target in needed
    }
    targets = {n: Target(done=done) for n in needed}
    return Plan(ev.request_id, ev.pos, needed, targets, edges)
