"""Where stages run: each stage's ready replicas, their load, and who waits.

Owns: ``Placement``: per stage the ready replicas (in index order), per
replica the slots its placed stages hold (its load), per stage the
requests waiting for a replica (oldest first), and ``pick``, the replica a
stage goes to: the least loaded with a free credit, ties to the lowest
index.  All derived from the events the orchestrator was shown.

Does not own a replica's capacity or liveness (the fold's ``WorkerState``),
when a stage is placed or a waiting request served (``routing.py``), nor
what a request needs (``plans.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from omnix.events.reducer import Fold, worker_id
from omnix.events.types import WorkerJoined, WorkerLost

__all__ = ["Placement"]


class Placement:
    """Replicas, load and queues of a pipeline's stages."""

    def __init__(self, stages: Iterable[str]) -> None:
        names = tuple(stages)
        self.replicas: dict[str, list[int]] = {n: [] for n in names}
        self.load: dict[str, int] = {}  # worker id -> slots held
        #: per stage, the requests waiting for a replica (a dict as an ordered set)
        self.queues: dict[str, dict[str, None]] = {n: {} for n in names}

    def joined(self, ev: WorkerJoined) -> None:
        reps = self.replicas[ev.stage]
        if ev.replica not in reps:
            reps.append(ev.replica)
            reps.sort()
        self.load[ev.worker_id] = 0

    def lost(self, ev: WorkerLost) -> None:
        reps = self.replicas[ev.stage]
        if ev.replica in reps:
            reps.remove(ev.replica)
        self.load.pop(ev.worker_id, None)

    def drain(self, stage: str, replica: int) -> None:
        """``replica`` takes no new request (it keeps its load until its
        requests end)."""
        reps = self.replicas[stage]
        if replica in reps:
            reps.remove(replica)

    def left(self, stage: str, replica: int) -> None:
        """A drained replica is gone (nothing ran on it any more)."""
        self.drain(stage, replica)
        self.load.pop(worker_id(stage, replica), None)

    def pick(self, state: Fold, stage: str) -> int:
        """The ready replica of ``stage`` with the least outstanding work and
        a free credit (ties: lowest index); -1 when none."""
        best, best_load = -1, 0
        for rep in self.replicas[stage]:
            wid = worker_id(stage, rep)
            ws = state.workers.get(wid)
            if ws is None or not ws.alive:
                continue
            load = self.load.get(wid, 0)
            if load < ws.capacity and (best < 0 or load < best_load):
                best, best_load = rep, load
        return best

    def take_slot(self, stage: str, replica: int) -> None:
        wid = worker_id(stage, replica)
        self.load[wid] = self.load.get(wid, 0) + 1

    def free_slot(self, stage: str, replica: int) -> None:
        wid = worker_id(stage, replica)
        if wid in self.load and self.load[wid] > 0:
            self.load[wid] -= 1
