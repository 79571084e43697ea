"""A trace's cross-request window is bounded, and the trace says what was cut.

On a server that is never idle, the last idle point before a request may
be the start of the log.  ``export_trace`` reaches back at most
``max_window`` positions before the first target's admission; requests
live across that start are left out whole, and ``Trace.cut`` says so.
Within the bound (and with nothing released) a trace is whole: ``cut`` is
``None`` and it drives exactly, as before.
"""

from __future__ import annotations

from omnix.events.types import RequestSpec
from omnix.replay.drive import drive
from omnix.testing.sim import start_sim
from omnix.trace import export_trace, read_trace
from omnix.traceview.show import render_timeline

from .conftest import omni_like


async def _never_idle(n: int):
    """``n`` requests, each admitted while the one before it runs."""
    omni, sim = await start_sim(omni_like())
    for k in range(n):
        omni.submit(
            RequestSpec(prompt=f"p{k}", outputs=("text", "audio"), seed=k), request_id=f"r{k}"
        )
        for _ in range(6):
            sim.step()
    sim.run_until_idle()
    return omni


async def test_a_never_idle_log_is_cut_and_the_trace_says_what_was_cut() -> None:
    omni = await _never_idle(12)
    log = omni.log
    last = "r11"
    admitted = log.state.requests[last].admitted_pos
    # Whole: the window reaches back to r0 (never idle).
    whole = read_trace(export_trace(log, omni.blobs, omni.pipeline, [last]))
    assert whole.cut is None
    assert "r0" in whole.request_ids
    assert drive(whole).ok

    # Bounded: 40 positions before r11's admission at most.
    t = read_trace(export_trace(log, omni.blobs, omni.pipeline, [last], max_window=40))
    assert t.cut is not None
    assert t.cut.start == admitted - 40
    assert t.cut.requests, "requests live across the cut are named"
    assert set(t.cut.requests).isdisjoint(t.request_ids)
    assert last in t.request_ids and "r0" not in t.request_ids
    assert len(t.events) < len(whole.events)
    assert "window cut at log position" in t.cut.describe()
    # omnix replay says so in its header (a whole trace says nothing).
    assert f"cut: {t.cut.describe()}" in render_timeline(t)
    assert "cut:" not in render_timeline(whole)
    # It folds and verifies (read_trace checked the digests); the target's
    # own events are all there.
    assert [type(e) for e in t.events_for(last)] == [type(e) for e in log.events_for(last)]
    # Every request in the trace starts with its admission.
    for rid in t.request_ids:
        assert type(t.events_for(rid)[0]).__name__ in ("Admitted", "Rejected")
