"""Scenarios that produce logs to trace and replay (virtual-time simulator).

Each scenario runs a multi-request case of the tiny-omni shape on
``SimRuntime`` and returns the started ``Omni`` (its log, blobs and
pipeline are what ``export_trace`` takes).  They reuse the orchestrator
tests' shapes: queueing, two replicas, cancels, losses, deadlines,
retries.
"""

from __future__ import annotations

import pytest

from omnix.events.types import RequestSpec
from omnix.testing.sim import start_sim
from omnix.trace import export_trace, read_trace

from ..orchestrator.conftest import omni_like

SPEC = RequestSpec(prompt="hi", outputs=("text", "audio"))


def spec(i: int, **kw) -> RequestSpec:
    return RequestSpec(prompt=f"p{i}", outputs=("text", "audio"), seed=i, **kw)


async def busy_two_talkers():
    """Four requests over two talker replicas with retry; a cancel, a
    deadline and a lost talker (the orchestrator tests' byte-identity
    scenario)."""
    cfg = omni_like(talker="replicas = 2\nretry = true")
    omni, sim = await start_sim(cfg)
    for i in range(4):
        omni.submit(spec(i, deadline_ms=60 if i == 3 else 0), request_id=f"r{i}")
    for _ in range(40):
        sim.step()
    omni.cancel("r1")
    for _ in range(15):
        sim.step()
    sim.kill("talker", 0)
    sim.run_until_idle()
    return omni


async def queued_chain():
    """A thinker of capacity 1: r0 runs, r1 and r2 queue behind it; r3 is
    refused; later r4 and r5 arrive while r2 still runs.  Every request's
    placement depends on the ones before it."""
    cfg = omni_like(
        thinker='max_queue = 2\nengine = { kind = "scripted", chunks_per_piece = 6, delay_ms = 2, capacity = 1 }'
    )
    omni, sim = await start_sim(cfg)
    for i in range(4):
        omni.submit(spec(i), request_id=f"r{i}")
    for _ in range(60):
        sim.step()
    for i in (4, 5):
        omni.submit(spec(i), request_id=f"r{i}")
        for _ in range(7):
            sim.step()
    sim.run_until_idle()
    return omni


async def staggered_idle():
    """Requests that overlap in pairs with idle moments between the pairs:
    a trace of one pair must not include the others."""
    cfg = omni_like()
    omni, sim = await start_sim(cfg)
    for k in range(3):
        omni.submit(spec(2 * k), request_id=f"r{2 * k}")
        for _ in range(5):
            sim.step()
        omni.submit(spec(2 * k + 1), request_id=f"r{2 * k + 1}")
        sim.run_until_idle()
    return omni


async def retry_and_failures():
    """Two thinker replicas with retry: a loss before output retries; a
    scripted failure on the talker fails another request; a stage timeout."""
    cfg = omni_like(
        thinker="replicas = 2\nretry = true",
        talker='timeout_s = 0.5\nengine = { kind = "scripted", chunks_per_piece = 3, delay_ms = 1, output_modality = "codec", fail_at = 7 }',
    )
    omni, sim = await start_sim(cfg)
    omni.submit(spec(0), request_id="r0")
    omni.submit(spec(1), request_id="r1")
    sim.step()
    sim.kill("thinker", 0)
    omni.submit(spec(2, deadline_ms=15), request_id="r2")
    sim.run_until_idle()
    return omni


SCENARIOS = {
    "busy_two_talkers": busy_two_talkers,
    "queued_chain": queued_chain,
    "staggered_idle": staggered_idle,
    "retry_and_failures": retry_and_failures,
}


def trace_of(omni, request_ids):
    return read_trace(export_trace(omni.log, omni.blobs, omni.pipeline, request_ids))


@pytest.fixture
async def busy():
    return await busy_two_talkers()
