"""The stage runtime's record of its replicas: one slot per replica.

Owns: ``ReplicaProcess`` (what a slot knows of its worker's process,
whoever started it: ``procs.WorkerProcess`` or a Ray actor's run), ``Slot`` (one replica as the runtime knows it: its state in the
handshake, its worker's connection identity and token, its credits, the
requests it runs and those waiting for a credit, its process, its start-up
failures), ``Run`` (one request on one replica) and ``SlotTable`` (every
slot by stage and replica, and the welcomed ones by connection identity and
by token).

Plain records and lookups (and ``not_ready_message``, what start-up says of
the replicas that did not come up): no sockets, no processes, no events.  What
changes a slot is the runtime's (``runtime.py``) and its helpers'
(``handshake.py``, ``liveness.py``, ``credits.py``, ``spawner.py``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Literal, Protocol

from omnix.pipelines.config import PipelineConfig, StageConfig
from omnix.transport import messages as m
from omnix.transport.work import WorkItem

SlotState = Literal["down", "starting", "joining", "ready"]
# down: no worker; starting: spawned, no HELLO yet; joining: welcomed,
# loading its engine (heartbeats flow); ready: READY received, takes work.


class ReplicaProcess(Protocol):
    """One incarnation of a replica's worker, as the runtime sees it."""

    label: str
    #: the worker's pid where known (0 until its HELLO says, under Ray)
    pid: int
    #: its last lines of output (what start-up errors quote)
    tail: deque[str]

    @property
    def returncode(self) -> int | None:
        """None while it runs; how it ended afterwards."""

    def poll(self) -> int | None:
        """Notice an exit now if the launcher cannot watch it by itself."""

    def kill(self) -> None:
        """End it now (a silent or disowned worker must never come back)."""

    def describe_exit(self) -> str: ...

    def last_output(self, n: int = 12) -> str: ...


class Run:
    """One request on one replica, from its seq 0 until Done/Error or loss."""

    __slots__ = ("aborted", "next_seq", "released")

    def __init__(self) -> None:
        self.next_seq = 1
        self.aborted = False
        self.released = False


class Slot:
    __slots__ = (
        "active",
        "capacity",
        "config",
        "deferred",
        "draining",
        "engine",
        "expected_token",
        "failures",
        "identity",
        "joined_at",
        "last_failure",
        "last_seen",
        "outbox",
        "pid",
        "proc",
        "ready",
        "replica",
        "restart_handle",
        "stage",
        "started_at",
        "state",
        "token",
        "wanted",
        "welcomed_at",
        "worker_id",
    )

    def __init__(self, config: StageConfig, replica: int) -> None:
        self.config = config
        self.stage = config.name
        self.replica = replica
        self.worker_id = f"{config.name}/{replica}"
        self.state: SlotState = "down"
        self.proc: ReplicaProcess | None = None
        self.expected_token: str | None = None  # the token of the process we spawned
        self.token: str | None = None  # the welcomed incarnation's token
        self.identity: bytes | None = None
        self.pid = 0
        self.capacity = 0
        self.engine = ""
        #: what the worker's READY said of its engine (None until ready)
        self.ready: m.Ready | None = None
        self.active: dict[str, Run] = {}
        # Requests waiting for one of this replica's credits, oldest first:
        # a released request keeps its credit until the worker acknowledges
        # the abort, so the orchestrator (which freed it at the terminal
        # event) may route one request early.  It waits here, never on the
        # worker.
        self.deferred: dict[str, list[WorkItem]] = {}
        # Work sent during this loop turn, not yet on the wire: it leaves as
        # one WORK message at the end of the turn (see Wire.queue).
        self.outbox: list[WorkItem] = []
        self.last_seen = 0.0
        self.started_at = 0.0
        self.joined_at = 0.0
        self.welcomed_at = 0.0
        self.failures = 0  # failed starts in a row (died or gave up before READY)
        self.last_failure = ""  # how the last failed start ended, for start-up errors
        self.restart_handle: asyncio.TimerHandle | None = None
        # Scaling (``StageRuntime.scale``): whether the replica should run
        # (a stage starts its ``min``; a Scaled start or drain changes it),
        # and whether it drains (takes nothing new, stops once idle).
        self.wanted = replica < config.min_replicas
        self.draining = False

    def where(self) -> str:
        return f"stage {self.stage!r} replica {self.replica}"


class SlotTable:
    """Every replica's slot of one pipeline, and the welcomed ones by the
    connection identity and the token their worker uses."""

    def __init__(self, pipeline: PipelineConfig) -> None:
        self.pipeline = pipeline.name
        self.by_stage: dict[str, list[Slot]] = {
            st.name: [Slot(st, r) for r in range(st.max_replicas)] for st in pipeline.stages
        }
        self.by_identity: dict[bytes, Slot] = {}
        self.by_token: dict[str, Slot] = {}

    def stage(self, stage: str) -> list[Slot]:
        try:
            return self.by_stage[stage]
        except KeyError:
            raise KeyError(
                f"pipeline {self.pipeline!r} has no stage {stage!r} "
                f"(stages: {', '.join(self.by_stage)})"
            ) from None

    def get(self, stage: str, replica: int) -> Slot:
        slots = self.stage(stage)
        if not 0 <= replica < len(slots):
            raise KeyError(f"stage {stage!r} has replicas 0..{len(slots) - 1}, not {replica}")
        return slots[replica]

    def all(self) -> list[Slot]:
        return [s for slots in self.by_stage.values() for s in slots]

    def bind(self, slot: Slot, identity: bytes, token: str) -> None:
        """``slot``'s worker is welcomed: find it by ``identity`` and ``token``."""
        slot.token = token
        slot.identity = identity
        self.by_identity[identity] = slot
        self.by_token[token] = slot

    def rebind(self, slot: Slot, identity: bytes) -> None:
        """The same worker on a new connection (a repeated HELLO)."""
        if slot.identity is not None:
            self.by_identity.pop(slot.identity, None)
        slot.identity = identity
        self.by_identity[identity] = slot

    def unbind(self, slot: Slot) -> None:
        """Forget ``slot``'s worker: nothing it sends is taken any more."""
        if slot.identity is not None:
            self.by_identity.pop(slot.identity, None)
        if slot.token is not None:
            self.by_token.pop(slot.token, None)
        slot.identity = None
        slot.token = None

    def unbind_all(self) -> None:
        self.by_identity.clear()
        self.by_token.clear()


def not_ready_message(
    missing: list[Slot], timeout: float, spawned_stages: frozenset[str], endpoint: str
) -> str:
    """Why start-up gave up: what each replica not ready was waiting for."""
    lines = []
    for s in missing:
        if s.state == "down" and s.stage not in spawned_stages:
            lines.append(
                f"{s.where()}: no worker joined within {timeout:.0f} s; start one with "
                f"`omnix worker --connect {endpoint} --stage {s.stage}`"
            )
        elif s.state == "starting":
            lines.append(
                f"{s.where()}: the worker (pid {s.pid}) never said hello within {timeout:.0f} s"
            )
        elif s.state == "joining":
            lines.append(
                f"{s.where()}: the worker (pid {s.pid}) was still loading its engine after "
                f"{timeout:.0f} s; raise start_timeout_s if its model loads slowly"
            )
        elif s.state == "down" and s.failures:
            lines.append(
                f"{s.where()}: {s.failures} failed starts in a row; the last: {s.last_failure}"
            )
            continue
        else:
            lines.append(f"{s.where()}: not ready ({s.state})")
        if s.proc is not None and s.proc.tail:
            lines.append("  its last output:\n" + s.proc.last_output())
    return "stage workers not ready:\n" + "\n".join(lines)
