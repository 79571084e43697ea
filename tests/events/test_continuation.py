"""The reducer's side of a continuation: a stage lost (or failed) after K
chunks is routed again with ``resume = K`` and keeps its chunks; its new
replica's chunks continue at index K."""

from __future__ import annotations

import msgspec
import pytest

from omnix.events.codec import decode_events, encode_events
from omnix.events.log import MemoryLog
from omnix.events.reducer import IllegalTransition, fold
from omnix.events.types import (
    SCHEMA_VERSION,
    Admitted,
    Chunk,
    Finished,
    RequestSpec,
    Routed,
    StageFailed,
    StageFinished,
    StageStarted,
    WorkerJoined,
    WorkerLost,
)


def _log_with_lost_stage(chunks: int = 3) -> MemoryLog:
    log = MemoryLog()
    for rep in (0, 1):
        log.append(
            WorkerJoined(
                worker_id=f"s/{rep}", stage="s", replica=rep, engine="scripted", capacity=1
            )
        )
    log.append(Admitted(request_id="r", pipeline="p", spec=RequestSpec(prompt="x")))
    log.append(Routed(request_id="r", stage="s", replica=0, seq=0, sources=(2,), last=True))
    log.append(StageStarted(request_id="r", stage="s", replica=0))
    for i in range(chunks):
        log.append(
            Chunk(request_id="r", stage="s", replica=0, index=i, modality="text", text=f"t{i} ")
        )
    log.append(WorkerLost(worker_id="s/0", stage="s", replica=0, reason="killed"))
    return log


def _continue(log: MemoryLog, resume: int) -> None:
    log.append(
        Routed(request_id="r", stage="s", replica=1, seq=0, sources=(2,), last=True, resume=resume)
    )


def test_a_continuation_keeps_the_chunks_and_counts_on_from_them():
    log = _log_with_lost_stage(3)
    assert log.state.requests["r"].stage("s").status == "lost"  # type: ignore[union-attr]
    _continue(log, 3)
    st = log.state.requests["r"].stage("s")
    assert st is not None
    assert (st.replica, st.status, st.chunks, st.attempt, st.pieces) == (1, "routed", 3, 2, 1)
    assert st.first_chunk_pos >= 0  # the stage's first output is still its first
    log.append(StageStarted(request_id="r", stage="s", replica=1))
    log.append(Chunk(request_id="r", stage="s", replica=1, index=3, modality="text", text="t3 "))
    log.append(StageFinished(request_id="r", stage="s", replica=1, chunks=4))
    log.append(Finished(request_id="r"))
    # The bulk fold agrees with the event-by-event one.
    assert fold(log.read()).digest() == log.state.digest()


@pytest.mark.parametrize("resume", [0, 2, 4])
def test_a_continuation_must_resume_after_exactly_the_chunks_delivered(resume):
    log = _log_with_lost_stage(3)
    with pytest.raises(
        IllegalTransition, match=r"after 3 chunks.*\(resume 3\), not " + str(resume)
    ):
        _continue(log, resume)


def test_a_failed_stage_continues_too_and_only_a_first_piece_resumes():
    log = MemoryLog()
    log.append(WorkerJoined(worker_id="s/0", stage="s", replica=0, engine="scripted", capacity=1))
    log.append(Admitted(request_id="r", pipeline="p", spec=RequestSpec(prompt="x")))
    log.append(Routed(request_id="r", stage="s", replica=0, seq=0, sources=(1,), last=False))
    log.append(Chunk(request_id="r", stage="s", replica=0, index=0, modality="text", text="a"))
    log.append(StageFailed(request_id="r", stage="s", replica=0, message="boom"))
    log.append(
        Routed(request_id="r", stage="s", replica=0, seq=0, sources=(1,), last=False, resume=1)
    )
    with pytest.raises(IllegalTransition, match="only a stage's first piece"):
        log.append(
            Routed(request_id="r", stage="s", replica=0, seq=1, sources=(), last=True, resume=1)
        )
    assert log.state.requests["r"].stage("s").attempt == 2  # type: ignore[union-attr]


def test_a_stage_never_run_cannot_resume():
    log = MemoryLog()
    log.append(Admitted(request_id="r", pipeline="p", spec=RequestSpec(prompt="x")))
    with pytest.raises(IllegalTransition, match="never ran"):
        log.append(
            Routed(request_id="r", stage="s", replica=0, seq=0, sources=(0,), last=True, resume=2)
        )


def test_resume_is_schema_v2_and_round_trips():
    assert SCHEMA_VERSION >= 2
    ev = Routed(
        pos=5, request_id="r", stage="s", replica=1, seq=0, sources=(2,), last=True, resume=7
    )
    (back,) = decode_events(encode_events([ev]))
    assert back == ev
    # An event written before the field existed reads resume = 0.
    old = msgspec.msgpack.encode(["routed", 5, 0, "r", "s", 1, 0, [2], True, -1])
    assert msgspec.msgpack.decode(old, type=Routed).resume == 0


def test_a_v1_disk_log_takes_v2_records_and_reads_both(tmp_path):
    import shutil
    from pathlib import Path

    from omnix.events.disklog import DiskLog

    fixtures = Path(__file__).parent / "fixtures"
    shutil.copytree(fixtures / "log_v1", tmp_path / "log")
    with DiskLog(tmp_path / "log") as log:
        before = list(log.read())
        log.append(
            WorkerJoined(worker_id="s/0", stage="s", replica=0, engine="scripted", capacity=1)
        )
        log.append(Admitted(request_id="m", pipeline="p", spec=RequestSpec(prompt="x")))
        at = log.next_pos - 1
        log.append(Routed(request_id="m", stage="s", replica=0, seq=0, sources=(at,), last=True))
        log.append(Chunk(request_id="m", stage="s", replica=0, index=0, modality="text", text="a"))
        log.append(WorkerLost(worker_id="s/0", stage="s", replica=0, reason="killed"))
        log.append(
            WorkerJoined(worker_id="s/0", stage="s", replica=0, engine="scripted", capacity=1)
        )
        log.append(
            Routed(request_id="m", stage="s", replica=0, seq=0, sources=(at,), last=True, resume=1)
        )
        after = list(log.read())
    with DiskLog(tmp_path / "log") as log:
        assert list(log.read()) == after and after[: len(before)] == before
        st = log.state.requests["m"].stage("s")
        assert st is not None and (st.chunks, st.attempt, st.status) == (1, 2, "routed")
