"""Property tests of the log and the fold over random request lifecycles.

For generated streams (plausible lifecycles, random interleavings, injected
illegal events): a refused append changes nothing, a request ends at most
once and nothing is accepted after that, the fold is deterministic, and a
snapshot plus the suffix folds to the same state as the whole log.
"""

from __future__ import annotations

import os
import tempfile

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omnix.events.clock import ManualClock
from omnix.events.disklog import DiskLog, LogConfig
from omnix.events.log import EventLog, MemoryLog
from omnix.events.reducer import Fold, IllegalTransition, Snapshot, fold
from omnix.events.types import (
    Admitted,
    CancelRequested,
    Event,
    RequestEvent,
    Routed,
    WorkerJoined,
    WorkerLost,
)
from tests.events.strategies import TERMINAL, Step, event_streams

# OMNIX_PROPERTY_EXAMPLES=2000 for a deeper run than the suite's default.
EXAMPLES = int(os.environ.get("OMNIX_PROPERTY_EXAMPLES", "60"))
PROPS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def drive(log: EventLog, steps: list[Step]) -> None:
    """Append every step, checking what must be accepted or refused."""
    terminal_at: dict[str, int] = {}
    tainted: set[str] = set()  # requests whose later events may legally be refused
    admitted: set[str] = set()
    cancel_asked: set[str] = set()
    alive: dict[str, bool] = {}
    users: dict[str, set[str]] = {}  # worker id -> requests routed to it

    for step in steps:
        ev, rid, kind = step.ev, step.rid, step.kind
        n0, digest0 = len(log), log.state.digest()
        try:
            stored = log.append(ev)
            ok = True
        except IllegalTransition as exc:
            ok = False
            key = rid if rid is not None else ev.worker_id  # type: ignore[union-attr]
            assert str(exc).startswith(f"{key}: illegal "), str(exc)
        if ok:
            assert len(log) == n0 + 1 and stored.pos == n0
        else:
            assert len(log) == n0, "a refused event grew the log"
            assert log.state.digest() == digest0, "a refused event changed the state"

        wid = getattr(ev, "worker_id", None)
        why = f"{kind} {ev!r}"
        if rid is not None and rid in terminal_at:
            assert not ok, f"accepted after the terminal at {terminal_at[rid]}: {why}"
        if kind == "gen" and (rid is None or rid not in tainted):
            assert ok, f"a plausible event was refused: {why}"
        if kind in ("ghost", "bad_chunk"):
            assert not ok, f"accepted an illegal event: {why}"
        if kind == "readmit" and rid in admitted:
            assert not ok, why
        if kind == "cancelled_early" and rid not in cancel_asked:
            assert not ok, why
        if kind == "rejoin":
            assert ok == (not alive.get(wid, False)), why
        if kind == "worker_lost":
            assert ok == alive.get(wid, False), why

        if not ok:
            if rid is not None:
                tainted.add(rid)
            continue
        if isinstance(ev, TERMINAL):
            terminal_at[rid] = stored.pos  # type: ignore[index]
        if isinstance(ev, Admitted) or (isinstance(ev, TERMINAL) and rid not in admitted):
            admitted.add(rid)  # type: ignore[arg-type]
        if isinstance(ev, CancelRequested):
            cancel_asked.add(rid)  # type: ignore[arg-type]
        if isinstance(ev, Routed):
            users.setdefault(f"{ev.stage}/{ev.replica}", set()).add(rid)  # type: ignore[arg-type]
        if isinstance(ev, WorkerJoined):
            alive[ev.worker_id] = True
        if isinstance(ev, WorkerLost):
            alive[ev.worker_id] = False
            tainted.update(users.get(ev.worker_id, ()))
        if kind != "gen" and rid is not None:
            tainted.add(rid)


def check_log_invariants(events: list[Event]) -> None:
    assert [e.pos for e in events] == list(range(len(events)))
    ended: dict[str, int] = {}
    for ev in events:
        if not isinstance(ev, RequestEvent):
            continue
        assert ev.request_id not in ended, (
            f"{ev.request_id}: {ev!r} stored after its terminal at {ended[ev.request_id]}"
        )
        if isinstance(ev, TERMINAL):
            ended[ev.request_id] = ev.pos


def check_fold(log: EventLog, events: list[Event], k: int) -> None:
    a, b = fold(events), fold(events)
    assert a.digest() == b.digest() == log.state.digest()
    # Snapshot at k, fold the suffix: the same state (and the same worker
    # occupancy, in the same order: decisions iterate it).
    snap = fold(events[:k]).snapshot()
    assert snap.next_pos == k
    resumed = fold(events[k:], snapshot=snap)
    assert resumed.digest() == a.digest()
    assert resumed.next_pos == a.next_pos
    assert (resumed.ended, resumed.audio_samples) == (a.ended, a.audio_samples)
    assert a.ended == [e.request_id for e in events if isinstance(e, TERMINAL)]
    # A snapshot survives encoding (how it would be stored beside the log).
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(snap), type=Snapshot)
    assert fold(events[k:], snapshot=wire).digest() == a.digest()
    for wid in a.workers:
        assert resumed.requests_on(wid) == a.requests_on(wid), wid
    # An old-style snapshot without the occupancy still folds to the same
    # state (the occupancy is rebuilt, live requests only).
    bare = Snapshot(snap.next_pos, snap.requests, snap.workers)
    rebuilt = fold(events[k:], snapshot=bare)
    assert rebuilt.digest() == a.digest()
    for wid in a.workers:
        assert set(rebuilt.requests_on(wid)) == set(a.requests_on(wid)), wid


@PROPS
@given(steps=event_streams(), data=st.data())
def test_memory_log_properties(steps: list[Step], data: st.DataObject) -> None:
    log = MemoryLog(clock=ManualClock())
    drive(log, steps)
    events = list(log.read())
    check_log_invariants(events)
    check_fold(log, events, data.draw(st.integers(0, len(events)), label="snapshot at"))


@settings(PROPS, max_examples=max(EXAMPLES // 3, 10))
@given(steps=event_streams(), data=st.data())
def test_disk_log_properties(steps: list[Step], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = LogConfig(fsync="none", segment_bytes=4096)  # several segments
        with DiskLog(tmp, cfg, clock=ManualClock()) as log:
            drive(log, steps)
            events = list(log.read())
            digest = log.state.digest()
            k = data.draw(st.integers(0, len(events)), label="snapshot at")
            check_fold(log, events, k)
            assert list(log.read(k)) == events[k:]
            by_request: dict[str, list[Event]] = {}
            for ev in events:
                if isinstance(ev, RequestEvent):
                    by_request.setdefault(ev.request_id, []).append(ev)
            for rid, evs in by_request.items():
                assert log.events_for(rid) == evs
        with DiskLog(tmp, cfg, clock=ManualClock()) as again:
            assert again.state.digest() == digest
            assert list(again.read()) == events
        check_log_invariants(events)


@PROPS
@given(steps=event_streams(inject=False))
def test_plausible_streams_are_accepted_whole(steps: list[Step]) -> None:
    log = MemoryLog(clock=ManualClock())
    for step in steps:
        log.append(step.ev)  # raises (and fails) if the model and reducer disagree
    assert len(log) == len(steps)
    # Replaying the stored events into a fresh fold gives the same digest,
    # and so does replaying them one at a time through Fold.apply.
    f = Fold()
    for ev in log.read():
        f.apply(ev)
    assert f.digest() == log.state.digest()


def _fold_one_by_one(events: list[Event]) -> tuple[Fold, str]:
    f = Fold()
    for ev in events:
        try:
            f.apply(ev)
        except IllegalTransition as exc:
            return f, str(exc)
    return f, ""


@PROPS
@given(steps=event_streams(), data=st.data())
def test_bulk_fold_equals_event_by_event_up_to_the_first_illegal_event(
    steps: list[Step], data: st.DataObject
) -> None:
    # The raw stream, injected illegal events included, stamped as a log
    # would (or left unstamped: a fold takes those too, and a zero time
    # keeps a stage's first-chunk stamps open, which bars a run).
    stamped = data.draw(st.booleans(), label="stamped")
    events = [
        msgspec.structs.replace(s.ev, pos=i, ts_ns=1_000 + i) if stamped else s.ev
        for i, s in enumerate(steps)
    ]
    one, error = _fold_one_by_one(events)
    bulk = Fold()
    try:
        bulk.apply_all(events)
        bulk_error = ""
    except IllegalTransition as exc:
        bulk_error = str(exc)
    assert bulk_error == error
    assert bulk.requests == one.requests  # field for field, not only the digest
    assert bulk.workers == one.workers
    assert bulk.next_pos == one.next_pos
    assert bulk.ended == one.ended
    assert bulk.audio_samples == one.audio_samples
    for wid in one.workers:
        assert bulk.requests_on(wid) == one.requests_on(wid), wid
