"""Hand-built tiny-omni request timelines for the telemetry tests.

Each event is appended to a ``MemoryLog`` whose ``ManualClock`` is moved
explicitly before it, so every expected duration below is a sum of the
``at(ms)`` steps and can be checked exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omnix.events.clock import ManualClock
from omnix.events.log import MemoryLog
from omnix.events.types import (
    Admitted,
    BlobRef,
    Cancelled,
    CancelRequested,
    Chunk,
    Event,
    Failed,
    Finished,
    Rejected,
    RequestSpec,
    Routed,
    StageFinished,
    StageStarted,
    WorkerJoined,
    WorkerLost,
)

T0 = 1_700_000_000_000_000_000
MS = 1_000_000
PIPELINE = "tiny-omni"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"
SAMPLES = 4800  # per audio chunk: 0.2 s at 24 kHz


@dataclass
class Scenario:
    """A log, its clock, and the stored events by name for assertions."""

    log: MemoryLog = field(default_factory=lambda: MemoryLog(ManualClock(T0)))
    ev: dict[str, Event] = field(default_factory=dict)

    def at(self, ms: float, name: str, event: Event) -> Event:
        """Append ``event`` ``ms`` after the previous one; remember it as ``name``."""
        clock = self.log.clock
        assert isinstance(clock, ManualClock)  # a scenario's log runs on a manual clock
        clock.advance(round(ms * MS))
        stored = self.log.append(event)
        self.ev[name] = stored
        return stored

    def ts(self, name: str) -> int:
        return self.ev[name].ts_ns

    def workers(self) -> None:
        for stage in ("thinker", "talker", "code2wav"):
            self.at(0, f"join-{stage}", WorkerJoined(
                worker_id=f"{stage}/0", stage=stage, replica=0, engine="scripted", capacity=4))  # fmt: skip

    def finished(self, rid: str = "r-ok", traceparent: str = TRACEPARENT) -> None:
        """thinker 3 tokens -> talker 4 codec frames -> code2wav 2 audio chunks."""
        spec = RequestSpec(
            prompt="hi", outputs=("text", "audio"), api="chat.completions",
            model=PIPELINE, traceparent=traceparent, seed=3,
        )  # fmt: skip
        a = self.at(10, "admitted", Admitted(request_id=rid, pipeline=PIPELINE, spec=spec))
        self.at(0, "routed-thinker", Routed(request_id=rid, stage="thinker", replica=0, seq=0,
                                            sources=(a.pos,), last=True))  # fmt: skip
        self.at(2, "started-thinker", StageStarted(request_id=rid, stage="thinker", replica=0))
        for i in range(3):
            self.at(10, f"text-{i}", Chunk(request_id=rid, stage="thinker", replica=0, index=i,
                                           modality="text", text=f"w{i} ", token_ids=(i,)))  # fmt: skip
        self.at(1, "finished-thinker", StageFinished(
            request_id=rid, stage="thinker", replica=0, chunks=3, prompt_tokens=5, output_tokens=3))  # fmt: skip
        self.at(0, "routed-talker", Routed(request_id=rid, stage="talker", replica=0, seq=0,
                                           sources=(), last=True))  # fmt: skip
        self.at(3, "started-talker", StageStarted(request_id=rid, stage="talker", replica=0))
        for i in range(4):
            self.at(5, f"codec-{i}", Chunk(request_id=rid, stage="talker", replica=0, index=i,
                                           modality="codec", token_ids=(1, 2, 3, 4)))  # fmt: skip
            if i == 1:
                self.at(0, "routed-c2w-0", Routed(request_id=rid, stage="code2wav", replica=0,
                                                  seq=0, sources=(), last=False))  # fmt: skip
                self.at(
                    1, "started-code2wav", StageStarted(request_id=rid, stage="code2wav", replica=0)
                )
                self.at(4, "audio-0", _audio(rid, 0))
        self.at(1, "finished-talker", StageFinished(
            request_id=rid, stage="talker", replica=0, chunks=4, prompt_tokens=3, output_tokens=4))  # fmt: skip
        self.at(0, "routed-c2w-1", Routed(request_id=rid, stage="code2wav", replica=0, seq=1,
                                          sources=(), last=True))  # fmt: skip
        self.at(4, "audio-1", _audio(rid, 1))
        self.at(1, "finished-code2wav", StageFinished(
            request_id=rid, stage="code2wav", replica=0, chunks=2))  # fmt: skip
        self.at(0, "finished", Finished(request_id=rid))

    def cancelled(self, rid: str = "r-cancel") -> None:
        """The client cancels while the thinker streams; the thinker acks."""
        spec = RequestSpec(prompt="hi", outputs=("text", "audio"), api="chat.completions",
                           model=PIPELINE)  # fmt: skip
        a = self.at(10, "c-admitted", Admitted(request_id=rid, pipeline=PIPELINE, spec=spec))
        self.at(0, "c-routed", Routed(request_id=rid, stage="thinker", replica=0, seq=0,
                                      sources=(a.pos,), last=True))  # fmt: skip
        self.at(5, "c-started", StageStarted(request_id=rid, stage="thinker", replica=0))
        self.at(10, "c-text-0", Chunk(request_id=rid, stage="thinker", replica=0, index=0,
                                      modality="text", text="a"))  # fmt: skip
        c = self.at(7, "c-cancel", CancelRequested(request_id=rid, reason="client"))
        self.at(3, "c-aborted", StageFinished(request_id=rid, stage="thinker", replica=0,
                                              chunks=1, finish_reason="aborted"))  # fmt: skip
        self.at(0, "c-cancelled", Cancelled(request_id=rid, reason="client", cause=c.pos))

    def failed(self, rid: str = "r-fail") -> None:
        """The talker's replica dies mid-stream; the request fails."""
        spec = RequestSpec(prompt="hi", outputs=("audio",), api="audio.speech", model="")
        a = self.at(10, "f-admitted", Admitted(request_id=rid, pipeline=PIPELINE, spec=spec))
        self.at(0, "f-routed-thinker", Routed(request_id=rid, stage="thinker", replica=0, seq=0,
                                              sources=(a.pos,), last=True))  # fmt: skip
        self.at(1, "f-text-0", Chunk(request_id=rid, stage="thinker", replica=0, index=0,
                                     modality="text", text="a"))  # fmt: skip
        self.at(1, "f-finished-thinker", StageFinished(request_id=rid, stage="thinker", replica=0,
                                                       chunks=1, output_tokens=1))  # fmt: skip
        self.at(0, "f-routed-talker", Routed(request_id=rid, stage="talker", replica=0, seq=0,
                                             sources=(), last=True))  # fmt: skip
        self.at(2, "f-started-talker", StageStarted(request_id=rid, stage="talker", replica=0))
        lost = self.at(20, "f-lost", WorkerLost(worker_id="talker/0", stage="talker", replica=0,
                                               reason="exit"))  # fmt: skip
        self.at(0, "f-failed", Failed(request_id=rid, reason="stage_lost", stage="talker",
                                      message="talker replica lost", cause=lost.pos))  # fmt: skip

    def rejected(self, rid: str = "r-refused") -> None:
        spec = RequestSpec(prompt="hi", api="chat.completions", model=PIPELINE)
        self.at(5, "rejected", Rejected(request_id=rid, pipeline=PIPELINE, spec=spec,
                                        reason="overloaded", message="queue full"))  # fmt: skip

    def all(self) -> Scenario:
        self.workers()
        self.finished()
        self.cancelled()
        self.failed()
        self.rejected()
        return self


def _audio(rid: str, index: int) -> Chunk:
    ref = BlobRef(digest=f"{index:032x}", nbytes=4 * SAMPLES, dtype="<f4", shape=(SAMPLES,))
    return Chunk(
        request_id=rid, stage="code2wav", replica=0, index=index, modality="audio", blob=ref
    )
