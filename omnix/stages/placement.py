"""Where vLLM stages run on a CPU machine.

Owns: ``vllm_placement``, the runtime's default placement of a pipeline's
vLLM workers on CPU when it has two or more: each gets its own share of the
server's CPUs.  The first vLLM worker in pipeline order (the entry stage:
the thinker) gets its model threads bound to its share
(``VLLM_CPU_OMP_THREADS_BIND``); every later one pins its whole process to
its share (``OMNIX_WORKER_CPUS``, as ``worker_cpus`` does), so its vLLM
engine core and model processes, which inherit the pin, run there too.
Does not own spawning or pinning itself (``runtime.py``,
``worker_cli.py``).

Why: vLLM-cpu binds a model process's OpenMP threads to cores it picks
from the CPUs the process may use, always starting from the first ones
(with 2 cores: core 0, the other kept for its scheduler).  Every vLLM
stage picks the same cores, so in a pipeline whose stages run at the same
time (async chunk: the talker speaks the thinker's first sentence while
the thinker still writes) all models share core 0 while the others idle.
A vLLM engine also spins while it waits (its engine core for the model's
step, the model for the next step, with ``sched_yield``, up to 1 s after
the last step), so a stage whose processes roam steals the core another
stage's model computes on.

Why the first one is not pinned whole: its engine core and worker may then
use every core, which keeps text-only requests (and the thinker of every
request) as fast as without placement.  Pinning it too was measured: time
to first audio about the same, but the thinker's first token ~1.8x later.

A pipeline with a single vLLM worker keeps vLLM's own choice (it may use
every core; there is nothing to share), and so does a worker the operator
placed: pinned with ``worker_cpus``, or any worker when the environment
sets ``VLLM_CPU_OMP_THREADS_BIND``.  On a GPU machine the thread binding is
inert and a pin only confines a stage's CPU-side processes.
"""

from __future__ import annotations

import msgspec

from omnix.pipelines.config import PipelineConfig, VllmArgs

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


class VllmPlace(msgspec.Struct, frozen=True):
    """One vLLM worker's share: ``cpus`` (``"0,1"``) and whether the whole
    worker is pinned there (else only its model threads are bound)."""

    cpus: str
    pin: bool


def vllm_placement(
    pipeline: PipelineConfig, cpus: list[int], pinned: set[str] | frozenset[str] = frozenset()
) -> dict[str, VllmPlace]:
    """worker id -> its place; the first worker's ``pin`` is False.

    ``cpus``: the CPUs the server may use, ascending.  ``pinned``: stage
    names and worker ids the operator pinned (``worker_cpus``); they get no
    value and take no share.  The remaining vLLM workers, in pipeline order
    (stage, then replica), split ``cpus`` into contiguous shares as even as
    possible; with more workers than CPUs they take one CPU each, round
    robin.  Empty when fewer than two vLLM workers remain.
    """
    workers = [
        f"{st.name}/{r}"
        for st in pipeline.stages
        if isinstance(st.engine, VllmArgs) and st.name not in pinned
        for r in range(st.replicas)
        if f"{st.name}/{r}" not in pinned
    ]
    k, n = len(workers), len(cpus)
    if k < 2 or n < 2:
        return {}
    out: dict[str, VllmPlace] = {}
    for i, wid in enumerate(workers):
        if n >= k:
            share = cpus[i * n // k : (i + 1) * n // k]
        else:
            share = [cpus[i % n]]
        out[wid] = VllmPlace(",".join(str(c) for c in share), pin=i > 0)
    return out
