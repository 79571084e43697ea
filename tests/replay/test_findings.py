"""Behaviours replay found that the orchestrator did not handle, kept as
regression tests now that it does.

Each test builds the input stream by hand and runs it through the real
orchestrator with the fault runner's invariant checks.  A new finding
lands here as a strict xfail (``@pytest.mark.xfail(strict=True,
reason=...)``) and loses the marker with its fix.  A fix that changes a
decision some recorded log holds is a versioned rules change, the old
rules kept reachable (docs/replay.md); the early-stop fix changed none,
so the rules version stayed.
"""

from __future__ import annotations

import msgspec

from omnix.events.blobs import MemoryBlobStore
from omnix.events.clock import ManualClock
from omnix.events.log import MemoryLog
from omnix.events.types import Chunk, RequestSpec, StageFinished, StageStarted, WorkerJoined
from omnix.orchestrator.decide import Orchestrator
from omnix.orchestrator.sequencer import Sequencer
from omnix.pipelines.validate import parse_pipeline
from omnix.replay.faults import inject
from omnix.trace import export_trace, read_trace

EARLY = """
name = "early-stop"
[[stages]]
name = "thinker"
engine = { kind = "scripted", chunks_per_piece = 12 }
[[stages]]
name = "talker"
engine = { kind = "scripted", output_modality = "codec" }
sampling = { max_tokens = 1 }
[[edges]]
source = "thinker"
target = "talker"
forward = "chunk"
every = 4
[outputs]
text = "thinker"
codec = "talker"
"""

MS = 1_000_000


def _early_stop_trace():
    """The talker stops at max_tokens (finish_reason "length") after its
    first piece while the thinker keeps streaming, as a real AR stage with
    a small max_tokens does (reproduced with real scripted workers too)."""
    cfg = parse_pipeline(EARLY)
    clock = ManualClock(0)
    log = MemoryLog(clock)
    seq = Sequencer(log, Orchestrator(cfg))
    t = 1_000 * MS

    def at(ev):
        nonlocal t
        t += MS
        seq.emit(type(ev)(**{**{f: getattr(ev, f) for f in ev.__struct_fields__}, "ts_ns": t}))

    for name in ("thinker", "talker"):
        at(
            WorkerJoined(
                worker_id=f"{name}/0", stage=name, replica=0, engine="scripted", capacity=4
            )
        )
    t += MS
    seq.submit("r1", RequestSpec(prompt="hi", outputs=("text", "codec")), t)
    at(StageStarted(request_id="r1", stage="thinker", replica=0))
    for i in range(12):
        at(
            Chunk(
                request_id="r1", stage="thinker", replica=0, index=i, modality="text", text=f"t{i} "
            )
        )
        if i == 3:
            at(StageStarted(request_id="r1", stage="talker", replica=0))
            at(
                Chunk(
                    request_id="r1",
                    stage="talker",
                    replica=0,
                    index=0,
                    modality="codec",
                    token_ids=(1,),
                )
            )
            at(
                StageFinished(
                    request_id="r1", stage="talker", replica=0, chunks=1, finish_reason="length"
                )
            )
    at(StageFinished(request_id="r1", stage="thinker", replica=0, chunks=12))
    return read_trace(export_trace(log, MemoryBlobStore(), cfg, ["r1"]))


def test_a_stage_that_stops_early_does_not_hang_its_request():
    trace = _early_stop_trace()
    res = inject(trace, [])
    assert res.ok, res.report(trace)


def test_the_early_stop_is_decided_without_refused_decisions():
    trace = _early_stop_trace()
    log = MemoryLog(ManualClock(0))
    seq = Sequencer(log, Orchestrator(trace.pipeline))
    for ev in trace.events:
        if isinstance(ev, WorkerJoined | StageStarted | Chunk | StageFinished):
            seq.emit(msgspec.structs.replace(ev, pos=-1))
        elif type(ev).__name__ == "Admitted":
            seq.submit(ev.request_id, ev.spec, ev.ts_ns)
    assert seq.refused_decisions == 0 and seq.dropped == 0
    assert log.state.requests["r1"].status == "finished"
