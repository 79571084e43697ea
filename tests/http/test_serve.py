"""``omnix serve`` as a user runs it: a subprocess that logs where it
listens, serves, and stops cleanly on SIGTERM with its workers gone."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys

import aiohttp
import pytest

from .conftest import use_processes

pytestmark = pytest.mark.asyncio(loop_scope="session")

PIPELINE = """
name = "serve-test"
[[stages]]
name = "thinker"
engine = { kind = "scripted", chunks_per_piece = 3 }
[outputs]
text = "thinker"
"""


@pytest.mark.skipif(not use_processes(), reason="needs the process runtime")
async def test_serve_logs_serves_and_stops_on_sigterm(tmp_path):
    cfg = tmp_path / "p.toml"
    cfg.write_text(PIPELINE)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "omnix.cli", "serve", "--pipeline", str(cfg), "--port", "0",
        "--api-key", "k", "--log-dir", str(tmp_path / "log"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    lines: list[str] = []
    stdout = proc.stdout
    assert stdout is not None

    async def until(pattern: str) -> re.Match[str]:
        async with asyncio.timeout(60):
            while True:
                line = (await stdout.readline()).decode()
                assert line, "omnix serve exited:\n" + "".join(lines)
                lines.append(line)
                m = re.search(pattern, line)
                if m:
                    return m

    try:
        url = (await until(r"listening on (http://\S+)")).group(1)
        assert "pipeline 'serve-test'" in lines[-1]
        await until(r"ready in [0-9.]+ s")
        auth = {"Authorization": "Bearer k"}
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/health") as r:
                assert r.status == 200
            async with http.get(url + "/ready") as r:
                assert r.status == 401
            body = {"messages": [{"role": "user", "content": "hi"}]}
            async with http.post(url + "/v1/chat/completions", json=body, headers=auth) as r:
                assert r.status == 200
                assert (await r.json())["choices"][0]["message"]["content"] == "t0 t1 t2 "
        proc.send_signal(signal.SIGTERM)
        await until(r"stopped in")
        async with asyncio.timeout(20):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    # --log-dir made the log durable.
    assert (tmp_path / "log" / "pipeline.json").is_file()
