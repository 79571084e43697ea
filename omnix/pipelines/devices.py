"""Which accelerators a stage's replicas use (a stage's ``devices``).

Owns: reading ``devices = "0,1"`` (``parse_devices``), how wide one
replica is (``replica_width``: a vLLM stage's tensor x pipeline
parallelism, else 1), which devices each replica gets (``replica_devices``:
consecutive groups of that width, replica ``i`` on group ``i`` modulo the
number of groups, so replicas spread over the devices and share them only
when there are more replicas than groups), and the problems of a stage's
setting (``device_problems``, which validation reports).  Device numbers
are indices into the GPUs the server process sees (its own
``CUDA_VISIBLE_DEVICES``, when set); checking them against the machine and
setting a worker's environment is the runtime's (``omnix.stages.gpus``).
"""

from __future__ import annotations

import re

from omnix.pipelines.config import StageConfig, VllmArgs

_DEVICES = re.compile(r"^\s*[0-9]+\s*(,\s*[0-9]+\s*)*$")


def parse_devices(text: str) -> tuple[int, ...]:
    """``"0,1"`` -> ``(0, 1)``; ``""`` -> ``()`` (no placement).
    ``ValueError`` for anything but distinct whole numbers separated by commas."""
    if not text.strip():
        return ()
    if not _DEVICES.match(text):
        raise ValueError(
            f"devices {text!r} is not a list of GPU numbers: give them separated by commas, "
            'e.g. "0" or "0,1"'
        )
    found = tuple(int(part) for part in text.split(","))
    if len(set(found)) != len(found):
        raise ValueError(f"devices {text!r} names a GPU twice")
    return found


def replica_width(stage: StageConfig) -> int:
    """The devices one replica of ``stage`` takes: a vLLM stage's tensor
    parallel size times its pipeline parallel size, else 1."""
    engine = stage.engine
    if not isinstance(engine, VllmArgs):
        return 1
    from omnix.pipelines.vllm_args import setting

    width = 1
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        if key in engine.engine_args:
            value = setting(engine, key)
            width *= value if isinstance(value, int) and value > 0 else 1
    return width


def replica_devices(stage: StageConfig, replica: int) -> tuple[int, ...]:
    """The devices replica ``replica`` of ``stage`` uses (``()``: the
    stage places none)."""
    devices = parse_devices(stage.devices)
    if not devices:
        return ()
    width = replica_width(stage)
    groups = max(1, len(devices) // width)
    start = (replica % groups) * width
    return devices[start : start + width]


def device_problems(stage: StageConfig) -> list[str]:
    """What is wrong with ``stage``'s ``devices`` (nothing when unset)."""
    where = f"stage {stage.name!r}"
    try:
        devices = parse_devices(stage.devices)
    except ValueError as exc:
        return [f"{where}: {exc}"]
    if not devices:
        return []
    problems = []
    width = replica_width(stage)
    if len(devices) % width:
        problems.append(
            f"{where}: devices {stage.devices!r} cannot be split into replicas of {width} "
            f"(tensor_parallel_size x pipeline_parallel_size): give a multiple of {width} devices"
        )
    device = getattr(stage.engine, "device", "auto")
    m = re.fullmatch(r"cuda:([0-9]+)", device)
    if m and int(m.group(1)) >= width:
        problems.append(
            f"{where}: device = {device!r} with devices = {stage.devices!r}: a worker sees its "
            f'devices renumbered from 0 (CUDA_VISIBLE_DEVICES), so say device = "auto" or '
            '"cuda" and let devices place it'
        )
    return problems


def visible_gpus() -> list[str]:
    """The GPUs this process sees, each as the id a child's
    ``CUDA_VISIBLE_DEVICES`` takes: this process's own list when it has
    one (device 0 of a stage is its first entry), else ``0..N-1``.  Empty
    on a machine without a GPU (or without torch)."""
    import os

    try:
        import torch

        count = int(torch.cuda.device_count())
    except ImportError:
        count = 0
    own = os.environ.get("CUDA_VISIBLE_DEVICES")
    if own is not None:
        return [d.strip() for d in own.split(",") if d.strip()][:count]
    return [str(i) for i in range(count)]
