"""Scaling with real worker processes: a stage with ``replicas = {min,
max}`` scales up under load and down (by hand while requests run, and by
its idle rule), and nothing is lost: every request finishes with exactly
one terminal event, a drained replica leaves (``Scaled(left)``, its
worker exited) and is never recorded lost, and the log replays with zero
divergence."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from omnix.api import Omni
from omnix.events.types import TERMINAL_TYPES, Finished, RequestSpec, Routed, Scaled, WorkerJoined
from omnix.replay.drive import drive
from omnix.stages.errors import RuntimeConfigError
from omnix.stages.options import RuntimeOptions
from omnix.stages.runtime import StageRuntime
from omnix.testing.pipelines import scripted_omni
from omnix.trace import export_trace, read_trace

SPEC = RequestSpec(prompt="hi", outputs=("text", "audio"))
TALKER = (
    'engine = { kind = "scripted", chunks_per_piece = 6, delay_ms = 40, '
    'output_modality = "codec", capacity = 1 }'
)
CFG = scripted_omni(
    "scale-omni",
    talker="replicas = { min = 1, max = 3, up_after = 2, down_after_s = 0.4 }\n" + TALKER,
)
#: scaled by hand only (its rules would take minutes to act)
BY_HAND = scripted_omni(
    "scale-omni",
    talker="replicas = { min = 1, max = 3, up_after = 1000, down_after_s = 600 }\n" + TALKER,
)


async def until(pred, timeout: float = 30.0, what: str = "") -> None:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def scaled(omni: Omni) -> list[Scaled]:
    return [ev for ev in omni.log.read() if type(ev) is Scaled]


def joined(omni: Omni, wid: str) -> bool:
    ws = omni.log.state.workers.get(wid)
    return ws is not None and ws.alive


def each_drain_leaves(events: list, down_after_s: float) -> None:
    """Every drain, not only the first: the replica takes no new request
    after it and leaves once (``Scaled(left)``) before it starts again;
    an idle drain comes ``down_after_s`` of log time after the stage's
    previous start or drain."""
    changes = [e for e in events if type(e) is Scaled and e.op in ("start", "drain")]
    for d in (e for e in events if type(e) is Scaled and e.op == "drain"):
        after = events[d.pos + 1 :]
        restart = next(
            (
                e.pos
                for e in after
                if type(e) is Scaled and e.op == "start" and e.replica == d.replica
            ),
            len(events),
        )
        window = events[d.pos + 1 : restart]
        left = [
            e for e in window if type(e) is Scaled and e.op == "left" and e.replica == d.replica
        ]
        assert len(left) == 1 and left[0].reason == "drained", (d, left)
        assert not [
            e
            for e in window
            if type(e) is Routed and e.stage == d.stage and e.replica == d.replica and e.seq == 0
        ], f"new work went to draining {d.stage}/{d.replica}"
        if d.reason == "idle":
            prev = [e for e in changes if e.stage == d.stage and e.pos < d.pos][-1]
            assert d.ts_ns - prev.ts_ns >= down_after_s * 1e9, (d, prev)


@pytest.mark.timeout(90)
async def test_scale_up_and_down_under_load_loses_nothing():
    async with Omni(CFG) as omni:
        rt = omni.runtime
        assert isinstance(rt, StageRuntime)
        assert omni.ready()["talker"] == 1  # it starts with min
        wave1 = [asyncio.create_task(omni.generate(SPEC)) for _ in range(10)]
        await until(lambda: joined(omni, "talker/2"), what="talker/2 to join")
        starts = [ev for ev in scaled(omni) if ev.op == "start"]
        assert [(e.replica, e.reason) for e in starts] == [(1, "queue"), (2, "queue")]
        # Both new replicas take requests; then the admin drains them while
        # they still run some.
        await until(
            lambda: (
                {e.replica for e in omni.log.read() if type(e) is Routed and e.stage == "talker"}
                == {0, 1, 2}
            ),
            what="work on every replica",
        )
        busy = [r for r in (1, 2) if rt.in_flight("talker", r)]
        assert busy, "the drain should find a replica with a request"
        drains = omni.scale("talker", 1)
        assert [(e.replica, e.op, e.reason) for e in drains] == [
            (2, "drain", "admin"),
            (1, "drain", "admin"),
        ]
        results = await asyncio.gather(*wave1)
        assert all(r.status == "finished" for r in results)
        # Both leave (on a loaded machine the queue may start one again
        # before the wave ends, and it leaves again later: at least both).
        await until(
            lambda: {e.replica for e in scaled(omni) if e.op == "left"} >= {1, 2},
            timeout=60.0,
            what="both to leave",
        )
        for rep in (1, 2):
            proc = rt._slots.get("talker", rep).proc
            assert proc is not None
            await until(lambda p=proc: p.poll() is not None, what=f"talker/{rep}'s process to exit")
            assert proc.returncode == 0, proc.describe_exit()
        # A second wave scales up again; once idle, the sweep drains by the clock.
        wave2 = [asyncio.create_task(omni.generate(SPEC)) for _ in range(8)]
        results += await asyncio.gather(*wave2)
        await until(
            lambda: (
                omni.orchestrator.scaler.members("talker") == (0,)
                and not omni.orchestrator.scaler.draining("talker")
            ),
            what="the idle drain",
        )
        events = list(omni.log.read())
    assert len(results) == 18 and all(r.status == "finished" for r in results)
    # Nothing lost before shutdown; every request one terminal event.
    shutdown_at = next((e.pos for e in events if type(e).__name__ == "WorkerLost"), len(events))
    assert all(type(e) is not Routed or e.resume == 0 for e in events)
    assert [e for e in events[:shutdown_at] if type(e).__name__ == "WorkerLost"] == []
    for rid in {e.request_id for e in events if type(e) is Finished}:
        ends = [e for e in omni.log.events_for(rid) if isinstance(e, TERMINAL_TYPES)]
        assert len(ends) == 1 and type(ends[0]) is Finished
    ops = [(e.op, e.reason) for e in events if type(e) is Scaled]
    assert ("drain", "idle") in ops and ops.count(("left", "drained")) >= 3
    each_drain_leaves(events, down_after_s=0.4)
    rejoined = [e for e in events if type(e) is WorkerJoined and e.worker_id == "talker/1"]
    assert len(rejoined) >= 2  # the same replica index comes back after it left
    trace = read_trace(export_trace(omni.log, omni.blobs, omni.pipeline, None))
    assert drive(trace).ok


def test_a_stage_that_scales_is_started_by_the_server():
    with pytest.raises(RuntimeConfigError, match="started by hand"):
        StageRuntime(
            CFG,
            lambda ev: None,
            None,  # type: ignore[arg-type]
            RuntimeOptions(spawn=["thinker", "code2wav"]),
        )


@pytest.mark.timeout(60)
async def test_a_draining_replica_killed_mid_request_is_lost_not_restarted():
    async with Omni(BY_HAND) as omni:
        rt = omni.runtime
        assert isinstance(rt, StageRuntime)
        omni.scale("talker", 2)
        await until(lambda: joined(omni, "talker/1"), what="talker/1 to join")
        tasks = [asyncio.create_task(omni.generate(SPEC)) for _ in range(4)]
        await until(lambda: rt.in_flight("talker", 1) > 0, what="a request on talker/1")
        (drain,) = omni.scale("talker", 1)
        assert drain.replica == 1
        proc = rt._slots.get("talker", 1).proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGKILL)
        results = await asyncio.gather(*tasks)
        assert all(r.status == "finished" for r in results)  # it moved to talker/0
        await asyncio.sleep(0.5)  # a restart would come within it
        events = list(omni.log.read())
    lost = [e for e in events if type(e).__name__ == "WorkerLost" and e.worker_id == "talker/1"]
    assert len(lost) == 1 and "SIGKILL" in lost[0].reason
    assert not [e for e in events if type(e) is Scaled and e.op == "left"]
    assert len([e for e in events if type(e) is WorkerJoined and e.worker_id == "talker/1"]) == 1
    # Its request went on on talker/0 (a continuation: Routed seq 0 again).
    killed_at = lost[0].pos
    again = [
        e for e in events[killed_at:] if type(e) is Routed and e.stage == "talker" and e.seq == 0
    ]
    assert again and all(e.replica == 0 for e in again)
