"""Which GPUs each spawned worker sees: the stages' ``devices`` on this machine.

Owns ``gpu_plan``: for every replica of a spawned stage that places
itself (``devices``), the ``CUDA_VISIBLE_DEVICES`` its worker gets (its
devices mapped through the GPUs this server sees), checked against those
GPUs: a device the machine does not have is a ``RuntimeConfigError``
naming the stage, before any worker starts.  On a machine without a GPU
the setting is ignored, and said so once per stage in the log.  A
hand-started worker (``omnix worker``) is placed by its own host's
environment.  Which devices a replica uses is ``omnix.pipelines.devices``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from omnix.pipelines.config import PipelineConfig
from omnix.pipelines.devices import parse_devices, replica_devices, visible_gpus
from omnix.stages.errors import RuntimeConfigError

log = logging.getLogger("omnix.runtime")


def gpu_plan(
    pipeline: PipelineConfig, spawned: Collection[str], gpus: list[str] | None = None
) -> dict[str, str]:
    """Worker id (``stage/replica``) -> ``CUDA_VISIBLE_DEVICES`` for the
    spawned replicas of stages with ``devices``; ``gpus`` is what this
    process sees (``visible_gpus()`` when not given)."""
    placed = [st for st in pipeline.stages if st.devices.strip() and st.name in spawned]
    if not placed:
        return {}
    seen = visible_gpus() if gpus is None else gpus
    if not seen:
        for st in placed:
            log.info("stage %r: devices %r ignored: this machine has no GPU", st.name, st.devices)
        return {}
    plan: dict[str, str] = {}
    for st in placed:
        missing = [d for d in parse_devices(st.devices) if d >= len(seen)]
        if missing:
            renamed = seen != [str(i) for i in range(len(seen))]
            through = f" through CUDA_VISIBLE_DEVICES={','.join(seen)}" if renamed else ""
            raise RuntimeConfigError(
                f"stage {st.name!r}: devices {st.devices!r} names GPU "
                f"{', '.join(map(str, missing))}, but this server sees {len(seen)} "
                f"(0..{len(seen) - 1}{through}): give devices it has"
            )
        for replica in range(st.max_replicas):
            ids = [seen[d] for d in replica_devices(st, replica)]
            plan[f"{st.name}/{replica}"] = ",".join(ids)
    return plan
