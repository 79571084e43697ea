"""CPU seconds by process role while a benchmark runs (``CpuMeter``).

Owns: the CPU time of this process and of one side's child processes,
sorted by role (``bench``, ``omnix worker``, vLLM's ``engine core`` and
``model``) and the machine's ``steal``: wall-clock figures on a shared
machine move with everyone else's load, CPU per token far less.  Used by
``omnix bench engines``; does not own what the roles' figures mean.
"""

from __future__ import annotations

from typing import Any


class CpuMeter:
    """CPU seconds of this process and of one side's child processes, by
    role: wall-clock figures on a shared 2-core machine move with everyone
    else's load, CPU per token far less.  Roles: ``bench`` (this process:
    the direct client, or omnix's orchestrator, log and client), ``omnix
    worker``, ``engine core`` and ``model`` (vLLM's processes), and
    ``steal``, the machine-wide time the hypervisor took meanwhile."""

    def __init__(self) -> None:
        import psutil

        self._me = psutil.Process()
        self._machine_times = psutil.cpu_times
        self.procs: list[Any] = []

    def children(self) -> set[int]:
        return {p.pid for p in self._me.children(recursive=True)}

    def adopt(self, before: set[int]) -> None:
        """This side's processes: the children that appeared since ``before``."""
        self.procs = [p for p in self._me.children(recursive=True) if p.pid not in before]

    @staticmethod
    def _role(p: Any) -> str:
        try:
            name, cmd = p.name(), " ".join(p.cmdline()[:3])
        except Exception:
            return "gone"
        if "EngineCore" in name:
            return "engine core"
        if "Worker" in name and "VLLM" in name:
            return "model"
        if "omnix.stages.worker_cli" in cmd:
            return "omnix worker"
        return "other"

    def sample(self) -> dict[str, float]:
        # Not a process: the time the hypervisor ran someone else on this
        # VM's CPUs (all of them).  A guest may count it in its processes'
        # CPU time, so a side whose engine core looks slower per token
        # while steal rose was slowed by the host, not by its own work.
        out: dict[str, float] = {"steal": getattr(self._machine_times(), "steal", 0.0)}
        for role, p in [("bench", self._me)] + [(self._role(p), p) for p in self.procs]:
            try:
                t = p.cpu_times()
            except Exception:
                continue
            out[role] = out.get(role, 0.0) + t.user + t.system
        return out
