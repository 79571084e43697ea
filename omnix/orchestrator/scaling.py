"""Scaling decisions: when a stage that scales starts or drains a replica.

Owns: ``Scaler``, per stage with a replica range (``ReplicaRange``): the
replicas it holds (started and not draining, lowest first), those
draining (no new work; they leave once their requests are done), the run
of samples that found the queue up, and the log time of its last start or
drain; ``sample``, the decisions a sample leads to; ``plan``, the events
an admin's count becomes; ``applied``, the bookkeeping every ``Scaled``
event (a decision or an input) brings.  ``ScaleRefused`` says why a count
cannot be set.

The rules (docs/pipelines.md, "Scaling"), a function of the config and
the log prefix only:

* A *sample* of a scaling stage is taken at each ``Admitted`` and at each
  ``StageFinished``/``StageFailed`` of that stage, after the decisions
  the event led to.
* Up: a sample that finds at least ``up_queue`` requests waiting for the
  stage's credits extends the run; any other ends it.  After ``up_after``
  samples in a row, the lowest free replica starts, unless one started
  has not joined yet (its join takes the queue) or ``max`` is reached
  (a draining replica counts until it has left).
* Down: a sample that finds the queue empty, more than ``min`` replicas,
  the highest of them joined, the others' credits enough for every
  request the stage runs, and the stage's last start or drain at least
  ``down_after_s`` of log time before it, drains the highest replica.
* With nothing happening the log has no sample: the server asks
  ``idle`` with the clock's reading every so often, and appends the
  drains it returns as inputs stamped with that reading (as retention
  appends ``Released``), so the log still says when and why.
* An admission or a rejection with no request in flight (an idle point,
  where a trace's window starts) ends every run: what a decision depends
  on is then in the window or in the ``Scaled`` events before it, which
  a trace carries (``Fold.scaled``).

Does not own routing (``placement.py``; ``decide.py`` takes a draining
replica out of it), nor carrying a decision out (the runtime's ``scale``).
"""

from __future__ import annotations

import msgspec

from omnix.events.reducer import Fold, worker_id
from omnix.events.types import Event, Scaled, ScaleReason, WorkerLost
from omnix.orchestrator.placement import Placement
from omnix.pipelines.config import PipelineConfig, ReplicaRange

__all__ = ["ScaleRefused", "Scaler"]

_NS = 1_000_000_000


class StageReplicas(msgspec.Struct, kw_only=True):
    """A scaling stage's replicas (``POST /admin/stages/{name}/replicas``'s answer)."""

    stage: str
    #: replicas started and not draining (the count just set)
    replicas: int
    min: int
    max: int
    #: of them, those ready (a started one joins once its engine loaded)
    ready: int
    #: replicas that take no new request and leave once theirs are done
    draining: list[int]
    #: log positions of the ``Scaled`` events this call appended
    scaled: list[int]


class ScaleRefused(ValueError):
    """A replica count that cannot be set; ``status`` the HTTP status that
    says why and ``code`` its name: 404 ``unknown_stage``, 409
    ``fixed_replicas`` or ``replicas_draining``, 400 ``out_of_range``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class _Stage:
    __slots__ = ("cfg", "changed_ts", "draining", "members", "streak")

    def __init__(self, cfg: ReplicaRange) -> None:
        self.cfg = cfg
        self.members: list[int] = list(range(cfg.min))
        self.draining: list[int] = []
        self.streak = 0
        self.changed_ts = -1  # log time of the last start or drain (-1: none)


class Scaler:
    """The scaling stages' replica sets and the rules that change them."""

    def __init__(self, pipeline: PipelineConfig) -> None:
        self.stages: dict[str, _Stage] = {
            st.name: _Stage(st.scaling) for st in pipeline.stages if st.scaling is not None
        }

    def members(self, stage: str) -> tuple[int, ...]:
        """The replicas ``stage`` holds (started, not draining)."""
        s = self.stages.get(stage)
        return tuple(s.members) if s is not None else ()

    def draining(self, stage: str) -> tuple[int, ...]:
        s = self.stages.get(stage)
        return tuple(s.draining) if s is not None else ()

    def replicas(self, stage: str, ready: int, scaled: list[int]) -> StageReplicas:
        """What a scaling ``stage`` holds now (``ready`` of its replicas
        ready; ``scaled``: positions of the events just appended)."""
        cfg = self.stages[stage].cfg
        return StageReplicas(
            stage=stage,
            replicas=len(self.members(stage)),
            min=cfg.min,
            max=cfg.max,
            ready=ready,
            draining=list(self.draining(stage)),
            scaled=scaled,
        )

    # -- bookkeeping ----------------------------------------------------------
    def applied(self, ev: Scaled, state: Fold) -> None:
        """``ev`` is in the log (and folded): the sets follow it."""
        s = self.stages.get(ev.stage)
        if s is None:
            return
        rep = ev.replica
        if ev.op == "start":
            if rep not in s.members:
                s.members.append(rep)
                s.members.sort()
            s.changed_ts = ev.ts_ns
        elif ev.op == "drain":
            if rep in s.members:
                s.members.remove(rep)
            ws = state.workers.get(worker_id(ev.stage, rep))
            if ws is not None and ws.alive and rep not in s.draining:
                s.draining.append(rep)  # it leaves once its requests are done
            s.changed_ts = ev.ts_ns
        elif rep in s.draining:  # left
            s.draining.remove(rep)

    def lost(self, ev: WorkerLost) -> None:
        """A draining replica lost is gone (its requests move as any lost
        replica's do); a member lost stays one: the runtime restarts it."""
        s = self.stages.get(ev.stage)
        if s is not None and ev.replica in s.draining:
            s.draining.remove(ev.replica)

    def reset(self) -> None:
        """An idle point: every run of samples ends."""
        for s in self.stages.values():
            s.streak = 0

    # -- decisions ------------------------------------------------------------
    def sample(
        self, ev: Event, state: Fold, placement: Placement, stage: str | None = None
    ) -> list[Event]:
        """The scale decisions a sample at ``ev`` leads to (at most one per
        stage): of ``stage``, or of every scaling stage when None."""
        out: list[Event] = []
        for name, s in self.stages.items():
            if stage is not None and name != stage:
                continue
            decision = self._sample(name, s, ev, state, placement)
            if decision is not None:
                out.append(decision)
        return out

    def _sample(
        self, name: str, s: _Stage, ev: Event, state: Fold, placement: Placement
    ) -> Scaled | None:
        cfg = s.cfg
        queued = len(placement.queues[name])
        if queued >= cfg.up_queue:
            s.streak += 1
            if (
                s.streak >= cfg.up_after
                and len(s.members) + len(s.draining) < cfg.max
                and all(_alive(state, name, rep) for rep in s.members)
            ):
                s.streak = 0
                return self._start(name, s, ev.ts_ns, "queue", ev.pos)
            return None
        s.streak = 0
        if queued or not self._may_drain(name, s, ev.ts_ns, state, placement):
            return None
        return self._drain(name, s, s.members[-1], ev.ts_ns, "idle", ev.pos)

    def idle(self, state: Fold, placement: Placement, ts_ns: int) -> list[Scaled]:
        """The drains due at log time ``ts_ns`` with nothing happening: an
        idle server appends no sample, so the server asks this every
        ``down_after_s`` or so (as retention's sweep compares its time
        bound), and appends what it returns as inputs stamped ``ts_ns``:
        the rule of a sample's drain, read at that time."""
        return [
            self._drain(name, s, s.members[-1], ts_ns, "idle", -1)
            for name, s in self.stages.items()
            if not placement.queues[name] and self._may_drain(name, s, ts_ns, state, placement)
        ]

    @staticmethod
    def _may_drain(name: str, s: _Stage, ts_ns: int, state: Fold, placement: Placement) -> bool:
        """More than ``min`` replicas, the last start or drain at least
        ``down_after_s`` ago, the highest replica joined, and the others'
        credits enough for every request the stage runs (the caller checks
        that none waits).  A replica still starting is not drained for
        idleness: it would never join to leave (its drain would end
        nothing), and its start was the queue's, which it has not served."""
        cfg = s.cfg
        if len(s.members) <= cfg.min:
            return False
        if s.changed_ts >= 0 and ts_ns - s.changed_ts < cfg.down_after_s * _NS:
            return False
        last = s.members[-1]
        if not _alive(state, name, last):
            return False
        load = spare = 0
        for rep in s.members:
            wid = worker_id(name, rep)
            load += placement.load.get(wid, 0)
            ws = state.workers.get(wid)
            if rep != last and ws is not None and ws.alive:
                spare += ws.capacity
        return load <= spare

    def plan(self, stage: str, count: int, ts_ns: int = 0) -> list[Scaled]:
        """The inputs an admin's ``count`` for ``stage`` becomes: the
        lowest free replicas start, or the highest drain, one event each
        (none when it has ``count`` already).  Raises ``ScaleRefused``."""
        s = self.stages.get(stage)
        if s is None:
            raise ScaleRefused(
                409,
                "fixed_replicas",
                f"stage {stage!r} has a fixed replica count; it does not scale",
            )
        cfg = s.cfg
        if not cfg.min <= count <= cfg.max:
            raise ScaleRefused(
                400,
                "out_of_range",
                f"stage {stage!r} scales between {cfg.min} and {cfg.max} replicas, not {count}",
            )
        if count - len(s.members) > cfg.max - len(s.members) - len(s.draining):
            raise ScaleRefused(
                409,
                "replicas_draining",
                f"stage {stage!r} has {len(s.draining)} replica(s) still draining, which count "
                f"toward its max of {cfg.max} until they leave; try again when they have",
            )
        # A copy: the events are applied as the log takes them.
        shadow = _Stage(cfg)
        shadow.members, shadow.draining = list(s.members), list(s.draining)
        out: list[Scaled] = []
        while len(shadow.members) < count:
            out.append(self._start(stage, shadow, ts_ns, "admin", -1))
            shadow.members.append(out[-1].replica)
        while len(shadow.members) > count:
            out.append(self._drain(stage, shadow, shadow.members[-1], ts_ns, "admin", -1))
            shadow.members.pop()
        return out

    @staticmethod
    def _start(name: str, s: _Stage, ts_ns: int, reason: ScaleReason, cause: int) -> Scaled:
        taken = set(s.members) | set(s.draining)
        rep = next(r for r in range(s.cfg.max) if r not in taken)
        return Scaled(
            stage=name,
            replica=rep,
            op="start",
            replicas=len(s.members) + 1,
            reason=reason,
            cause=cause,
            ts_ns=ts_ns,
        )

    @staticmethod
    def _drain(
        name: str, s: _Stage, rep: int, ts_ns: int, reason: ScaleReason, cause: int
    ) -> Scaled:
        return Scaled(
            stage=name,
            replica=rep,
            op="drain",
            replicas=len(s.members) - 1,
            reason=reason,
            cause=cause,
            ts_ns=ts_ns,
        )

    def restart(self, state: Fold, ts_ns: int = 0) -> list[Scaled]:
        """A restarted server starts each stage's ``min`` replicas: the
        inputs that bring the log back to them (every replica the log
        held is recorded lost first, so these leave at once)."""
        out: list[Scaled] = []
        for name, s in self.stages.items():
            for i, rep in enumerate(reversed([r for r in s.members if r >= s.cfg.min])):
                out.append(
                    Scaled(
                        stage=name,
                        replica=rep,
                        op="drain",
                        replicas=len(s.members) - 1 - i,
                        reason="restart",
                        ts_ns=ts_ns,
                    )
                )
        return out


def _alive(state: Fold, stage: str, replica: int) -> bool:
    ws = state.workers.get(worker_id(stage, replica))
    return ws is not None and ws.alive
