"""Retention on the memory log: bounded memory over a long stream, what a
released id answers, in-flight requests kept, shared blobs kept until the
last reference goes, the three bounds, and releases as replayable events."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from omnix.events.blobs import MemoryBlobStore
from omnix.events.clock import ManualClock
from omnix.events.log import EventReleased, MemoryLog
from omnix.events.reducer import IllegalTransition, fold
from omnix.events.retention import Retention, RetentionPolicy
from omnix.events.types import (
    Admitted,
    BlobRef,
    Chunk,
    Event,
    Finished,
    Released,
    RequestSpec,
    Routed,
    StageFinished,
    StageStarted,
    WorkerJoined,
)

SPEC = RequestSpec(prompt="hello", outputs=("text", "audio"))
MS = 1_000_000


def lifecycle(rid: str, blobs: list[BlobRef], chunks: int = 3) -> Iterator[Event]:
    yield Admitted(request_id=rid, pipeline="p", spec=SPEC)
    yield Routed(request_id=rid, stage="s", replica=0, seq=0, sources=(), last=True)
    yield StageStarted(request_id=rid, stage="s", replica=0)
    for i in range(chunks):
        blob = blobs[i] if i < len(blobs) else None
        yield Chunk(
            request_id=rid,
            stage="s",
            replica=0,
            index=i,
            modality="audio" if blob is not None else "text",
            text="" if blob else "tok",
            blob=blob,
        )
    yield StageFinished(request_id=rid, stage="s", replica=0, chunks=chunks)
    yield Finished(request_id=rid)


def start(rid: str) -> list[Event]:
    return [
        Admitted(request_id=rid, pipeline="p", spec=SPEC),
        Routed(request_id=rid, stage="s", replica=0, seq=0, sources=(), last=True),
        StageStarted(request_id=rid, stage="s", replica=0),
    ]


def finish(rid: str, chunks: int = 0) -> list[Event]:
    return [
        StageFinished(request_id=rid, stage="s", replica=0, chunks=chunks),
        Finished(request_id=rid),
    ]


def new_log(policy: RetentionPolicy, clock: ManualClock | None = None):
    clock = clock or ManualClock()
    log = MemoryLog(clock)
    blobs = MemoryBlobStore()
    log.append(WorkerJoined(worker_id="s/0", stage="s", replica=0, engine="scripted", capacity=8))
    ret = Retention(log, policy, blobs)
    return log, blobs, ret, clock


def feed(log: MemoryLog, events, clock: ManualClock | None = None, step_ns: int = MS) -> None:
    for ev in events:
        log.append(ev)
        if clock is not None:
            clock.advance(step_ns)


def test_twenty_thousand_requests_stay_bounded() -> None:
    policy = RetentionPolicy(window_s=None, max_requests=50, max_bytes=None)
    log, blobs, ret, clock = new_log(policy)
    held_peak = slots_peak = 0
    for i in range(20_000):
        # Every request has its own audio blob, and every fifth shares one.
        own = blobs.put_array(np.full(64, i, dtype="<f4"))
        shared = blobs.put_array(np.zeros(64, dtype="<f4")) if i % 5 == 0 else None
        refs = [own] if shared is None else [own, shared]
        feed(log, lifecycle(f"r{i}", refs), clock)
        held_peak = max(held_peak, log.held_events)
        slots_peak = max(slots_peak, log.held_slots)
    st = log.state
    assert ret.requests_retained == len(st.requests) == 50
    assert len(st.ended) == 50 and st.ended_dropped == 19_950
    assert ret.retained_events == 50 * 8
    # Every retained request's events, a few Released and the worker's join.
    assert held_peak < 50 * 8 + 100
    # Released slots are cut off once they are half the list: bounded too.
    assert slots_peak < 4 * (50 * 8 + 100) + 2048
    assert len(log._index) == 50
    # Blobs: the 50 retained requests' own, and the shared one.
    assert len(blobs.digests()) == 51
    assert ret.blobs_retained_bytes == 51 * 256
    assert ret.released_total == 19_950
    assert len(st.audio_samples) == 50


def test_released_unknown_and_retained_answers() -> None:
    policy = RetentionPolicy(window_s=None, max_requests=2, max_bytes=None, tombstones=3)
    log, _, ret, clock = new_log(policy)
    for i in range(4):
        feed(log, lifecycle(f"r{i}", []), clock)
    assert ret.status("r0") == "released" and ret.is_released("r0")
    assert ret.status("r3") == "retained" and not ret.is_released("r3")
    assert ret.status("nope") == "unknown" and not ret.is_released("nope")
    admitted_r0 = 1  # after the worker's join
    with pytest.raises(EventReleased, match="position 1 was released by retention"):
        log.get(admitted_r0)
    assert log.events_for("r0") == []
    assert "r0" not in log.state.requests
    assert all(getattr(ev, "request_id", None) != "r0" for ev in log.read())
    # The tombstones are capped: beyond the last 3 released, ids are unknown.
    for i in range(4, 8):
        feed(log, lifecycle(f"r{i}", []), clock)
    assert ret.tombstones == 3
    assert ret.status("r0") == "unknown"
    assert ret.status("r5") == "released"


def test_in_flight_requests_are_never_released() -> None:
    policy = RetentionPolicy(window_s=1.0, max_requests=1, max_bytes=1)
    log, _, ret, clock = new_log(policy)
    feed(log, start("long"), clock)
    for i in range(50):
        feed(log, lifecycle(f"r{i}", []), clock, step_ns=500 * MS)
    assert log.state.requests["long"].status == "running"
    assert ret.status("long") == "retained"
    assert [ev.pos for ev in log.events_for("long")] == [1, 2, 3]
    # The reducer refuses a Released naming a request in flight.
    with pytest.raises(IllegalTransition, match="still in flight"):
        log.append(Released(request_ids=("long",), reason="count"))
    feed(log, finish("long"), clock)
    assert ret.status("long") in ("retained", "released")
    log.append(WorkerJoined(worker_id="s/1", stage="s", replica=1, engine="x", capacity=1))
    assert ret.status("long") == "released"


def test_a_shared_blob_is_kept_until_its_last_reference_goes() -> None:
    policy = RetentionPolicy(window_s=None, max_requests=1, max_bytes=None)
    log, blobs, ret, clock = new_log(policy)
    shared = blobs.put(b"the same bytes" * 10)
    feed(log, lifecycle("a", [shared]), clock)
    feed(log, lifecycle("b", [shared]), clock)  # a is released; b still refers to it
    assert ret.status("a") == "released"
    assert shared in blobs
    mine = blobs.put(b"only c's")
    feed(log, lifecycle("c", [mine]), clock)  # b is released: no one refers to it
    assert ret.status("b") == "released"
    assert shared not in blobs
    assert mine in blobs
    assert ret.blobs_retained_bytes == mine.nbytes


def test_a_blob_put_again_is_not_deleted_under_a_worker() -> None:
    # A worker puts a blob before appending the chunk that refers to it: a
    # release in between must not delete it.
    policy = RetentionPolicy(window_s=None, max_requests=1, max_bytes=None)
    log, blobs, ret, clock = new_log(policy)
    ref = blobs.put(b"silence" * 20)
    feed(log, lifecycle("a", [ref]), clock)
    blobs.take_fresh()
    feed(log, start("b"), clock)
    assert blobs.put(b"silence" * 20) == ref  # b's worker, about to send its chunk
    feed(log, lifecycle("x", []), clock)  # releases a: ref's last reference
    assert ret.status("a") == "released"
    assert ref in blobs
    log.append(Chunk(request_id="b", stage="s", replica=0, index=0, modality="audio", blob=ref))
    feed(log, finish("b", chunks=1), clock)
    feed(log, lifecycle("y", []), clock)
    feed(log, lifecycle("z", []), clock)  # b released: now it goes
    assert ret.status("b") == "released"
    assert ref not in blobs


def test_the_time_bound_and_the_idle_sweep() -> None:
    clock = ManualClock()
    policy = RetentionPolicy(window_s=10.0, max_requests=None, max_bytes=None)
    log, _, ret, _ = new_log(policy, clock)
    feed(log, lifecycle("a", []), clock, step_ns=MS)
    a_end = log.state.requests["a"].terminal_ts
    clock.advance(5_000 * MS)
    feed(log, lifecycle("b", []), clock, step_ns=MS)
    assert ret.requests_retained == 2
    # Idle: nothing is appended, so only a sweep can release by time (once
    # the window and its 1/64 slack have passed).
    clock.advance(5_000 * MS)
    assert ret.sweep() is None
    clock.advance(200 * MS)
    assert ret.sweep() is not None and ret.status("a") == "released"
    assert ret.status("b") == "retained"
    assert ret.sweep() is None
    rel = [ev for ev in log.read() if type(ev) is Released]
    assert len(rel) == 1 and rel[0].request_ids == ("a",) and rel[0].reason == "time"
    # The decision is a function of the log: stamped 10 s or more after a's end.
    assert rel[0].ts_ns - a_end >= 10_000 * MS
    # An event whose timestamp passes b's window releases it on the spot.
    clock.advance(6_000 * MS)
    feed(log, lifecycle("c", []), clock)
    assert ret.status("b") == "released" and ret.status("c") == "retained"


def test_the_byte_bound_releases_oldest_first() -> None:
    policy = RetentionPolicy(window_s=None, max_requests=None, max_bytes=3 * 4096 + 2000)
    log, blobs, ret, clock = new_log(policy)
    for i in range(6):
        ref = blobs.put(bytes([i]) * 4096)
        feed(log, lifecycle(f"r{i}", [ref]), clock)
        assert ret.retained_bytes + ret.blobs_retained_bytes <= policy.max_bytes
    assert [ret.status(f"r{i}") for i in range(6)] == ["released"] * 3 + ["retained"] * 3
    reasons = {ev.reason for ev in log.read() if type(ev) is Released}
    assert reasons == {"bytes"}


def test_releases_replay_from_the_log() -> None:
    """The Released events are a function of the other events and the policy:
    a fresh log and retention fed the same inputs append the same ones, and a
    log refolded from its events holds the same states."""
    policy = RetentionPolicy(window_s=0.5, max_requests=6, max_bytes=12_000)
    clock = ManualClock()
    log, blobs, _, _ = new_log(policy, clock)
    stream: list[Event] = []
    recorded: list[Released] = []
    rng = np.random.default_rng(3)

    def tap(ev: Event) -> None:
        # The log itself lets go of old Released events: record them here.
        if type(ev) is Released:
            recorded.append(ev)
        else:
            stream.append(ev)

    log.add_listener(tap)
    live: dict[str, Iterator[Event]] = {}
    # Three phases: quick small requests (the count bound), big blobs (the
    # byte bound), slow ones (the time bound); requests interleave.
    for i in range(300):
        size, step = (100, 1) if i < 100 else (3000, 1) if i < 200 else (100, 40)
        payload = bytes(rng.integers(0, 255, size, dtype=np.uint8))
        live[f"r{i}"] = lifecycle(f"r{i}", [blobs.put(payload)])
        for rid in list(live)[:3]:
            for _ in range(3):
                ev = next(live[rid], None)
                if ev is None:
                    del live[rid]
                    break
                log.append(ev)
                clock.advance(int(rng.integers(0, step + 1)) * MS)
    assert {ev.reason for ev in recorded} == {"count", "time", "bytes"}
    # Replay: the inputs again, stamped as recorded.
    log2, _, _, _ = new_log(policy, ManualClock())
    replayed: list[Event] = []
    log2.add_listener(lambda ev: replayed.append(ev) if type(ev) is Released else None)
    for ev in stream:
        log2.append(ev)
    assert replayed == recorded
    assert log2.state.digest() == log.state.digest()


def test_a_released_request_folds_away() -> None:
    events: list[Event] = [
        *lifecycle("a", []),
        *lifecycle("b", []),
    ]
    f = fold([*events, Released(request_ids=("a",), reason="count", pos=len(events))])
    assert set(f.requests) == {"b"} and f.ended == ["b"] and f.ended_dropped == 1
    # Ids no longer in the fold are ignored (a snapshot's suffix, a trace).
    f.apply(Released(request_ids=("a", "zz"), reason="count"))
    assert set(f.requests) == {"b"}


async def test_a_trace_exported_within_the_window_replays_exactly() -> None:
    """A server's log with retention (releases appended through the
    sequencer, after each cascade): a trace of a retained request drives
    with zero divergence, and the log's own requests fold as before."""
    from omnix.replay.drive import drive
    from omnix.testing.sim import start_sim
    from omnix.trace import export_trace, read_trace

    from ..orchestrator.conftest import omni_like

    omni, sim = await start_sim(omni_like())
    ret = Retention(
        omni.log,
        RetentionPolicy(window_s=None, max_requests=2, max_bytes=None),
        omni.blobs,
        append=omni.sequencer.append,
    )
    for k in range(4):
        omni.submit(
            RequestSpec(prompt=f"p{2 * k}", outputs=("text", "audio"), seed=k),
            request_id=f"r{2 * k}",
        )
        for _ in range(5):
            sim.step()
        omni.submit(
            RequestSpec(prompt=f"p{2 * k + 1}", outputs=("text", "audio")),
            request_id=f"r{2 * k + 1}",
        )
        sim.run_until_idle()
    assert [ret.status(f"r{i}") for i in range(8)] == ["released"] * 6 + ["retained"] * 2
    assert omni.sequencer.refused_inputs == 0 and omni.sequencer.refused_decisions == 0
    for rid in ("r6", "r7"):
        t = read_trace(export_trace(omni.log, omni.blobs, omni.pipeline, [rid]))
        res = drive(t)
        assert res.ok and res.events == len(t.events)
        assert [type(e) for e in t.events_for(rid)] == [type(e) for e in omni.log.events_for(rid)]
    # Every blob a retained event refers to is still there; the others went.
    held = {
        ev.blob.digest
        for rid in ("r6", "r7")
        for ev in omni.log.events_for(rid)
        if type(ev) is Chunk and ev.blob is not None
    }
    assert held and held <= set(omni.blobs.digests())


def test_a_client_deletion_releases_an_ended_request_now() -> None:
    """``Retention.delete``: an ended request's events, state and blobs go
    at once, as ``Released(reason="deleted")``; one in flight stays; a
    partial image (a ``Progress`` blob, schema v7) is counted and goes
    with its request."""
    from omnix.events.types import Progress

    policy = RetentionPolicy(window_s=None, max_requests=100, max_bytes=None)
    log, blobs, ret, clock = new_log(policy)
    video = blobs.put(b"an mp4" * 10)
    preview = blobs.put(b"a partial image")
    feed(log, start("job"), clock)
    log.append(Progress(request_id="job", stage="s", replica=0, step=1, total=2, blob=preview))
    log.append(Chunk(request_id="job", stage="s", replica=0, index=0, modality="video", blob=video))
    assert ret.delete(("job",)) is None  # in flight: not deleted
    feed(log, start("other"), clock)
    feed(log, finish("job", chunks=1), clock)
    assert ret.blobs_retained_bytes == video.nbytes + preview.nbytes
    ev = ret.delete(("job", "other", "nope"))
    assert ev is not None and ev.reason == "deleted" and ev.request_ids == ("job",)
    assert ret.status("job") == "released" and log.events_for("job") == []
    assert ret.blobs_retained_bytes == 0
    assert ret.status("other") == "retained"
    assert ret.delete(("job",)) is None  # already gone
    # Blobs put since the last collection wait one more (a worker may be
    # about to refer to one): the next release deletes them.
    feed(log, finish("other"), clock)
    assert ret.delete(("other",)) is not None
    assert video not in blobs and preview not in blobs
