"""How many requests admission would take now: the group-admission judgement.

Owns ``room`` (per source stage, the free credits of its ready replicas
plus its free queue places, the fewest over the sources; 0 when a needed
stage has no ready replica or is full) and ``group_rejections`` (a group
that does not fit, refused whole: one ``Rejected`` per member, so
metrics and traces count each).  Both read the orchestrator's load and
the log's workers only: a function of the pipeline and the log prefix,
like every decision.

Does not own appending the refusals nor admitting (``omnix.api.Omni``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from omnix.events.reducer import WorkerState
from omnix.events.types import Modality, Rejected, RejectReason, RequestSpec
from omnix.orchestrator.decide import Orchestrator
from omnix.pipelines.plan import PipelineGraph


def room(
    orch: Orchestrator,
    graph: PipelineGraph,
    workers: Iterable[WorkerState],
    outputs: tuple[Modality, ...],
) -> int:
    """How many requests for ``outputs`` admission would take now, one
    after the other (see the module's docstring)."""
    needed = graph.needed_stages(tuple(outputs))
    sources = set(graph.sources(needed))
    alive = [w for w in workers if w.alive]
    fewest: int | None = None
    for stage in needed:
        if orch.ready_replicas(stage) == 0:
            return 0
        free = sum(
            max(0, w.capacity - orch.load(stage, w.replica))
            for w in alive
            if w.stage == stage and orch.routable(stage, w.replica)
        )
        places = max(0, graph.cfg.stage(stage).max_queue - orch.queue_length(stage))
        if stage in sources:
            fewest = free + places if fewest is None else min(fewest, free + places)
        elif free == 0 and places == 0:
            return 0  # admission refuses while a later stage is full too
    return fewest or 0


def group_rejections(
    orch: Orchestrator,
    graph: PipelineGraph,
    workers: Iterable[WorkerState],
    members: Sequence[tuple[str, RequestSpec]],
) -> list[Rejected]:
    """The ``Rejected`` events of a group (request id, spec) admission
    cannot take whole now, one per member; empty when it fits."""
    n = len(members)
    outputs = tuple(members[0][1].outputs)
    fits = room(orch, graph, workers, outputs)
    if fits >= n:
        return []
    idle = [s for s in graph.needed_stages(outputs) if orch.ready_replicas(s) == 0]
    reason: RejectReason
    if idle:
        reason = "not_ready"
        message = (
            f"stage {idle[0]!r} has no ready replica; none of the {n} requests of this call "
            "was admitted"
        )
    else:
        reason = "overloaded"
        message = (
            f"the {n} requests of this call are admitted together or not at all, and the "
            f"pipeline has room for {fits} now; none was admitted (retry later, or split "
            "the batch)"
        )
    name = graph.cfg.name
    return [
        Rejected(request_id=rid, pipeline=name, spec=spec, reason=reason, message=message)
        for rid, spec in members
    ]
