"""The projection on a log retention releases from: totals never go
backwards, no request is missed while ``run`` follows the log (it records
them right before a ``Released`` drops them), the retention gauges read the
followed ``Retention``, and a standalone projection's private fold does
not keep ended requests' ids."""

from __future__ import annotations

import asyncio

from omnix.events.retention import Retention, RetentionPolicy
from omnix.events.types import RequestSpec
from omnix.telemetry import Telemetry
from omnix.testing.sim import start_sim

from ..orchestrator.conftest import omni_like

SPEC = RequestSpec(prompt="hi", outputs=("text", "audio"))
POLICY = RetentionPolicy(window_s=None, max_requests=2, max_bytes=None)


async def _run(follow: bool) -> tuple[Telemetry, Retention, list[int]]:
    omni, sim = await start_sim(omni_like())
    ret = Retention(omni.log, POLICY, omni.blobs, append=omni.sequencer.append)
    tel = Telemetry.from_env(omni.pipeline, environ={})
    tel.follow_retention(ret)
    task = asyncio.create_task(tel.run(omni.log, interval_s=0)) if follow else None
    seen: list[int] = []
    for _ in range(20):
        omni.submit(SPEC)
        sim.run_until_idle()
        await asyncio.sleep(0)
        if not follow:
            tel.catch_up(omni.log)
        seen.append(tel.projection.requests_ended)
    if task is not None:
        omni.log.close()
        tel.projection.wake()
        await asyncio.wait_for(task, 5)
    return tel, ret, seen


async def test_followed_by_run_every_request_is_recorded() -> None:
    tel, ret, seen = await _run(follow=True)
    assert ret.released_total >= 17
    assert seen == sorted(seen)  # never backwards
    assert tel.projection.requests_ended == 20
    assert tel.projection.ended_missed == 0
    data = tel.metrics_data()
    points = {
        m.name: m.data.data_points[0].value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name.endswith("retained") or ".retained_" in m.name
    }
    assert points["omnix.requests.retained"] == ret.requests_retained <= 2
    assert points["omnix.log.retained_events"] == ret.retained_events > 0
    assert points["omnix.blobs.retained_bytes"] == ret.blobs_retained_bytes
    tel.shutdown()


async def test_polled_after_releases_the_missed_are_counted_not_measured() -> None:
    tel, _ret, seen = await _run(follow=False)
    # catch_up after each request: recorded before its release.
    assert seen == sorted(seen)
    assert tel.projection.requests_ended + tel.projection.ended_missed == 20
    tel.shutdown()


def test_standalone_projection_forgets_ended_ids() -> None:
    from tests.telemetry.scenario import Scenario

    tel = Telemetry.from_env("tiny-omni", environ={})
    for _ in range(3):
        for ev in Scenario().all().log.read():
            tel.observe(ev)
    own = tel.projection._own
    assert own is not None
    assert own.fold.ended == []
    assert own.fold.requests == {}
    assert tel.projection.requests_ended == own.fold.ended_dropped > 0
    tel.shutdown()
