"""Effects of decisions: turn appended events into runtime calls.

Owns: ``Dispatcher``, a synchronous log listener that, for a ``Routed``
event, assembles the stage's input piece from the events it names (the
request's prompt, upstream chunks and their blobs) and sends it to the
``Runtime`` (``runtime.py``); for a cancel or a failure, sends aborts to
every stage still active; after a terminal event tells the runtime to
forget the request; and hands a ``Scaled`` start or drain to the runtime
to carry out.

Does not decide anything: every call it makes is implied by one event, so
replay can run the orchestrator without it.  It is the only place the
payloads of earlier events are read back for forwarding.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import assert_never

import numpy as np

from omnix.events.blobs import BlobStore
from omnix.events.log import EventLog
from omnix.events.types import (
    Admitted,
    Cancelled,
    CancelRequested,
    Chunk,
    DeadlineExpired,
    Event,
    Failed,
    Finished,
    InputAppended,
    Progress,
    Rejected,
    Released,
    RequestSpec,
    Routed,
    Scaled,
    SessionChanged,
    StageFailed,
    StageFinished,
    StageStarted,
    WorkerJoined,
    WorkerLost,
)
from omnix.orchestrator.gate import AckGate
from omnix.orchestrator.runtime import Runtime
from omnix.pipelines.config import PipelineConfig
from omnix.pipelines.plan import PipelineGraph, merge_params
from omnix.transport.work import InputPiece, PieceOutput, Resume, WorkItem

log = logging.getLogger(__name__)


class Dispatcher:
    def __init__(
        self,
        log: EventLog,
        runtime: Runtime,
        blobs: BlobStore,
        pipeline: PipelineConfig,
        report: Callable[[Event], None] | None = None,
        *,
        wait_for_ack: bool = False,
    ) -> None:
        self.log = log
        # A replicated log's events are acted on once acknowledged (AckGate,
        # tests/cluster/test_ack_gate.py).
        self._gate = AckGate(log, on=wait_for_ack)
        # Where a failed effect is reported, as an input event (the
        # sequencer's emit): a send the runtime refuses becomes StageFailed,
        # so the request still gets exactly one ending.
        self.report = report
        self.runtime = runtime
        self.blobs = blobs
        self.pipeline = pipeline
        self.graph = PipelineGraph(pipeline)
        self._specs: dict[str, RequestSpec] = {}

    def __call__(self, ev: Event) -> None:
        # The two most frequent kinds by exact type, before the match (each
        # class pattern it tries and misses is an isinstance on a Struct,
        # ~60 ns); every other kind is placed by the match.
        if type(ev) is Chunk:
            return
        if type(ev) is Routed:
            self._send(ev)
            return
        match ev:
            case (
                StageStarted()
                | StageFinished()
                | Progress()
                | StageFailed()
                | DeadlineExpired()
                | Rejected()
                | WorkerJoined()
                | WorkerLost()
                | Released()
                | SessionChanged()
                | InputAppended()
            ):
                pass  # no effect: a worker's report, or one the orchestrator decides on
            case Admitted():
                self._specs[ev.request_id] = ev.spec
            case CancelRequested():
                self._on_cancel_requested(ev)
            case Failed():
                self._abort_active(ev.request_id, ev.pos)
                self._release(ev.request_id, ev.pos)
            case Cancelled() | Finished():
                self._release(ev.request_id, ev.pos)
            case Scaled():
                if ev.op != "left":  # a replica that left is the runtime's own report
                    scale = self.runtime.scale
                    self._gate.run(ev.pos, lambda: scale(ev))
            case _:
                assert_never(ev)

    def _send(self, ev: Routed) -> None:
        try:
            work = self.work_item(ev)  # read now: the events it names are held now
        except Exception as exc:
            self._refused(ev, exc)
            return
        self._gate.run(ev.pos, lambda: self._deliver(ev, work))

    def _deliver(self, ev: Routed, work: WorkItem) -> None:
        try:
            self.runtime.send(work)
        except Exception as exc:
            self._refused(ev, exc)

    def _refused(self, ev: Routed, exc: Exception) -> None:
        """A piece that could not be sent fails its stage (an input, so the
        request still gets exactly one ending)."""
        if self.report is None:
            raise exc
        log.error("could not send %s piece %d of %s: %s", ev.stage, ev.seq, ev.request_id, exc)
        self.report(
            StageFailed(
                request_id=ev.request_id,
                stage=ev.stage,
                replica=ev.replica,
                message=f"the runtime refused the work: {exc}",
            )
        )

    def _on_cancel_requested(self, ev: CancelRequested) -> None:
        rs = self.log.state.requests[ev.request_id]
        if rs.cancel_pos == ev.pos:  # the first cancel; later ones change nothing
            self._abort_active(ev.request_id, ev.pos)

    def _abort_active(self, request_id: str, pos: int) -> None:
        rs = self.log.state.requests[request_id]
        active = [(st.name, st.replica) for st in rs.active_stages()]
        abort = self.runtime.abort

        def call() -> None:
            for stage, replica in active:
                abort(request_id, stage, replica)

        self._gate.run(pos, call)

    def _release(self, request_id: str, pos: int) -> None:
        self._specs.pop(request_id, None)
        release = self.runtime.release
        self._gate.run(pos, lambda: release(request_id))

    def spec(self, request_id: str) -> RequestSpec:
        spec = self._specs.get(request_id)
        if spec is None:
            # Not seen live (a dispatcher attached to a reopened log).
            admitted = self.log.get(self.log.state.requests[request_id].admitted_pos)
            assert isinstance(admitted, Admitted), admitted
            spec = self._specs[request_id] = admitted.spec
        return spec

    def work_item(self, ev: Routed) -> WorkItem:
        spec = self.spec(ev.request_id)
        stage_cfg = self.pipeline.stage(ev.stage)
        return WorkItem(
            request_id=ev.request_id,
            stage=ev.stage,
            replica=ev.replica,
            seq=ev.seq,
            last=ev.last,
            pieces=self.pieces(ev.sources),
            params=merge_params(stage_cfg.sampling, spec.stage_params.get(ev.stage)),
            seed=continuation_seed(spec.seed, ev.resume) if ev.seq == 0 else spec.seed,
            resume=self.resume(ev) if ev.seq == 0 and ev.resume else None,
            feeds=self.feeds(ev.stage, spec),
            input_streams=spec.input_streams,
        )

    def feeds(self, stage: str, spec: RequestSpec) -> bool:
        """Whether ``stage``'s output goes on to another stage the request
        needs (a pure function of the pipeline and the spec)."""
        needed = self.graph.needed_stages(tuple(spec.outputs))
        return any(e.target in needed for e in self.graph.out_edges[stage])

    def resume(self, ev: Routed) -> Resume:
        """Where a continuation picks up, read from the log: the stage's
        chunks before ``ev.resume``, in index order (the log holds them in
        that order: the reducer refuses any other), and how they split
        over the input pieces that produced them (``Chunk.piece``; a stage
        runs its pieces in order, so the pieces never decrease)."""
        token_ids: list[int] = []
        text: list[str] = []
        samples = 0
        pieces: list[PieceOutput] = []
        for e in self.log.events_for(ev.request_id):
            if (
                type(e) is Chunk
                and e.stage == ev.stage
                and e.index < ev.resume
                # A thinker's context for its talker is no output to continue.
                and e.modality != "hidden"
            ):
                token_ids += e.token_ids
                text.append(e.text)
                blob = e.blob
                if blob is not None and blob.shape and e.modality == "audio":
                    samples += blob.shape[0]
                if e.piece < len(pieces) - 1:
                    raise ValueError(
                        f"chunk {e.index} of stage {e.stage!r} of request {ev.request_id!r} "
                        f"came from input piece {e.piece} after a chunk of piece {len(pieces) - 1}: "
                        "the log is corrupt (a stage runs its input pieces in order)"
                    )
                pieces += [PieceOutput()] * (e.piece + 1 - len(pieces))
                p = pieces[e.piece]
                pieces[e.piece] = PieceOutput(
                    p.chunks + 1, p.token_ids + len(e.token_ids), p.text + len(e.text)
                )
        return Resume(
            chunks=ev.resume,
            token_ids=tuple(token_ids),
            samples=samples,
            text="".join(text),
            pieces=tuple(pieces),
            seed=self.spec(ev.request_id).seed,
        )

    def pieces(self, sources: tuple[int, ...]) -> tuple[InputPiece, ...]:
        """One input piece per source stage, its chunks joined in order."""
        out: list[InputPiece] = []
        group: list[Chunk] = []
        for pos in sources:
            ev = self.log.get(pos)
            if isinstance(ev, Admitted):
                media = tuple(
                    self.blobs.get_array(part.blob) for m in ev.spec.messages for part in m.media
                )
                out.append(_source_piece(ev.spec, media))
            elif isinstance(ev, Chunk):
                if group and group[0].stage != ev.stage:
                    out.append(self._join(group))
                    group = []
                group.append(ev)
            elif isinstance(ev, InputAppended):
                if ev.blob is not None:
                    array = self.blobs.get_array(ev.blob)
                    out.append(InputPiece(text=ev.text, array=array, modality=ev.modality))
                else:
                    out.append(InputPiece(text=ev.text))
        if group:
            out.append(self._join(group))
        return tuple(out)

    def _join(self, chunks: list[Chunk]) -> InputPiece:
        text = "".join(c.text for c in chunks)
        ids: tuple[int, ...] = ()
        for c in chunks:
            ids += c.token_ids
        arrays = [
            self.blobs.get_array(c.blob)
            for c in chunks
            if c.blob is not None and c.blob.dtype != "bytes"
        ]
        array = None
        if arrays:
            array = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
        return InputPiece(text=text, token_ids=ids, array=array, modality=chunks[0].modality)


def _source_piece(spec: RequestSpec, media: tuple[np.ndarray, ...]) -> InputPiece:
    """A source stage's input: the request's prompt and messages; a raw
    completion prompt (``spec.raw_prompt``) as is, as token ids when the
    client gave ids."""
    raw = spec.raw_prompt
    if raw is None:
        return InputPiece(text=spec.prompt, messages=spec.messages, media=media)
    return InputPiece(text=spec.prompt, token_ids=raw.token_ids, raw=True)


def continuation_seed(seed: int, resume: int) -> int:
    """The sampling seed of a stage execution that continues after
    ``resume`` chunks: the request's own for a first execution (and a retry
    before any output), else a 63-bit mix of the seed and the position, so
    a seeded continuation draws what it would draw whenever it is replayed
    (and not the first execution's draws again).  splitmix64's finaliser
    over ``seed + resume * golden``; see docs/pipelines.md."""
    if resume == 0:
        return seed
    z = (seed + resume * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


_MASK64 = (1 << 64) - 1
