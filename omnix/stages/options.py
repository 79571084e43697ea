"""How a ``StageRuntime`` runs its workers, in one typed value.

Owns ``RuntimeOptions``: every knob of the stage runtime beside its
pipeline, ``emit`` and blobs (where workers connect, which stages it
spawns, liveness bounds, start-up limits, the workers' environment and
CPUs, shutdown grace, profiling, Ray placement), with its default and
what it means, and the checks a value can fail on its own
(``ValueError``, ``RuntimeConfigError``), made once where it is built.

Built once by whoever configures a runtime (``omnix serve``'s flags,
``omnix generate``, the benchmarks, test support, tests) and handed to
``Omni(runtime_options=...)`` or ``StageRuntime(..., options)``.  A name
that is not an option is a ``TypeError`` where it is built (and a
mypy error before that).  Imports nothing heavy (no ZMQ, no torch), so
``Omni`` and the command lines name it without loading the runtime.

Does not own what the options do (``runtime.py`` and its parts) nor the
checks that need the pipeline (``spawn`` naming a stage it lacks, a
scaling stage left to hand-started workers, a device this machine lacks:
``StageRuntime`` makes those).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from omnix.stages.errors import RuntimeConfigError

__all__ = ["DEFAULT_SHUTDOWN_GRACE_S", "DEFAULT_START_ATTEMPTS", "RuntimeOptions"]

# A worker told to shut down gets this long to exit by itself before SIGTERM
# (then 2 s more before SIGKILL).  vLLM's own teardown takes 2-4 s on a small
# CPU machine: its engine core frees the KV cache and the model, then the
# process exits.  Cutting it short warns for nothing and kills an engine
# core mid-teardown (on ROCm that can leave memory resident).
DEFAULT_SHUTDOWN_GRACE_S = 10.0
DEFAULT_START_ATTEMPTS = 3  # failed starts in a row of one replica before start() gives up


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeOptions:
    """How one ``StageRuntime`` runs its pipeline's workers (docs/runtime.md)."""

    #: Where workers connect: ``tcp://HOST:PORT`` to take workers from other
    #: hosts; None: a private ``ipc://`` socket in a temporary folder (under
    #: Ray, ``tcp://`` on the address the cluster knows this host by).
    endpoint: str | None = None
    #: Seconds between a worker's heartbeats.
    heartbeat_interval_s: float = 0.5
    #: A ready worker silent this long is lost; at least twice
    #: ``heartbeat_interval_s``.
    lost_after_s: float = 2.0
    #: Seconds ``start()`` waits for the replicas it spawned to be ready.
    start_timeout_s: float = 120.0
    #: Start a lost spawned worker again.
    restart: bool = True
    #: The stages whose workers the runtime starts: all (True), none
    #: (False) or those named; the others wait for ``omnix worker --connect``.
    spawn: bool | Sequence[str] = True
    #: The shared secret every worker's HELLO must carry (required on a tcp
    #: endpoint that is not loopback-only); None or "": none.
    worker_token: str | None = None
    #: A spawned replica not READY this long after it started is killed
    #: (a failed start); None: ``start_timeout_s``.
    load_timeout_s: float | None = None
    #: Failed starts in a row of one replica before ``start()`` gives up.
    start_attempts: int = DEFAULT_START_ATTEMPTS
    #: Merged last into every spawned worker's environment
    #: (``{"OMP_NUM_THREADS": "4"}`` overrides omnix's 1).
    worker_env: Mapping[str, str] = field(default_factory=dict)
    #: The Python that runs spawned workers.
    python: str = sys.executable
    #: Spawned workers' stdout and stderr reach this process's stderr,
    #: each line prefixed with ``[stage/replica]``.
    forward_worker_output: bool = True
    #: Opt-in CPU pins: stage name or worker id ("stage/replica", which
    #: wins) -> a CPU list ("1", "2-3").
    worker_cpus: Mapping[str, str] = field(default_factory=dict)
    #: "spread": vLLM engine cores on CPU get CPUs of their own, the rest
    #: share the others (``placement.py``); "vllm": vLLM places itself.
    vllm_cpu_placement: Literal["spread", "vllm"] = "spread"
    #: Pin this process to the frontend CPUs of that placement when the
    #: runtime starts (``omnix serve`` does).
    pin_server: bool = False
    #: Seconds a worker told to shut down gets to exit before SIGTERM.
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S
    #: Where workers write profiler traces (DIR/<stage>/<replica>); None:
    #: profiling is off.
    profile_dir: str | os.PathLike[str] | None = None
    #: How spawned replicas run: "spawn", local processes; "ray", an actor
    #: each on a Ray cluster (docs/ray.md).
    placement: Literal["spawn", "ray"] = "spawn"
    #: With ``placement="ray"``: the cluster to join ("auto", "local" or
    #: HOST:PORT).
    ray_address: str = "auto"
    #: Fork spawned workers from a zygote that imported their engines'
    #: modules once (``zygote.py``: a start or restart without seconds of
    #: imports); False: each starts in a fresh Python.
    fork_workers: bool = True

    def __post_init__(self) -> None:
        if self.heartbeat_interval_s <= 0 or self.lost_after_s < 2 * self.heartbeat_interval_s:
            raise ValueError(
                f"lost_after_s={self.lost_after_s} must be at least twice heartbeat_interval_s="
                f"{self.heartbeat_interval_s}: a single late heartbeat must not declare a worker lost"
            )
        if self.start_attempts < 1:
            raise RuntimeConfigError(f"start_attempts={self.start_attempts} must be at least 1")
        if self.shutdown_grace_s < 0:
            raise ValueError(
                f"shutdown_grace_s={self.shutdown_grace_s} must be >= 0 (seconds a worker gets "
                "to exit)"
            )
        if self.placement not in ("spawn", "ray"):
            raise RuntimeConfigError(f"placement must be 'spawn' or 'ray', not {self.placement!r}")
