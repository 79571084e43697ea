"""Schema v8: ``Scaled``, a stage's replica started, drained or gone after
its drain.  Records of v7 and older read as before (v8 appended a member
to the union); the fold takes a replica that left as no longer alive,
refuses one that leaves while it runs a request, and keeps the positions
the scaler's state rests on across a snapshot."""

from __future__ import annotations

import pytest

from omnix.events.codec import decode_event, decode_events, encode_event, encode_events
from omnix.events.reducer import Fold, IllegalTransition
from omnix.events.types import (
    SCHEMA_VERSION,
    Admitted,
    RequestSpec,
    Routed,
    Scaled,
    WorkerJoined,
    is_decision,
)


def _joined(pos: int, replica: int) -> WorkerJoined:
    return WorkerJoined(
        pos=pos,
        worker_id=f"s/{replica}",
        stage="s",
        replica=replica,
        engine="scripted",
        capacity=1,
    )


def test_scaled_round_trips_and_is_a_decision_only_with_a_cause() -> None:
    evs = [
        Scaled(
            pos=3, ts_ns=5, stage="s", replica=1, op="start", replicas=2, reason="queue", cause=2
        ),
        Scaled(pos=4, ts_ns=6, stage="s", replica=1, op="drain", replicas=1, reason="admin"),
        Scaled(pos=5, ts_ns=7, stage="s", replica=1, op="left", replicas=-1, reason="drained"),
    ]
    data = encode_event(evs[0])
    assert data[0] == SCHEMA_VERSION == 15
    assert decode_event(data) == evs[0]
    assert decode_events(encode_events(evs)) == evs
    assert [is_decision(ev) for ev in evs] == [True, False, False]


def test_a_replica_leaves_only_when_it_runs_nothing() -> None:
    f = Fold()
    f.apply(_joined(0, 0))
    f.apply(Admitted(pos=1, request_id="r", pipeline="p", spec=RequestSpec(prompt="x")))
    f.apply(Routed(pos=2, request_id="r", stage="s", replica=0, seq=0, sources=(1,), last=True))
    left = Scaled(pos=3, stage="s", replica=0, op="left", replicas=-1, reason="drained")
    with pytest.raises(IllegalTransition, match="still runs r"):
        f.apply(left)
    assert f.workers["s/0"].alive
    never = Scaled(pos=3, stage="s", replica=5, op="left", replicas=-1, reason="drained")
    with pytest.raises(IllegalTransition, match="not joined"):
        f.apply(never)


def test_a_replica_that_left_is_not_alive_and_may_join_again() -> None:
    f = Fold()
    f.apply(_joined(0, 0))
    f.apply(Scaled(pos=1, stage="s", replica=0, op="drain", replicas=0, reason="admin"))
    f.apply(Scaled(pos=2, stage="s", replica=0, op="left", replicas=-1, reason="drained"))
    ws = f.workers["s/0"]
    assert not ws.alive and ws.lost_pos == 2 and ws.lost_reason == "left"
    assert f.scaled == {"s/0": (1, 2)}
    f.apply(Scaled(pos=3, stage="s", replica=0, op="start", replicas=1, reason="admin"))
    f.apply(_joined(4, 0))
    assert f.workers["s/0"].alive and f.workers["s/0"].incarnation == 2
    assert f.scaled == {"s/0": (3,)}
    again = Fold(f.snapshot())
    assert again.scaled == f.scaled and again.digest() == f.digest()
