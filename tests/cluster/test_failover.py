"""A leader, a standby and a frontend on a real NATS JetStream, as real
``omnix`` processes: a client streaming through the frontend sees the
leader killed with SIGKILL only as a pause, the standby takes the log over,
and the stream ends exactly as an undisturbed one (the scripted engine is
deterministic), with one terminal event in the log."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from omnix.events.natslog import NatsLog
from omnix.testing.nats_server import NatsServer

from omnix.events.types import TERMINAL_TYPES, WorkerLost
from omnix.orchestrator.recovery import RESTART_REASON
from omnix.testing.served import ServeProcess

in_session_loop = pytest.mark.asyncio(loop_scope="session")

# One slow stage: a request streams for ~3 s, long enough to kill the
# leader in the middle of it.
PIPELINE = """
name = "failover-test"
[[stages]]
name = "thinker"
engine = { kind = "scripted", chunks_per_piece = 150, delay_ms = 20 }
[outputs]
text = "thinker"
"""


async def stream_chat(
    http: aiohttp.ClientSession, url: str, rid: str, kill_after: int = -1, kill=None
) -> str:
    """A streamed chat completion's text; ``kill()`` after ``kill_after`` deltas."""
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    text: list[str] = []
    async with http.post(
        url + "/v1/chat/completions", json=body, headers={"X-Request-Id": rid}
    ) as r:
        assert r.status == 200, await r.text()
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            for choice in chunk["choices"]:
                text.append(choice["delta"].get("content") or "")
            if len(text) == kill_after and kill is not None:
                await kill()
    return "".join(text)


async def start_cluster(cfg: Path, nats: NatsServer, name: str) -> list[ServeProcess]:
    common = ("--pipeline", str(cfg), "--log", nats.url, "--log-name", name)
    leader = await ServeProcess.start(*common)
    await leader.ready()
    standby = await ServeProcess.start(*common, "--standby")
    await standby.until(r"listening on (http://\S+)")
    await standby.until("standing by")
    front = await ServeProcess.start("--log", nats.url, "--log-name", name, verb="frontend")
    await front.ready()
    return [leader, standby, front]


@in_session_loop
async def test_a_stream_through_a_frontend_survives_the_leader_killed_mid_stream(
    tmp_path: Path, own_nats: NatsServer
) -> None:
    cfg = tmp_path / "p.toml"
    cfg.write_text(PIPELINE)
    procs = await start_cluster(cfg, own_nats, "failover")
    leader, standby, front = procs
    try:
        async with aiohttp.ClientSession() as http:
            undisturbed = await stream_chat(http, front.url, "calm")
            assert undisturbed
            disturbed = await stream_chat(http, front.url, "storm", 40, leader.kill9)
            assert disturbed == undisturbed
            await standby.until(r"ready in [0-9.]+ s", timeout=30)  # it leads now
            # The new leader admits through the same frontend.
            assert await stream_chat(http, front.url, "after") == undisturbed
    finally:
        for p in procs:
            await p.close()
    follower = await NatsLog.follow(own_nats.url, name="failover")
    try:
        events = follower.events_for("storm")
        assert sum(isinstance(ev, TERMINAL_TYPES) for ev in events) == 1
        lost = [ev for ev in follower.read() if isinstance(ev, WorkerLost)]
        assert [ev.reason for ev in lost] == [RESTART_REASON]
    finally:
        await follower.aclose()
