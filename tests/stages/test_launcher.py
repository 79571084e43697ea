"""The ``Launcher`` interface under the default placement (``Spawner``):
what scaling asks of it.  A replica stopped for good (``stop``) loses its
process and is not restarted; ``spawn`` brings it back.  The Ray launcher's
side is ``test_ray_placement.test_a_replica_stopped_for_good_and_started_again_comes_back``."""

from __future__ import annotations

import pytest

from omnix.events.types import WorkerJoined
from omnix.pipelines.config import ScriptedArgs
from omnix.stages.launcher import Launcher
from omnix.stages.spawner import Spawner

from ..waiting import wait_until
from .conftest import pid_alive, scripted_pipeline

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_spawned_replica_stopped_for_good_is_not_restarted_and_spawn_brings_it_back(
    harness_factory,
):
    h = harness_factory(scripted_pipeline(text=(ScriptedArgs(), 2)))
    await h.rt.start()
    launcher: Launcher = h.rt._spawner
    assert isinstance(launcher, Spawner)
    slot = h.rt._slots.get("text", 1)
    pid = slot.pid
    h.rt._lose(slot, "scaled down", restart=False)
    launcher.stop(slot)
    await wait_until(lambda: not pid_alive(pid), "text/1's process gone", timeout=5)
    assert slot.state == "down" and slot.restart_handle is None
    assert h.rt.ready_replicas("text") == 1
    launcher.spawn(slot)
    await h.wait_for(lambda: h.rt.ready_replicas("text") == 2, what="text/1 back")
    joined = [e.worker_id for e in h.of(WorkerJoined)]
    assert joined.count("text/1") == 2 and slot.pid != pid
