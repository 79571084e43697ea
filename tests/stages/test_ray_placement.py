"""``placement="ray"``: each replica a Ray actor on a real multi-node Ray
cluster on this machine (loopback only), scripted engines.

One cluster for the session (``conftest.ray_cluster``; Ray's start is
slow): a head with no CPU, a node offering ``thinker_node`` and two
offering ``decoder_node``.  The
two-stage pipeline pins each stage to its nodes by those resources.  The
claims: each actor runs where its resources are; a worker killed with
SIGKILL mid-request, and separately the node it runs on lost mid-request,
leave the request's output exactly the undisturbed one (the log records the
loss, the request migrates), and Ray, not omnix, restarts the replica
where the resources are; a stage no node can hold is an error at start
naming it and what is missing; and a process on the cluster without the
worker token is refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import ray

from omnix.api import Omni, RequestResult
from omnix.events.types import RequestSpec, Scaled, WorkerJoined, WorkerLost
from omnix.pipelines.validate import parse_pipeline
from omnix.stages.errors import RuntimeConfigError
from omnix.stages.options import RuntimeOptions
from omnix.stages.worker_process import EXIT_REFUSED
from omnix.testing.pipelines import ray_two_stages_toml
from omnix.testing.ray_cluster import add_node, lose_node

pytestmark = pytest.mark.asyncio(loop_scope="session")

SPEC = RequestSpec(prompt="hi", outputs=("text", "audio"))


def pipeline(decoder: str = "decoder_node", replicas: int = 1):
    return parse_pipeline(ray_two_stages_toml(decoder, replicas))


def ray_omni(cluster, cfg=None, **options) -> Omni:
    base = RuntimeOptions(
        placement="ray",
        ray_address=cluster.address,
        start_timeout_s=60.0,
        forward_worker_output=False,
    )
    return Omni(cfg or pipeline(), runtime_options=dataclasses.replace(base, **options))


def node_resources(node_id: str) -> dict[str, float]:
    return next(n["Resources"] for n in ray.nodes() if n["NodeID"] == node_id)


async def until_ready(omni: Omni, timeout: float = 60.0) -> None:  # noqa: ASYNC109
    want = {st.name: st.replicas for st in omni.pipeline.stages}
    async with asyncio.timeout(timeout):
        while omni.ready() != want:  # noqa: ASYNC110 (Omni offers no readiness event)
            await asyncio.sleep(0.05)


def same_output(a: RequestResult, b: RequestResult) -> bool:
    return (
        a.status == b.status == "finished"
        and a.text == b.text
        and a.audio is not None
        and b.audio is not None
        and np.array_equal(a.audio, b.audio)
    )


async def test_each_stage_runs_as_a_named_actor_on_the_node_that_offers_its_resources(ray_cluster):
    async with ray_omni(ray_cluster) as omni:
        await omni.wait_ready(60)
        rt = omni.runtime
        launcher = rt._ray
        for stage, label in (("thinker", "thinker_node"), ("decoder", "decoder_node")):
            where = await launcher.where(stage, 0)
            assert label in node_resources(str(where["node_id"])), (stage, where)
            # The named actor in the server's namespace; its worker is the
            # actor's child, the ordinary worker process.
            actor = ray.get_actor(f"omnix-{stage}-0", namespace=launcher.namespace)
            assert ray.get(actor.where.remote())["worker_pid"] == where["worker_pid"]
            assert _parent(int(where["worker_pid"])) == where["actor_pid"]
        assert rt._spawner.procs == []  # omnix started no process of its own
        assert rt.endpoint.startswith("tcp://127.0.0.1:")
        result = await omni.generate(SPEC)
        assert result.status == "finished" and result.audio is not None


@pytest.mark.parametrize("victim", ["worker_pid", "actor_pid"])
async def test_a_worker_killed_mid_request_is_restarted_by_ray_and_the_request_completes_unchanged(
    ray_cluster, victim
):
    # The worker process, or the actor process that runs it (the worker
    # then exits too: it watches its parent).
    async with ray_omni(ray_cluster) as omni:
        await omni.wait_ready(60)
        launcher = omni.runtime._ray
        undisturbed = await omni.generate(SPEC)
        before = await launcher.where("decoder", 0)
        omni.submit(SPEC, request_id="r-kill")
        await running_on(omni, "r-kill", "decoder")
        os.kill(int(before[victim]), signal.SIGKILL)
        assert same_output(await omni.collect("r-kill"), undisturbed)
        await until_ready(omni)
        after = await launcher.where("decoder", 0)
        # Ray restarted the actor (a new actor process) on a node that
        # offers the stage's resource; omnix started nothing itself.
        assert after["actor_pid"] != before["actor_pid"]
        assert "decoder_node" in node_resources(str(after["node_id"]))
        assert omni.runtime._spawner.procs == []
        lost = [e for e in omni.log.read() if isinstance(e, WorkerLost)]
        assert [e.worker_id for e in lost] == ["decoder/0"]
        joined = [e.worker_id for e in omni.log.read() if isinstance(e, WorkerJoined)]
        assert joined.count("decoder/0") == 2


async def test_a_node_lost_mid_request_moves_its_replica_to_another_node_and_the_request_completes(
    ray_cluster,
):
    async with ray_omni(ray_cluster) as omni:
        await omni.wait_ready(60)
        launcher = omni.runtime._ray
        undisturbed = await omni.generate(SPEC)
        before = await launcher.where("decoder", 0)
        flights = [f"r-node-{i}" for i in range(3)]
        for rid in flights:
            omni.submit(SPEC, request_id=rid)
        for rid in flights:
            await running_on(omni, rid, "decoder")
        lose_node(
            ray_cluster,
            str(before["node_id"]),
            [int(before["actor_pid"]), int(before["worker_pid"])],
        )
        try:
            for rid in flights:  # every request in flight completes, unchanged
                assert same_output(await omni.collect(rid), undisturbed), rid
            await until_ready(omni)
            after = await launcher.where("decoder", 0)
            assert after["node_id"] != before["node_id"]
            assert "decoder_node" in node_resources(str(after["node_id"]))
            assert any(
                isinstance(e, WorkerLost) and e.worker_id == "decoder/0" for e in omni.log.read()
            )
        finally:
            add_node(ray_cluster, {"decoder_node": 1})  # for the tests after this one


async def test_a_cluster_that_does_not_answer_is_an_error_in_seconds(ray_cluster):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(RuntimeConfigError) as exc:
        ray_omni(ray_cluster, ray_address=f"127.0.0.1:{port}")
    assert f"127.0.0.1:{port}" in str(exc.value) and "does not answer" in str(exc.value)
    assert time.monotonic() - t0 < 10


async def test_a_stage_no_node_can_hold_is_an_error_at_start_naming_it(ray_cluster):
    t0 = time.monotonic()
    with pytest.raises(RuntimeConfigError) as missing:
        ray_omni(ray_cluster, pipeline(decoder="tpu_node"))
    text = str(missing.value)
    assert "stage 'decoder'" in text and "no node offers tpu_node" in text, text
    # More replicas than the nodes that offer the resource can hold.
    with pytest.raises(RuntimeConfigError) as room:
        ray_omni(ray_cluster, pipeline(replicas=3))
    assert "stage 'decoder' starts 3 replicas" in str(room.value) and "hold 2" in str(room.value)
    assert time.monotonic() - t0 < 30  # an answer, not Ray's pending-forever


async def test_a_process_on_the_cluster_without_the_worker_token_is_refused(ray_cluster):
    async with ray_omni(ray_cluster) as omni:
        await omni.wait_ready(60)
        endpoint = omni.runtime.endpoint
        assert omni.runtime.worker_token  # made up when none was given

        @ray.remote(num_cpus=0, resources={"decoder_node": 0.01})
        def join_without_token(endpoint: str) -> tuple[int, str]:
            env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIX_WORKER")}
            argv = [sys.executable, "-m", "omnix.stages.worker_cli", "--connect", endpoint]
            done = subprocess.run(
                [*argv, "--stage", "decoder", "--reconnect-for", "0"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            return done.returncode, done.stderr

        code, err = await asyncio.wrap_future(join_without_token.remote(endpoint).future())
        assert code == EXIT_REFUSED, err
        assert "requires a worker token" in err
        assert omni.ready() == {"thinker": 1, "decoder": 1}


async def running_on(
    omni: Omni,
    rid: str,
    stage: str,
    chunks: int = 2,
    timeout: float = 30.0,  # noqa: ASYNC109
) -> None:
    """Wait until ``rid`` has ``chunks`` outputs of ``stage``: a kill lands mid-request."""
    async with asyncio.timeout(timeout):
        while True:
            st = omni.state(rid)
            if st is not None and (s := st.stage(stage)) is not None and s.chunks >= chunks:
                return
            await asyncio.sleep(0.01)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


async def test_a_stage_asking_for_gpus_gets_its_own_cuda_visible_devices_from_ray(ray_cluster):
    # Ray counts GPUs a node declares (none are used here: scripted engines).
    add_node(ray_cluster, {"gpu_node": 1}, num_gpus=2)
    cfg = parse_pipeline(
        ray_two_stages_toml().replace(
            "{ num_cpus = 0.5, resources = { thinker_node = 1 } }",
            "{ num_cpus = 0.5, num_gpus = 1, resources = { gpu_node = 1 } }",
        )
    )
    async with ray_omni(ray_cluster, cfg) as omni:
        await omni.wait_ready(60)
        where = await omni.runtime._ray.where("thinker", 0)
        seen = _environ(int(where["worker_pid"])).get("CUDA_VISIBLE_DEVICES")
        assert seen in ("0", "1") and seen == where["cuda_visible_devices"], (seen, where)


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv]
    return {k.decode(): v.decode() for k, v in pairs}


async def test_a_replica_stopped_for_good_and_started_again_comes_back(ray_cluster):
    """What scaling down then up asks of the launcher (``Launcher.stop``,
    then ``spawn``): under Ray, the actor ends without a restart, and a new
    one under the same name takes the replica again."""
    async with ray_omni(ray_cluster) as omni:
        await omni.wait_ready(60)
        rt = omni.runtime
        slot = rt._slots.get("decoder", 0)
        before = await rt._ray.where("decoder", 0)
        rt._lose(slot, "scaled down", restart=False)
        rt._spawner.stop(slot)
        async with asyncio.timeout(30):
            while _alive(int(before["actor_pid"])) or _alive(int(before["worker_pid"])):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        assert omni.ready() == {"thinker": 1, "decoder": 0}
        rt._spawner.spawn(slot)  # at once: the old name may still be held
        await until_ready(omni)
        after = await rt._ray.where("decoder", 0)
        assert after["actor_pid"] != before["actor_pid"]
        assert (await omni.generate(SPEC)).status == "finished"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_a_stage_scaled_up_and_down_under_ray_loses_nothing(ray_cluster):
    # Scaled by hand only (the queue rule would need 1000 samples in a row).
    cfg = parse_pipeline(ray_two_stages_toml(replicas="{ min = 1, max = 2, up_after = 1000 }"))
    async with ray_omni(ray_cluster, cfg) as omni:
        await omni.wait_ready(60)
        undisturbed = await omni.generate(SPEC)
        first = [omni.submit(SPEC, request_id=f"r-up-{i}").request_id for i in range(3)]
        await omni.set_replicas("decoder", 2)
        async with asyncio.timeout(60):
            while omni.ready()["decoder"] < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        # The added replica is a Ray actor on a node that offers the resource.
        added = await omni.runtime._ray.where("decoder", 1)
        assert "decoder_node" in node_resources(str(added["node_id"]))
        second = [omni.submit(SPEC, request_id=f"r-down-{i}").request_id for i in range(3)]
        await omni.set_replicas("decoder", 1)  # drains replica 1 under load
        for rid in first + second:
            assert same_output(await omni.collect(rid), undisturbed), rid
        async with asyncio.timeout(30):
            while not any(  # noqa: ASYNC110
                isinstance(e, Scaled) and e.op == "left" for e in omni.log.read()
            ):
                await asyncio.sleep(0.05)
        assert not [e for e in omni.log.read() if isinstance(e, WorkerLost)]
