"""Mid-stream migration: a stage whose replica is lost (or that fails)
continues on another replica after the chunks it delivered, and the
request's output is the undisturbed run's."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from omnix.events.log import MemoryLog
from omnix.events.reducer import Fold
from omnix.events.types import (
    TERMINAL_TYPES,
    Cancelled,
    Chunk,
    Failed,
    Finished,
    RequestSpec,
    Routed,
    StageFailed,
    StageStarted,
    WorkerJoined,
    WorkerLost,
)
from omnix.orchestrator.decide import Orchestrator
from omnix.orchestrator.dispatch import Dispatcher, continuation_seed
from omnix.replay.drive import drive
from omnix.testing.sim import start_sim
from omnix.trace import export_trace, read_trace
from omnix.transport.work import PieceOutput

from .conftest import omni_like

SPEC = RequestSpec(prompt="hi", outputs=("text", "audio"), seed=7)
STAGES = ("thinker", "talker", "code2wav")
TWO_REPLICAS = {s: "replicas = 2" for s in STAGES}


def output(omni, rid: str) -> tuple[str, tuple[int, ...], bytes]:
    """The request's output, concatenated in chunk order: thinker text,
    talker codec ids, code2wav audio samples."""
    text: list[str] = []
    codes: list[int] = []
    audio: list[bytes] = []
    for ev in omni.log.events_for(rid):
        if not isinstance(ev, Chunk):
            continue
        if ev.stage == "thinker":
            text.append(ev.text)
        elif ev.stage == "talker":
            codes += ev.token_ids
        elif ev.blob is not None:
            audio.append(np.asarray(omni.blobs.get_array(ev.blob)).tobytes())
    return "".join(text), tuple(codes), b"".join(audio)


def terminals(omni, rid):
    return [ev for ev in omni.log.events_for(rid) if isinstance(ev, TERMINAL_TYPES)]


async def undisturbed(cfg):
    omni, sim = await start_sim(cfg)
    omni.submit(SPEC, request_id="r1")
    sim.run_until_idle()
    return omni


async def test_killing_a_replica_at_every_position_migrates_and_changes_no_output():
    cfg = omni_like(**TWO_REPLICAS)
    base = await undisturbed(cfg)
    expected = output(base, "r1")
    assert expected[0] and expected[1] and expected[2]
    n = base.log.next_pos
    migrated = 0
    for k in range(6, n):  # six WorkerJoined come first
        for stage in STAGES:
            omni, sim = await start_sim(cfg)
            killed: list[int] = []

            def inject(ev, k=k, stage=stage, omni=omni, sim=sim, killed=killed):
                if ev.pos != k or killed:
                    return
                rs = omni.state("r1")
                st = rs.stage(stage) if rs is not None else None
                rep = st.replica if st is not None else 0
                killed.append(rep)
                sim.kill(stage, rep)

            omni.log.add_listener(inject)
            omni.submit(SPEC, request_id="r1")
            sim.run_until_idle()
            where = f"kill {stage} after pos {k}"
            ends = terminals(omni, "r1")
            assert len(ends) == 1 and isinstance(ends[0], Finished), f"{where}: {ends}"
            assert output(omni, "r1") == expected, where
            continuations = [
                e for e in omni.log.events_for("r1") if isinstance(e, Routed) and e.resume
            ]
            migrated += bool(continuations)
            for c in continuations:
                assert c.replica != killed[0], where
                # The new replica's first chunk continues the numbering.
                nxt = [
                    e
                    for e in omni.log.events_for("r1")
                    if isinstance(e, Chunk) and e.stage == c.stage and e.pos > c.pos
                ]
                if nxt:  # (none when the loss came after the last chunk)
                    assert (nxt[0].index, nxt[0].replica) == (c.resume, c.replica), where
            trace = read_trace(export_trace(omni.log, omni.blobs, cfg, ["r1"]))
            report = drive(trace, raise_on_divergence=False)
            assert report.ok, f"{where}: {report.divergence}"
    assert migrated > 20, migrated


async def test_a_continuation_is_sent_every_piece_and_where_to_resume():
    cfg = omni_like(**TWO_REPLICAS)
    omni, sim = await start_sim(cfg)
    omni.submit(SPEC, request_id="r1")
    while omni.state("r1").stage("talker") is None or omni.state("r1").stage("talker").chunks < 4:
        assert sim.step()
    routed = [e for e in omni.log.events_for("r1") if isinstance(e, Routed) and e.stage == "talker"]
    sim.kill("talker", 0)
    cont = [e for e in omni.log.events_for("r1") if isinstance(e, Routed) and e.stage == "talker"][
        len(routed) :
    ]
    assert [(e.seq, e.sources, e.replica) for e in cont] == [(e.seq, e.sources, 1) for e in routed]
    assert cont[0].resume == 4 and all(e.resume == 0 for e in cont[1:])
    work = next(w for w in sim.sent if w.stage == "talker" and w.replica == 1 and w.seq == 0)
    assert work.resume is not None and work.resume.chunks == 4
    talker = [e for e in omni.log.events_for("r1") if isinstance(e, Chunk) and e.stage == "talker"]
    assert work.resume.token_ids == tuple(i for e in talker[:4] for i in e.token_ids)
    assert work.seed == continuation_seed(SPEC.seed, 4) != SPEC.seed
    st = omni.state("r1").stage("talker")
    assert (st.chunks, st.attempt, st.replica, st.status) == (4, 2, 1, "routed")
    sim.run_until_idle()
    assert isinstance(terminals(omni, "r1")[0], Finished)
    starts = [
        e for e in omni.log.events_for("r1") if isinstance(e, StageStarted) and e.stage == "talker"
    ]
    assert [e.replica for e in starts] == [0, 1]


async def test_a_continuation_of_audio_carries_the_samples_already_delivered():
    cfg = omni_like(**TWO_REPLICAS)
    omni, sim = await start_sim(cfg)
    omni.submit(SPEC, request_id="r1")
    while (
        omni.state("r1").stage("code2wav") is None or omni.state("r1").stage("code2wav").chunks < 2
    ):
        assert sim.step()
    sim.kill("code2wav", 0)
    work = next(w for w in sim.sent if w.stage == "code2wav" and w.replica == 1 and w.seq == 0)
    assert work.resume is not None and work.resume.chunks == 2 and work.resume.samples == 2 * 320
    sim.run_until_idle()
    assert isinstance(terminals(omni, "r1")[0], Finished)


async def test_with_no_replica_left_the_continuation_waits_for_the_restarted_one():
    cfg = omni_like()
    base = await undisturbed(cfg)
    omni, sim = await start_sim(cfg)
    omni.submit(SPEC, request_id="r1")
    for _ in range(8):
        sim.step()
    k = omni.state("r1").stage("thinker").chunks
    assert k > 0
    sim.kill("thinker", 0)
    for _ in range(5):
        sim.step()
    assert not omni.state("r1").terminal
    assert omni.orchestrator.queue_length("thinker") == 1
    sim.dead.discard("thinker/0")
    omni.sequencer.emit(
        WorkerJoined(
            worker_id="thinker/0", stage="thinker", replica=0, engine="scripted", capacity=8
        )
    )
    sim.run_until_idle()
    assert isinstance(terminals(omni, "r1")[0], Finished)
    assert output(omni, "r1") == output(base, "r1")
    cont = [e for e in omni.log.events_for("r1") if isinstance(e, Routed) and e.resume]
    assert [(e.stage, e.replica, e.resume) for e in cont] == [("thinker", 0, k)]


async def test_a_stage_whose_retries_are_exhausted_fails_as_before():
    cfg = omni_like(thinker="replicas = 2\nmax_retries = 1")
    omni, sim = await start_sim(cfg)
    omni.submit(SPEC, request_id="r1")
    for _ in range(4):
        sim.step()
    sim.kill("thinker", 0)  # first loss: continues on thinker/1
    for _ in range(4):
        sim.step()
    assert omni.state("r1").stage("thinker").replica == 1
    sim.kill("thinker", 1)  # second loss: no retry left
    sim.run_until_idle()
    (end,) = terminals(omni, "r1")
    assert isinstance(end, Failed) and end.reason == "stage_lost" and end.stage == "thinker"


async def test_a_failing_stage_continues_and_fails_once_its_retries_run_out():
    # fail_at fires again in every continuation (it is past the resume point).
    cfg = omni_like(
        talker='engine = { kind = "scripted", chunks_per_piece = 3, delay_ms = 1, '
        'output_modality = "codec", fail_at = 4 }\nreplicas = 2'
    )
    omni, sim = await start_sim(cfg)
    omni.submit(SPEC, request_id="r1")
    sim.run_until_idle()
    (end,) = terminals(omni, "r1")
    assert isinstance(end, Failed) and end.reason == "stage_error" and end.stage == "talker"
    assert omni.state("r1").stage("talker").attempt == 3  # max_retries = 2
    resumes = [
        e.resume
        for e in omni.log.events_for("r1")
        if isinstance(e, Routed) and e.stage == "talker" and e.seq == 0
    ]
    assert resumes == [0, 4, 4]


@pytest.mark.parametrize("cancel_after", [0, 1])
async def test_a_cancel_during_a_migration_still_ends_cancelled(cancel_after):
    cfg = omni_like()  # one replica each: the continuation waits in the queue
    omni, sim = await start_sim(cfg)
    omni.submit(SPEC, request_id="r1")
    for _ in range(8):
        sim.step()
    sim.kill("thinker", 0)
    if cancel_after:  # the replica is back and the continuation routed
        sim.dead.discard("thinker/0")
        omni.sequencer.emit(
            WorkerJoined(
                worker_id="thinker/0", stage="thinker", replica=0, engine="scripted", capacity=8
            )
        )
    omni.cancel("r1")
    sim.run_until_idle()
    (end,) = terminals(omni, "r1")
    assert isinstance(end, Cancelled)
    assert omni.orchestrator.queue_length("thinker") == 0


async def test_rules_v1_keep_failing_a_stage_lost_mid_stream():
    cfg = omni_like(**TWO_REPLICAS)
    omni, sim = await start_sim(cfg)
    omni.submit(SPEC, request_id="r1")
    for _ in range(8):
        sim.step()
    sim.kill("thinker", 0)
    sim.run_until_idle()
    assert isinstance(terminals(omni, "r1")[0], Finished)
    # The same inputs under rules v1 (a trace recorded then) decide a failure.
    old = Orchestrator(cfg, rules=1)
    fold = Fold()
    for ev in omni.log.read():
        fold.apply(ev)
        decided = old.react(ev, fold)
        if isinstance(ev, WorkerLost):
            assert [type(d) for d in decided] == [Failed]
            break
    else:  # pragma: no cover
        raise AssertionError("no WorkerLost in the log")


async def test_a_continuation_says_how_the_delivered_chunks_split_over_the_input_pieces():
    """``Resume.pieces``: per input piece, the chunks, token ids and text
    characters it delivered (``Chunk.piece``), up to the last piece that
    delivered anything; what an engine running one sub-request per piece
    (vLLM's talker) needs to continue exactly."""
    cfg = omni_like(**TWO_REPLICAS)
    per_piece = cfg.stage("talker").engine.chunks_per_piece
    omni, sim = await start_sim(cfg)
    omni.submit(SPEC, request_id="r1")
    cut = 2 * per_piece + 1  # inside the third piece
    while omni.state("r1").stage("talker") is None or omni.state("r1").stage("talker").chunks < cut:
        assert sim.step()

    # The sim records no pieces: give its chunks the pieces a worker would
    # record (the scripted talker speaks per_piece chunks per input piece),
    # skipping piece 1 as an empty piece would be.
    def piece_of(index: int) -> int:
        p = index // per_piece
        return p if p == 0 else p + 1

    events = [
        msgspec.structs.replace(e, piece=piece_of(e.index))
        if isinstance(e, Chunk) and e.stage == "talker"
        else e
        for e in omni.log.read()
    ]
    log = MemoryLog(events=events)
    talker = [e for e in log.events_for("r1") if isinstance(e, Chunk) and e.stage == "talker"][:cut]
    routed = Routed(
        request_id="r1", stage="talker", replica=1, seq=0, sources=(), last=False, resume=cut
    )
    resume = Dispatcher(log, None, omni.blobs, cfg).resume(routed)  # resume() uses no runtime
    assert resume.chunks == cut
    assert resume.token_ids == tuple(i for e in talker for i in e.token_ids)

    def share(p: int) -> PieceOutput:
        mine = [e for e in talker if e.piece == p]
        return PieceOutput(
            len(mine), sum(len(e.token_ids) for e in mine), sum(len(e.text) for e in mine)
        )

    assert resume.pieces == (share(0), PieceOutput(), share(2), share(3))
    assert resume.pieces[3].chunks == 1 and resume.pieces[0].chunks == per_piece
    # Chunks recorded without pieces (every one piece 0): one share.
    plain = Dispatcher(omni.log, None, omni.blobs, cfg).resume(routed)  # resume() uses no runtime
    assert plain.token_ids == resume.token_ids
    assert plain.pieces == (PieceOutput(cut, len(resume.token_ids), len(resume.text)),)


async def test_a_stage_refusing_the_requests_own_input_fails_it_without_a_continuation():
    """A ValueError from an engine (StageFailed.retry False) is the request's
    own input refused: another replica would refuse it too, so the request
    fails at once, its retries unused."""
    cfg = omni_like(
        talker='engine = { kind = "scripted", chunks_per_piece = 3, delay_ms = 1, '
        'output_modality = "codec" }\nreplicas = 2'
    )
    omni, sim = await start_sim(cfg)
    omni.submit(SPEC, request_id="r1")
    for _ in range(12):
        sim.step()
        st = omni.state("r1").stage("talker")
        if st is not None and st.replica >= 0:
            break
    replica = omni.state("r1").stage("talker").replica
    omni.sequencer.emit(
        StageFailed(
            request_id="r1",
            stage="talker",
            replica=replica,
            message="ValueError: unknown voice 'alloy'",
            retry=False,
        )
    )
    sim.run_until_idle()
    (end,) = terminals(omni, "r1")
    assert isinstance(end, Failed) and end.reason == "stage_error"
    assert "unknown voice" in end.message
    assert omni.state("r1").stage("talker").attempt == 1
