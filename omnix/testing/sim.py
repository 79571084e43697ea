"""A deterministic, in-process stage runtime on virtual time, for tests.

Owns: ``SimRuntime``, which implements the ``Runtime`` protocol
(``omnix.orchestrator.runtime``) by simulating each
stage's scripted engine (``ScriptedArgs``) as a discrete-event schedule on a
``ManualClock``: outputs are emitted at virtual times, in (time, order of
scheduling) order, so the same scenario always yields the same log, byte
for byte.  This is what the orchestrator's determinism and cancel-at-every-
position tests stand on; real processes are tested with ``StageRuntime``.

Never a product default: ``omnix serve`` always runs real workers.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from omnix.events.blobs import BlobStore
from omnix.events.clock import ManualClock
from omnix.events.types import (
    Chunk,
    Event,
    Scaled,
    StageFailed,
    StageFinished,
    StageStarted,
    WorkerJoined,
    WorkerLost,
)
from omnix.orchestrator.timers import DeadlineTimer
from omnix.pipelines.config import PipelineConfig, ScriptedArgs
from omnix.transport.work import InputPiece, WorkItem

if TYPE_CHECKING:
    from omnix.api import Omni
    from omnix.orchestrator.runtime import Runtime

MS = 1_000_000


@dataclass
class _Exec:
    request_id: str
    stage: str
    replica: int
    args: ScriptedArgs
    pieces: list[InputPiece] = field(default_factory=list)
    closed: bool = False
    busy: bool = False
    produced: int = 0
    done: bool = False
    # A continuation's input pieces whose outputs were all delivered before
    # the move: dropped as they arrive (the rest start at ``produced``).
    skip_pieces: int = 0


class SimRuntime:
    def __init__(
        self,
        pipeline: PipelineConfig,
        emit: Callable[[Event], None],
        blobs: BlobStore,
        clock: ManualClock,
        *,
        abort_delay_ms: float = 1.0,
        start_delay_ms: float = 50.0,
    ) -> None:
        self.pipeline = pipeline
        self.emit = emit
        self.blobs = blobs
        self.clock = clock
        self.abort_delay_ns = int(abort_delay_ms * MS)
        self.start_delay_ns = int(start_delay_ms * MS)
        self.scaled: list[Scaled] = []  # the scale events carried out, in order
        self._draining: set[tuple[str, int]] = set()
        self._queue: list[tuple[int, int, Callable[[], None]]] = []
        self._order = 0
        self._execs: dict[tuple[str, str], _Exec] = {}
        self.sent: list[WorkItem] = []
        self.aborts: list[tuple[str, str, int]] = []
        self.released: list[str] = []
        self.dead: set[str] = set()
        # The deadline timer this simulation fires in virtual time, if any
        # (``start_sim`` gives it the ``Omni``'s).
        self.timer: DeadlineTimer | None = None

    # -- the Runtime protocol ---------------------------------------------------
    async def start(self) -> None:
        for st in self.pipeline.stages:
            for rep in range(st.min_replicas):
                self._join(st.name, rep)

    def _join(self, stage: str, replica: int) -> None:
        args = self.pipeline.stage(stage).engine
        cap = args.capacity if isinstance(args, ScriptedArgs) else 8
        self.dead.discard(f"{stage}/{replica}")
        self.emit(
            WorkerJoined(
                worker_id=f"{stage}/{replica}",
                stage=stage,
                replica=replica,
                engine="scripted",
                capacity=cap,
            )
        )

    def scale(self, ev: Scaled) -> None:
        """A started replica joins ``start_delay_ms`` later; a drained one
        leaves once no execution runs on it (checked as each one ends)."""
        self.scaled.append(ev)
        if ev.op == "start":
            self._at(self.start_delay_ns, partial(self._join, ev.stage, ev.replica))
        elif ev.op == "drain":
            self._draining.add((ev.stage, ev.replica))
            self._at(0, self._leave_drained)

    def _leave_drained(self) -> None:
        busy = {(ex.stage, ex.replica) for ex in self._execs.values() if not ex.done}
        for stage, rep in sorted(self._draining - busy):
            self._draining.discard((stage, rep))
            wid = f"{stage}/{rep}"
            if wid in self.dead:
                continue  # lost meanwhile: its WorkerLost said so
            self.dead.add(wid)
            self.emit(Scaled(stage=stage, replica=rep, op="left", replicas=-1, reason="drained"))

    async def shutdown(self) -> None:
        self._queue.clear()

    def send(self, work: WorkItem) -> None:
        self.sent.append(work)
        key = (work.request_id, work.stage)
        ex = self._execs.get(key)
        if f"{work.stage}/{work.replica}" in self.dead:
            return  # sent before its WorkerLost was folded: that loss moves it
        if work.seq == 0:
            if ex is not None:
                ex.done = True  # a continuation replaces the execution it moves
            args = self.pipeline.stage(work.stage).engine
            assert isinstance(args, ScriptedArgs), "SimRuntime runs scripted stages only"
            ex = _Exec(work.request_id, work.stage, work.replica, args)
            if work.resume is not None:
                # A migrated execution: outputs continue at index chunks, as
                # the scripted engine skips what was already delivered.
                ex.produced = work.resume.chunks
                ex.skip_pieces = work.resume.chunks // args.chunks_per_piece
            self._execs[key] = ex
            self._at(0, partial(self._started, ex))
        if ex is None or ex.done:
            return  # late work for an aborted execution is dropped
        for piece in work.pieces or ([InputPiece()] if work.seq == 0 else []):
            if ex.skip_pieces:
                ex.skip_pieces -= 1
            else:
                ex.pieces.append(piece)
        ex.closed = work.last
        if not ex.busy:
            ex.busy = True
            self._at(self._delay(ex), partial(self._step, ex))

    def abort(self, request_id: str, stage: str, replica: int) -> None:
        self.aborts.append((request_id, stage, replica))
        ex = self._execs.get((request_id, stage))
        if ex is None or ex.done:
            return

        def ack(ex: _Exec = ex) -> None:
            if ex.done:
                return
            ex.done = True
            self.emit(
                StageFinished(
                    request_id=ex.request_id,
                    stage=ex.stage,
                    replica=ex.replica,
                    chunks=ex.produced,
                    finish_reason="aborted",
                )
            )

        self._at(self.abort_delay_ns, ack)

    def release(self, request_id: str) -> None:
        self.released.append(request_id)
        for key in [k for k in self._execs if k[0] == request_id]:
            self._execs[key].done = True
            del self._execs[key]

    # -- faults -------------------------------------------------------------------
    def kill(self, stage: str, replica: int, reason: str = "killed") -> None:
        """The replica dies now: its executions stop; WorkerLost follows."""
        wid = f"{stage}/{replica}"
        self.dead.add(wid)
        for ex in self._execs.values():
            if ex.stage == stage and ex.replica == replica:
                ex.done = True
        self.emit(WorkerLost(worker_id=wid, stage=stage, replica=replica, reason=reason))

    # -- simulation ---------------------------------------------------------------
    def _delay(self, ex: _Exec) -> int:
        return max(1, int(ex.args.delay_ms * MS))

    def _at(self, delay_ns: int, fn: Callable[[], None]) -> None:
        self._order += 1
        heapq.heappush(self._queue, (self.clock.now_ns() + delay_ns, self._order, fn))

    def _started(self, ex: _Exec) -> None:
        if not ex.done:
            self.emit(StageStarted(request_id=ex.request_id, stage=ex.stage, replica=ex.replica))

    def _step(self, ex: _Exec) -> None:
        if ex.done:
            return
        a = ex.args
        if not ex.pieces:
            ex.busy = False
            if ex.closed:
                ex.done = True
                self.emit(
                    StageFinished(
                        request_id=ex.request_id,
                        stage=ex.stage,
                        replica=ex.replica,
                        chunks=ex.produced,
                        output_tokens=ex.produced,
                    )
                )
            return
        n = ex.produced
        if n == a.hang_at:
            return  # silence: only a timeout ends this
        if n == a.crash_at:
            self.kill(ex.stage, ex.replica, "crashed")
            return
        if n == a.fail_at:
            ex.done = True
            self.emit(
                StageFailed(
                    request_id=ex.request_id,
                    stage=ex.stage,
                    replica=ex.replica,
                    message=f"scripted failure at output {n}",
                )
            )
            return
        piece = ex.pieces[0]
        k = n % a.chunks_per_piece
        self.emit(self._chunk(ex, n, piece))
        ex.produced += 1
        if k == a.chunks_per_piece - 1:
            ex.pieces.pop(0)
        self._at(self._delay(ex), partial(self._step, ex))

    def _chunk(self, ex: _Exec, n: int, piece: InputPiece) -> Chunk:
        a = ex.args
        rid, stage, replica = ex.request_id, ex.stage, ex.replica
        if a.output_modality == "audio":
            ref = self.blobs.put_array(np.full(320, n, dtype=np.float32))
            return Chunk(
                request_id=rid, stage=stage, replica=replica, index=n, modality="audio", blob=ref
            )
        if a.output_modality == "codec":
            return Chunk(
                request_id=rid,
                stage=stage,
                replica=replica,
                index=n,
                modality="codec",
                token_ids=(n % 64, (n * 7) % 64),
            )
        text = (piece.text or "") if a.echo else (f"t{n}." if n % 3 == 2 else f"t{n} ")
        return Chunk(
            request_id=rid,
            stage=stage,
            replica=replica,
            index=n,
            modality=a.output_modality,
            text=text,
            token_ids=(n,),
        )

    def _next(self) -> tuple[int, Callable[[], None]] | None:
        """The next action in virtual time: a scheduled output or a due timer."""
        timer = self.timer
        due = timer.next_due() if timer is not None else None
        if self._queue and (due is None or self._queue[0][0] < due):
            t, _, fn = heapq.heappop(self._queue)
            return t, fn
        if timer is not None and due is not None:
            return due, timer.fire_due
        return None

    def step(self) -> bool:
        """Run exactly one action (advancing the clock to it); False when idle."""
        nxt = self._next()
        if nxt is None:
            return False
        t, fn = nxt
        self.clock.set(max(t, self.clock.now_ns()))
        fn()
        if self._draining:
            self._leave_drained()
        return True

    def run_until_idle(self, max_steps: int = 1_000_000) -> int:
        """Run in virtual time until nothing is scheduled and no timer is due."""
        count = 0
        while count < max_steps and self.step():
            count += 1
        return count

    @property
    def idle(self) -> bool:
        return not self._queue and (self.timer is None or self.timer.next_due() is None)


async def start_sim(
    pipeline: PipelineConfig, *, abort_delay_ms: float = 1.0
) -> tuple[Omni, SimRuntime]:
    """An ``Omni`` on a memory log and a ``SimRuntime``, started, with the
    deadline timer driven in virtual time by the simulation."""
    from omnix.api import Omni
    from omnix.events.log import MemoryLog

    clock = ManualClock()

    def simulate(
        pipeline: PipelineConfig, emit: Callable[[Event], None], blobs: BlobStore
    ) -> SimRuntime:
        return SimRuntime(pipeline, emit, blobs, clock, abort_delay_ms=abort_delay_ms)

    omni = Omni(
        pipeline, log=MemoryLog(clock), clock=clock, runtime_factory=simulate, virtual_time=True
    )
    sim = omni.runtime
    assert isinstance(sim, SimRuntime)
    sim.timer = omni.timer
    await omni.start()
    return omni, sim


if TYPE_CHECKING:
    _runtime: type[Runtime] = SimRuntime
