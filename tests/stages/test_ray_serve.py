"""``omnix serve --placement ray`` as an operator runs it: the flag (here
from a ``--config`` file), a served request, a clean stop, and a stage no
node of the cluster can hold refused in one line before serving; and the
same on a cluster with Ray's token authentication on (docs/ray.md,
"Security").

The session's loopback Ray cluster (``conftest.ray_cluster``), and one of
its own for the authenticated one."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import sys
from pathlib import Path

import openai
import pytest

from omnix.testing.pipelines import ray_two_stages_toml
from omnix.testing.ray_cluster import LOOPBACK
from omnix.testing.served import ServeProcess

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_serve_with_placement_ray_from_a_config_file_serves_and_stops(
    ray_cluster, tmp_path: Path
):
    pipeline = tmp_path / "ray-two.toml"
    pipeline.write_text(ray_two_stages_toml())
    config = tmp_path / "serve.toml"
    config.write_text(
        f'pipeline = "{pipeline}"\nplacement = "ray"\nray-address = "{ray_cluster.address}"\n'
    )
    served = await ServeProcess.start("--config", str(config))
    try:
        url = await served.ready(120)
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        resp = await client.chat.completions.create(
            model="ray-two", messages=[{"role": "user", "content": "hi"}]
        )
        assert resp.choices[0].message.content == "".join(f"t{n} " for n in range(24))
        served.proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(60):
            assert await served.proc.wait() == 0
    finally:
        await served.close()
    out = "".join(served.lines)
    assert "workers endpoint tcp://127.0.0.1:" in out


async def test_serve_refuses_a_stage_no_node_can_hold_in_one_line(ray_cluster, tmp_path: Path):
    pipeline = tmp_path / "ray-tpu.toml"
    pipeline.write_text(ray_two_stages_toml("tpu_node"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "omnix.cli", "serve", "--port", "0", "--pipeline", str(pipeline),
        "--placement", "ray", "--ray-address", ray_cluster.address,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(60):
        _, err = await proc.communicate()
    assert proc.returncode == 2, err
    lines = [ln for ln in err.decode().splitlines() if "error:" in ln]
    assert len(lines) == 1 and "stage 'decoder' asks for" in lines[0], err.decode()
    assert "no node offers tpu_node" in lines[0]


async def test_serve_places_replicas_on_a_cluster_with_rays_token_auth(tmp_path: Path):
    # Ray reads its auth mode once per process: the cluster runs in its own.
    env = {
        **os.environ,
        **LOOPBACK,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    }
    nodes = json.dumps([{"thinker_node": 1}, {"decoder_node": 1}])
    cluster = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "omnix.testing.ray_cluster", nodes, env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert cluster.stdout is not None and cluster.stdin is not None
        async with asyncio.timeout(120):
            address = (await cluster.stdout.readline()).decode().strip()
        assert address.startswith("127.0.0.1:"), address
        pipeline = tmp_path / "ray-two.toml"
        pipeline.write_text(ray_two_stages_toml())
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "omnix.cli", "serve", "--port", "0", "--pipeline", str(pipeline),
            "--placement", "ray", "--ray-address", address, env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        served = ServeProcess(proc)
        try:
            url = await served.ready(120)
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            resp = await client.chat.completions.create(
                model="ray-two", messages=[{"role": "user", "content": "hi"}]
            )
            assert resp.choices[0].message.content
            served.proc.send_signal(signal.SIGINT)
            async with asyncio.timeout(60):
                assert await served.proc.wait() == 0
        finally:
            await served.close()
    finally:
        if cluster.stdin is not None:
            cluster.stdin.close()
        async with asyncio.timeout(60):
            await cluster.wait()
