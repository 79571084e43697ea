"""NATS lost under a running leader: admissions answer 503 with
Retry-After while it is away (nothing is admitted that the log could not
acknowledge), and the same server admits again once NATS is back, having
kept its lease and everything it had acknowledged."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from omnix.events.natslog import NatsLog
from omnix.events.types import TERMINAL_TYPES
from omnix.testing.nats_server import NatsServer
from omnix.testing.served import ServeProcess

in_session_loop = pytest.mark.asyncio(loop_scope="session")

PIPELINE = """
name = "outage-test"
[[stages]]
name = "thinker"
engine = { kind = "scripted", chunks_per_piece = 8, delay_ms = 1 }
[outputs]
text = "thinker"
"""
BODY = {"messages": [{"role": "user", "content": "hi"}]}


async def chat(http: aiohttp.ClientSession, url: str, rid: str) -> aiohttp.ClientResponse:
    async with http.post(
        url + "/v1/chat/completions", json=BODY, headers={"X-Request-Id": rid}
    ) as r:
        await r.read()
        return r


@in_session_loop
async def test_admissions_wait_out_a_nats_outage_with_503_and_resume(
    tmp_path: Path, own_nats: NatsServer
) -> None:
    cfg = tmp_path / "p.toml"
    cfg.write_text(PIPELINE)
    leader = await ServeProcess.start("--pipeline", str(cfg), "--log", own_nats.url)
    try:
        await leader.ready()
        async with aiohttp.ClientSession() as http:
            assert (await chat(http, leader.url, "before")).status == 200
            own_nats.kill()
            deadline = time.monotonic() + 10
            while True:
                r = await chat(http, leader.url, "during")
                if r.status == 503:
                    break
                assert time.monotonic() < deadline, "admissions never stopped"
                await asyncio.sleep(0.2)
            assert r.headers["Retry-After"] == "2"
            own_nats.start()
            deadline = time.monotonic() + 20
            while (r := await chat(http, leader.url, "after")).status != 200:
                assert r.status == 503, r.status
                assert time.monotonic() < deadline, "admissions never came back"
                await asyncio.sleep(0.3)
        assert leader.proc.returncode is None  # the same server leads on
    finally:
        await leader.close()
    follower = await NatsLog.follow(own_nats.url, name="omnix")
    try:
        for rid in ("before", "after"):
            ends = [ev for ev in follower.events_for(rid) if isinstance(ev, TERMINAL_TYPES)]
            assert len(ends) == 1, (rid, follower.events_for(rid), follower.next_pos)
        assert follower.events_for("during") == []  # refused before anything was appended
    finally:
        await follower.aclose()
