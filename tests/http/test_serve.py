"""``omnix serve`` as a user runs it: a subprocess that logs where it
listens, serves, and stops cleanly on SIGTERM with its workers gone."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

import aiohttp
import pytest

from omnix.testing.served import ServeProcess

from .conftest import use_processes

pytestmark = pytest.mark.asyncio(loop_scope="session")

PIPELINE = """
name = "serve-test"
[[stages]]
name = "thinker"
engine = { kind = "scripted", chunks_per_piece = 3 }
media = { image = true }
[outputs]
text = "thinker"
"""


@pytest.mark.skipif(not use_processes(), reason="needs the process runtime")
async def test_serve_logs_serves_and_stops_on_sigterm(tmp_path):
    cfg = tmp_path / "p.toml"
    cfg.write_text(PIPELINE)
    served = await ServeProcess.start(
        "--pipeline", str(cfg), "--api-key", "k", "--log-dir", str(tmp_path / "log")
    )
    try:
        listening = await served.until(r"listening on (http://\S+)")
        url = listening.group(1)
        assert "pipeline 'serve-test'" in listening.string
        await served.until(r"ready in [0-9.]+ s")
        auth = {"Authorization": "Bearer k"}
        async with aiohttp.ClientSession() as http:
            # The probes answer without the key (a readiness probe carries
            # none); the API does not.
            async with http.get(url + "/health") as r:
                assert r.status == 200
            async with http.get(url + "/ready") as r:
                assert r.status == 200
            async with http.get(url + "/v1/models") as r:
                assert r.status == 401
            body = {"messages": [{"role": "user", "content": "hi"}]}
            async with http.post(url + "/v1/chat/completions", json=body, headers=auth) as r:
                assert r.status == 200
                assert (await r.json())["choices"][0]["message"]["content"] == "t0 t1 t2 "
        served.proc.send_signal(signal.SIGTERM)
        await served.until(r"stopped in")
        async with asyncio.timeout(20):
            assert await served.proc.wait() == 0
    finally:
        await served.close()
    # --log-dir made the log durable.
    assert (tmp_path / "log" / "pipeline.json").is_file()


async def _chat(url: str) -> str:
    async with aiohttp.ClientSession() as http:
        async with asyncio.timeout(30):
            while True:  # until a worker has joined
                async with http.get(url + "/ready") as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.1)
        body = {"messages": [{"role": "user", "content": "hi"}]}
        async with http.post(url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            return (await r.json())["choices"][0]["message"]["content"]


@pytest.mark.skipif(not use_processes(), reason="needs the process runtime")
async def test_a_hand_started_worker_joins_a_restarted_server(tmp_path):
    # omnix serve --spawn none takes its workers from `omnix worker
    # --connect`; killed with SIGKILL and started again on the same
    # endpoint, it gets its worker back without anyone restarting it.
    cfg = tmp_path / "p.toml"
    cfg.write_text(PIPELINE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"tcp://127.0.0.1:{port}"
    args = ("--pipeline", str(cfg), "--workers-endpoint", endpoint, "--spawn", "none")
    first = await ServeProcess.start(*args)
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "omnix.cli", "worker", "--connect", endpoint, "--stage", "thinker",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    second = None
    try:
        assert (
            await first.until(r"workers endpoint (\S+); spawned here: none; waiting for thinker")
        ).group(1) == endpoint
        url = (await first.until(r"ready in [0-9.]+ s: .* at (http://\S+)")).group(1)
        assert await _chat(url) == "t0 t1 t2 "
        await first.kill9()  # no goodbye, no shutdown: the worker must notice by itself
        second = await ServeProcess.start(*args)
        url = (await second.until(r"ready in [0-9.]+ s: .* at (http://\S+)")).group(1)
        assert await _chat(url) == "t0 t1 t2 "
        assert worker.returncode is None
    finally:
        await first.close()
        if second is not None:
            await second.close()
        if worker.returncode is None:
            worker.kill()
        _, err = await worker.communicate()
    assert b"joined " + endpoint.encode() + b" again" in err


async def test_a_public_workers_endpoint_without_a_token_is_refused_in_one_line(tmp_path):
    cfg = tmp_path / "p.toml"
    cfg.write_text(PIPELINE)
    env = {k: v for k, v in os.environ.items() if k != "OMNIX_WORKER_TOKEN"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "omnix.cli", "serve", "--pipeline", str(cfg), "--port", "0",
        "--workers-endpoint", "tcp://0.0.0.0:0", "--spawn", "none",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    [line] = out.decode().strip().splitlines()
    assert (
        "tcp://0.0.0.0:0 accepts connections from other hosts" in line and "--worker-token" in line
    )


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (
            ("--allowed-origins", "localhost:3000"),
            "--allowed-origins: allowed origin 'localhost:3000' is not an origin",
        ),
        (("--max-batch", "0"), "--max-batch must be at least 1"),
        (("--max-body-mb", "0"), "--max-body-mb must be positive"),
        (("--retain", "10 minutes"), "--retain '10 minutes' is not a duration"),
        (("--retain=-5s",), "--retain '-5s' is not a duration"),
        (("--retain-requests", "many"), "--retain-requests 'many' is not a count"),
        (("--retain-bytes", "12QB"), "--retain-bytes '12QB' is not a size"),
        (("--archive",), "--archive moves released log segments aside: it needs --log-dir DIR"),
        (("--config", "/nonexistent.toml"), "--config /nonexistent.toml: cannot read it"),
        (("--tool-call-parser", "hermes"), "has no vLLM stage writing text to parse"),
    ],
)
async def test_bad_serve_flags_are_refused_in_one_line(tmp_path, flags, says):
    cfg = tmp_path / "p.toml"
    cfg.write_text(PIPELINE)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "omnix.cli", "serve", "--pipeline", str(cfg), "--port", "0", *flags,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    [line] = out.decode().strip().splitlines()
    assert says in line


@pytest.mark.skipif(not use_processes(), reason="needs the process runtime")
async def test_serve_takes_its_http_flags(tmp_path):
    cfg = tmp_path / "p.toml"
    cfg.write_text(PIPELINE)
    served = await ServeProcess.start(
        "--pipeline", str(cfg), "--allowed-origins", "http://localhost:3000", "--max-batch", "2",
        "--allowed-media-domains", "Media.Example",
    )  # fmt: skip
    try:
        listening = await served.until(r"listening on (http://\S+)")
        assert "browser origins: http://localhost:3000" in listening.string
        url = (await served.until(r"ready in [0-9.]+ s: .* at (http://\S+)")).group(1)
        user = [{"role": "user", "content": "hi"}]
        async with aiohttp.ClientSession() as http:
            origin = {"Origin": "http://localhost:3000"}
            async with http.post(
                url + "/v1/chat/completions", json={"messages": user}, headers=origin
            ) as r:
                assert r.status == 200
                assert r.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
            async with http.post(url + "/v1/chat/completions", json={"messages": [user] * 3}) as r:
                assert r.status == 400
                assert (await r.json())["error"]["code"] == "batch_too_large"
            remote = {"type": "image_url", "image_url": {"url": "https://elsewhere.example/a.png"}}
            chat = {"messages": [{"role": "user", "content": [remote]}]}
            async with http.post(url + "/v1/chat/completions", json=chat) as r:
                assert r.status == 400
                err = (await r.json())["error"]
                assert err["code"] == "media_domain_not_allowed"
                assert "media.example" in err["message"]
    finally:
        await served.close()


@pytest.mark.slow  # the installed vLLM's registries: its import, ~20-70 s on 2 cores
async def test_a_parser_vllm_lacks_stops_serve_naming_the_flag():
    pytest.importorskip("vllm")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "omnix.cli", "serve", "--pipeline", "tiny-text", "--port", "0",
        "--tool-call-parser", "nope", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 2, out.decode()
    # vLLM's import may log first; the refusal is the last line.
    last = out.decode().strip().splitlines()[-1]
    assert "tool_call_parser (--tool-call-parser): vLLM has no tool-call parser 'nope'" in last
