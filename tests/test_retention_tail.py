"""A reader of a request that retention releases ends instead of waiting
forever (a client slower than the window, a batch member read after its
sibling), and ``Omni.request_status`` answers retained/released/unknown."""

from __future__ import annotations

import asyncio

from omnix.events.retention import Retention, RetentionPolicy
from omnix.events.types import RequestSpec
from omnix.testing.sim import start_sim

from .orchestrator.conftest import omni_like
from .waiting import wait_until

SPEC = RequestSpec(prompt="hi", outputs=("text",))


async def test_a_tail_of_a_released_request_ends() -> None:
    omni, sim = await start_sim(omni_like())
    log = omni.log
    Retention(
        log,
        RetentionPolicy(window_s=None, max_requests=1, max_bytes=None),
        append=omni.sequencer.append,
    )
    first = omni.submit(SPEC, request_id="r0")
    sim.run_until_idle()
    assert log.state.requests["r0"].terminal

    # A raw tail of r0 (it waits past the terminal event for more).
    seen: list[int] = []

    async def read() -> None:
        async for ev in log.tail(0, request_id="r0"):
            seen.append(ev.pos)

    reader = asyncio.create_task(read())
    await asyncio.sleep(0)
    assert seen and seen[0] == first.pos and not reader.done()
    for k in (1, 2):  # two more ended: r0 is released
        omni.submit(SPEC, request_id=f"r{k}")
        sim.run_until_idle()
    assert "r0" not in log.state.requests
    await asyncio.wait_for(reader, 1)

    # Released before the tail starts: it ends at once, empty.
    late = [ev async for ev in log.tail(0, request_id="r0")]
    assert late == []
    assert omni.request_status("r0") == "unknown"  # Omni's own retention is off here
    await omni.shutdown(grace_s=0)


async def test_request_status() -> None:
    from omnix.api import Omni
    from omnix.testing.serving import InProcessRuntime

    cfg = omni_like()
    omni = Omni(
        cfg,
        runtime_factory=InProcessRuntime,
        retention=RetentionPolicy(window_s=None, max_requests=1, max_bytes=None),
    )
    await omni.start()
    try:
        await wait_until(lambda: all(omni.ready().values()), "ready replicas")
        for k in range(3):
            await omni.generate(SPEC, request_id=f"s{k}")
        assert omni.request_status("s0") == "released"
        assert omni.request_status("s2") == "retained"
        assert omni.request_status("nope") == "unknown"
    finally:
        await omni.shutdown(grace_s=0)
