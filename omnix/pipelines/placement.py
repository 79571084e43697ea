"""A stage's ``placement`` table (``omnix serve --placement ray``): its checks
and what one replica asks of a Ray node.

Owns ``placement_problems`` (what validation reports of a stage's table:
negative amounts, a custom resource named like one of Ray's own, a vLLM
replica whose GPUs do not match its tensor x pipeline parallelism) and
``replica_demand`` (the resources one replica reserves: ``CPU``, ``GPU``
and the custom ones, as Ray names them).  Does not own talking to Ray
(``omnix.stages.ray_cluster``) nor the ``devices`` of the default
placement (``devices.py``).
"""

from __future__ import annotations

from omnix.pipelines.config import Placement, StageConfig, VllmArgs
from omnix.pipelines.devices import replica_width

#: resources Ray names itself: a stage asks for them with num_cpus/num_gpus
_RAY_OWN = frozenset({"CPU", "GPU", "memory", "object_store_memory"})


def stage_placement(stage: StageConfig) -> Placement:
    """The stage's table, or the default one (one CPU, anywhere)."""
    return stage.placement if stage.placement is not None else Placement()


def replica_demand(stage: StageConfig) -> dict[str, float]:
    """What one replica of ``stage`` reserves on a node, by Ray's resource
    names (amounts of 0 left out)."""
    p = stage_placement(stage)
    demand = {"CPU": p.num_cpus, "GPU": p.num_gpus, **p.resources}
    return {k: v for k, v in demand.items() if v > 0}


def placement_problems(stage: StageConfig) -> list[str]:
    """What is wrong with ``stage``'s ``placement`` table (nothing when unset)."""
    p = stage.placement
    if p is None:
        return []
    where = f"stage {stage.name!r}: placement"
    problems = [
        f"{where}.{field} must be >= 0, got {getattr(p, field)}"
        for field in ("num_cpus", "num_gpus")
        if getattr(p, field) < 0
    ]
    for name, amount in p.resources.items():
        if name in _RAY_OWN or name.startswith("node:"):
            problems.append(
                f"{where}.resources names {name!r}, one of Ray's own resources: ask for CPUs "
                "and GPUs with num_cpus and num_gpus, and name custom resources otherwise"
            )
        elif not name:
            problems.append(f"{where}.resources has an empty name")
        if amount < 0:
            problems.append(f"{where}.resources.{name} must be >= 0, got {amount}")
    if p.num_gpus > 1 and p.num_gpus != int(p.num_gpus):
        problems.append(
            f"{where}.num_gpus = {p.num_gpus}: a replica takes a fraction of one GPU or whole "
            "GPUs, not a fraction of several"
        )
    width = replica_width(stage)
    if isinstance(stage.engine, VllmArgs) and width > 1 and p.num_gpus not in (0, width):
        problems.append(
            f"{where}.num_gpus = {p.num_gpus:g}, but one replica's tensor x pipeline "
            f"parallelism takes {width} GPUs: give num_gpus = {width}"
        )
    if p.max_restarts < -1:
        problems.append(
            f"{where}.max_restarts must be -1 (restart without end) or >= 0, got {p.max_restarts}"
        )
    return problems
