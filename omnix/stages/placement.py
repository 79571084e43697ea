"""Where vLLM stages run on a CPU machine: engine cores on CPUs of their own,
the Python around them on the rest.

Owns: ``cpu_plan`` (the runtime's default placement), ``runtime_plan``
(which plan the runtime's options ask for), ``engine_affinity`` (how a
worker hands its engine core its CPUs) and ``pin_process`` (how the server
joins the frontend CPUs).  Does not own spawning (``spawner.py``) nor a
worker's own pin (``worker_cli.py``).

Why.  On CPU, a vLLM stage (``cpu_executor = "uni"``, the default) is two
processes: the omnix worker (vLLM's ``AsyncLLM`` client: prompts,
detokenizing, our transport) and vLLM's engine core, which runs the model
and is the critical path of every token.  The server (orchestrator, log,
HTTP) is one more.  Measured on 2 cores (``omnix bench engines``): when the
frontends roam, they land on the core the engine core computes on, and a
wakeup there delays the next step; with the engine core alone on one core
and everything else on the other, omnix and vLLM driven directly (placed
the same way) run at the same tokens/s.

The plan, for ``n`` CPUs and ``k`` vLLM workers (``uni`` executor, not
pinned by the operator), with ``n >= 2`` and ``k >= 1``:

* the frontend CPUs are the first ``max(1, n // (k + 1))``: those vLLM
  workers are pinned there whole, and the server too when it asks
  (``RuntimeOptions(pin_server=True)``; ``omnix serve`` does);
* the other CPUs are split among the ``k`` engine cores, contiguous and as
  even as possible (one CPU each, round robin, when there are more engine
  cores than CPUs).  A worker starts its ``AsyncLLM`` from a thread whose
  affinity is its share (``OMNIX_ENGINE_CPUS``): the engine-core process
  and its threads inherit it; the worker's own threads do not.

Left alone: other stages (codec, diffusers, scripted), vLLM stages on the
``mp`` executor (vLLM binds its model process itself), workers the
operator pinned (``worker_cpus``), and every worker when
``VLLM_CPU_OMP_THREADS_BIND`` is set (the operator placed vLLM).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec

from omnix.pipelines.config import PipelineConfig, VllmArgs
from omnix.stages.worker_cli import parse_cpus

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
ENGINE_CPUS_ENV = "OMNIX_ENGINE_CPUS"


class CpuPlan(msgspec.Struct, frozen=True):
    """``frontend``: CPUs of the server and the placed vLLM workers
    (``"0"``); ``engines``: worker id -> its engine core's CPUs."""

    frontend: str
    engines: dict[str, str]


def _fmt(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


def cpu_plan(
    pipeline: PipelineConfig, cpus: list[int], pinned: set[str] | frozenset[str] = frozenset()
) -> CpuPlan | None:
    """The placement of ``pipeline``'s vLLM workers over ``cpus`` (ascending),
    or None when there is nothing to place.  ``pinned``: stage names and
    worker ids the operator pinned (``worker_cpus``): they take no share."""
    workers = [
        f"{st.name}/{r}"
        for st in pipeline.stages
        if isinstance(st.engine, VllmArgs)
        and st.engine.cpu_executor == "uni"
        and st.name not in pinned
        for r in range(st.max_replicas)
        if f"{st.name}/{r}" not in pinned
    ]
    k, n = len(workers), len(cpus)
    if k == 0 or n < 2:
        return None
    f = max(1, n // (k + 1))
    rest = cpus[f:]
    m = len(rest)
    engines = {
        wid: _fmt(rest[i * m // k : (i + 1) * m // k] if m >= k else [rest[i % m]])
        for i, wid in enumerate(workers)
    }
    return CpuPlan(_fmt(cpus[:f]), engines)


def runtime_plan(
    pipeline: PipelineConfig, mode: str, worker_env: dict[str, str], worker_cpus: dict[str, str]
) -> CpuPlan | None:
    """The stage runtime's placement by its ``vllm_cpu_placement``: vLLM
    engine cores on CPUs of their own, their workers (and, with
    ``pin_server``, the server) on the rest (``"spread"``), or none
    (``"vllm"``: vLLM's and the OS's own choice).  ``worker_cpus`` (the
    operator's pins) take no share; a ``VLLM_CPU_OMP_THREADS_BIND`` in the
    environment or ``worker_env`` means no placement."""
    if mode not in ("spread", "vllm"):
        raise ValueError(f"vllm_cpu_placement must be 'spread' or 'vllm', not {mode!r}")
    if mode == "spread" and BIND_ENV not in {**os.environ, **worker_env}:
        return cpu_plan(pipeline, available_cpus(), set(worker_cpus))
    return None


@contextmanager
def engine_affinity(cpus: str | None) -> Iterator[None]:
    """Run the block with the calling thread on ``cpus`` (``"1"``, ``"2-3"``):
    processes it starts inherit them.  After the block, the calling thread
    and every thread this process started meanwhile get the calling
    thread's CPUs back: ``AsyncLLM`` starts its client-side threads (ZMQ's
    I/O thread among them) while it spawns the engine core, and those must
    stay with the frontend, not wake on the engine core's CPU for every
    message.  ``None``/``""``: no change."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)  # this thread's (Linux: pid 0 is the caller)
    threads = _threads()
    os.sched_setaffinity(0, parse_cpus(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
        _pin_threads(_threads() - threads, before)


def _threads() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def _pin_threads(tids: set[int], cpus: set[int]) -> None:
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, FileNotFoundError):
            pass  # the thread ended meanwhile


_original_cpus: list[int] | None = None


def available_cpus() -> list[int]:
    """The CPUs this process may use, as they were before ``pin_process``
    narrowed them: a plan is made over the whole machine even when the
    process making it was pinned to its frontend share already."""
    return list(_original_cpus) if _original_cpus is not None else sorted(os.sched_getaffinity(0))


def pin_process(cpus: str) -> None:
    """Pin every thread of this process to ``cpus`` (threads started later
    inherit the calling thread's pin)."""
    global _original_cpus
    if _original_cpus is None:
        _original_cpus = sorted(os.sched_getaffinity(0))
    _pin_threads(_threads(), parse_cpus(cpus))
