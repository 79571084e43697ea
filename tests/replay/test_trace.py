"""The trace format: deterministic export, the cross-request closure, and
refusal of damaged or foreign files with errors that say what is wrong."""

from __future__ import annotations

import msgspec
import pytest

from omnix.events.codec import decode_events, encode_events
from omnix.events.types import Chunk, RequestEvent, Routed, WorkerJoined, WorkerLost
from omnix.orchestrator.decide import RULES_VERSION
from omnix.replay.drive import Divergence, drive
from omnix.trace import (
    TRACE_FORMAT_VERSION,
    TRACE_MAGIC,
    Trace,
    TraceCorrupt,
    TraceError,
    TraceFile,
    export_trace,
    read_trace,
)

from .conftest import SCENARIOS, queued_chain, staggered_idle, trace_of

_PREFIX = 10  # magic (8) + u16 format version


def _body(data: bytes) -> TraceFile:
    return msgspec.msgpack.decode(data[_PREFIX:], type=TraceFile)


def _rewrite(data: bytes, **changes) -> bytes:
    return data[:_PREFIX] + msgspec.msgpack.encode(msgspec.structs.replace(_body(data), **changes))


async def test_export_is_deterministic_and_ignores_id_order(busy):
    a = export_trace(busy.log, busy.blobs, busy.pipeline, ["r2", "r0"])
    b = export_trace(busy.log, busy.blobs, busy.pipeline, ["r0", "r2", "r0"])
    assert a == b
    assert a[:8] == TRACE_MAGIC
    t = read_trace(a)
    assert t.targets == ("r0", "r2")
    assert t.format_version == TRACE_FORMAT_VERSION and t.rules_version == RULES_VERSION
    assert t.pipeline == busy.pipeline


async def test_trace_carries_what_replay_needs(busy):
    t = trace_of(busy, ["r3"])
    assert [ev.pos for ev in t.events] == list(range(len(t.events)))
    assert t.digest == t.fold().digest()
    # Every blob a chunk references travels in the trace.
    refs = {ev.blob.digest for ev in t.events if isinstance(ev, Chunk) and ev.blob is not None}
    assert refs and refs == set(t.blobs.digests())
    for d in refs:
        assert t.blobs.get(d) == busy.blobs.get(d)
    # Every position reference points into the trace, at the right event.
    for ev in t.events:
        if isinstance(ev, Routed):
            for s in ev.sources:
                assert t.events[s].request_id == ev.request_id
            assert 0 <= ev.cause < ev.pos


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_a_trace_of_any_one_request_drives_with_zero_divergence(scenario):
    omni = await SCENARIOS[scenario]()
    for rid in omni.log.state.requests:
        t = trace_of(omni, [rid])
        res = drive(t)
        assert res.ok and res.events == len(t.events)
        # The target's own events are exactly the log's, renumbered.
        src = [ev for ev in omni.log.events_for(rid)]
        got = t.events_for(rid)
        assert [type(e) for e in got] == [type(e) for e in src]
        assert [t.source_pos(e.pos) for e in got] == [e.pos for e in src]


async def test_idle_points_bound_the_window():
    omni = await staggered_idle()
    t = trace_of(omni, ["r3"])
    assert set(t.request_ids) == {"r2", "r3"}
    # Worker events before the window come along (renumbered to the front).
    assert all(isinstance(ev, WorkerJoined) for ev in t.events[:3])
    assert t.origin[0] == (0, 3) and t.origin[1][0] > 3
    assert drive(t).ok


def _shallow(omni, rid: str) -> Trace:
    """The one-level closure: requests live while ``rid`` is, from their
    admission; worker events; renumbered.  Not what export does."""
    st = omni.log.state
    me = st.requests[rid]
    a, z = me.admitted_pos, me.terminal_pos
    live = {
        r
        for r, rs in st.requests.items()
        if (rs.admitted_pos if rs.admitted_pos >= 0 else rs.terminal_pos) <= z
        and (rs.terminal_pos < 0 or rs.terminal_pos >= a)
    }
    keep = [
        ev
        for ev in omni.log.read(0, z + 1)
        if isinstance(ev, (WorkerJoined, WorkerLost))
        or (isinstance(ev, RequestEvent) and ev.request_id in live)
    ]
    new = {ev.pos: i for i, ev in enumerate(keep)}
    out = []
    for ev in keep:
        kw = {"pos": new[ev.pos]}
        if hasattr(ev, "cause") and ev.cause >= 0:
            kw["cause"] = new.get(ev.cause, -1)  # a cause outside: lost
        if isinstance(ev, Routed):
            kw["sources"] = tuple(new[s] for s in ev.sources)
        out.append(msgspec.structs.replace(ev, **kw))
    events = decode_events(encode_events(out))
    t = Trace(
        events=events,
        blobs=omni.blobs,
        pipeline=omni.pipeline,
        format_version=1,
        omnix_version="test",
        schema_version=1,
        rules_version=1,
        targets=(rid,),
        digest="",
        request_digests={},
        source="<shallow>",
    )
    return t


async def test_the_closure_is_transitive_and_needs_to_be():
    omni = await queued_chain()
    # r4 arrives after r0 and r1 have ended, while r2 (queued behind them)
    # still runs.  Its trace reaches back to r0: r2's placement depended on
    # r0 and r1 holding the thinker's only slot.
    st = omni.log.state.requests
    assert st["r1"].terminal_pos < st["r4"].admitted_pos < st["r2"].terminal_pos
    full = trace_of(omni, ["r4"])
    assert {"r0", "r1", "r2", "r4"} <= set(full.request_ids)
    assert drive(full).ok
    # The one-level closure (r2, r4, r5 only) does not reproduce the run.
    shallow = _shallow(omni, "r4")
    assert "r0" not in shallow.request_ids
    with pytest.raises(Divergence):
        drive(shallow)


async def test_whole_log_export(busy):
    t = read_trace(export_trace(busy.log, busy.blobs, busy.pipeline, None))
    assert len(t.events) == busy.log.next_pos and t.targets == ()
    assert t.digest == busy.log.state.digest()
    assert drive(t).ok


async def test_unknown_request_is_refused_by_name(busy):
    with pytest.raises(TraceError, match="request 'nope' is not in this log"):
        export_trace(busy.log, busy.blobs, busy.pipeline, ["nope"])
    with pytest.raises(TraceError, match="no request ids"):
        export_trace(busy.log, busy.blobs, busy.pipeline, [])


async def test_missing_blob_is_refused(busy):
    from omnix.events.blobs import MemoryBlobStore

    with pytest.raises(TraceError, match="not in the blob store"):
        export_trace(busy.log, MemoryBlobStore(), busy.pipeline, ["r3"])


async def test_a_tampered_event_is_caught_and_named(busy):
    data = export_trace(busy.log, busy.blobs, busy.pipeline, ["r3"])
    events = decode_events(_body(data).events)
    i = next(
        k
        for k, ev in enumerate(events)
        if isinstance(ev, Chunk) and ev.request_id == "r3" and ev.text
    )
    events[i] = msgspec.structs.replace(events[i], ts_ns=events[i].ts_ns + 1)
    bad = _rewrite(data, events=encode_events(events))
    with pytest.raises(TraceCorrupt, match=r"state digest mismatch.*request\(s\) r3 differs"):
        read_trace(bad)
    # An edit that makes the log illegal is named by position.
    events[i] = msgspec.structs.replace(events[i], index=99)
    with pytest.raises(TraceCorrupt, match=rf"event {i} does not fold.*chunk index 99"):
        read_trace(_rewrite(data, events=encode_events(events)))
    # verify=False reads it anyway (for forensics).
    assert read_trace(bad, verify=False).events[i].ts_ns == events[i].ts_ns


async def test_a_tampered_blob_is_caught(busy):
    data = export_trace(busy.log, busy.blobs, busy.pipeline, ["r3"])
    blobs = dict(_body(data).blobs)
    k = next(iter(blobs))
    blobs[k] = blobs[k][:-1] + b"\x00"
    with pytest.raises(TraceCorrupt, match=f"blob {k} does not hash"):
        read_trace(_rewrite(data, blobs=blobs))


def test_not_a_trace_and_newer_formats_are_refused(tmp_path):
    with pytest.raises(TraceError, match="not an omnix trace"):
        read_trace(b"PK\x03\x04 a zip file")
    with pytest.raises(TraceError, match="no such trace file"):
        read_trace(tmp_path / "missing.trace")
    newer = TRACE_MAGIC + (TRACE_FORMAT_VERSION + 1).to_bytes(2, "little") + b"\x90"
    with pytest.raises(TraceError, match="upgrade omnix"):
        read_trace(newer)
    with pytest.raises(TraceCorrupt, match="damaged"):
        read_trace(TRACE_MAGIC + (1).to_bytes(2, "little") + b"\xc1garbage")
