"""A leader, a standby and a frontend on a real NATS JetStream, as real
``omnix`` processes: a client streaming through the frontend sees the
leader killed with SIGKILL only as a pause, the standby takes the log over,
and the stream ends exactly as an undisturbed one (the scripted engine is
deterministic), with one terminal event in the log."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from omnix.events.natslog import NatsLog
from omnix.events.types import TERMINAL_TYPES, WorkerLost
from omnix.orchestrator.recovery import RESTART_REASON
from omnix.testing.nats_server import NatsServer, free_port
from omnix.testing.served import ServeProcess
from omnix.testing.sse import SseReader, chat_delta_text, sse_events

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
        async for event in sse_events(r.content):
            if event.done:
                continue
            text.append(chat_delta_text(event.data))
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


def sse_text(raw: bytes) -> tuple[str, str, bool]:
    """(content text, last SSE id, saw [DONE]) of an SSE body read so far."""
    reader = SseReader()
    events = reader.feed(raw)
    text = "".join(chat_delta_text(event.data) for event in events)
    return text, reader.last_id, any(event.done for event in events)


@in_session_loop
async def test_a_client_resumes_on_another_frontend_when_its_frontend_is_killed(
    tmp_path: Path, own_nats: NatsServer
) -> None:
    cfg = tmp_path / "p.toml"
    cfg.write_text(PIPELINE)
    common = ("--log", own_nats.url, "--log-name", "fronts")
    leader = await ServeProcess.start("--pipeline", str(cfg), *common)
    procs = [leader]
    try:
        await leader.ready()
        for _ in range(2):
            procs.append(await ServeProcess.start(*common, verb="frontend"))
            await procs[-1].ready()
        one, two = procs[1], procs[2]
        async with aiohttp.ClientSession() as http:
            undisturbed = await stream_chat(http, one.url, "calm")
            # Bad input is answered by the frontend itself, before the leader.
            bad = {"messages": [{"role": "user", "content": "hi"}], "temperature": -1}
            async with http.post(one.url + "/v1/chat/completions", json=bad) as r:
                assert r.status == 400, await r.text()
            body = {
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "stream_options": {"resumable": True},
            }
            headers = {"X-Request-Id": "moved"}
            raw = b""
            async with http.post(one.url + "/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200
                while sse_text(raw)[0].count(" ") < 20:
                    raw += await r.content.readany()
                await one.kill9()
            before, last_id, _ = sse_text(raw.rpartition(b"\n\n")[0] + b"\n\n")
            url = f"{two.url}/v1/requests/moved/stream"
            async with http.get(url, headers={"Last-Event-ID": last_id}) as r:
                assert r.status == 200, await r.text()
                after, _, done = sse_text(await r.read())
            assert done and before + after == undisturbed
    finally:
        for p in procs:
            await p.close()


@in_session_loop
async def test_a_leader_paused_past_its_lease_steps_down_when_it_wakes(
    tmp_path: Path, own_nats: NatsServer
) -> None:
    cfg = tmp_path / "p.toml"
    cfg.write_text(PIPELINE)
    common = ("--pipeline", str(cfg), "--log", own_nats.url, "--log-name", "paused")
    leader = await ServeProcess.start(*common)
    procs = [leader]
    try:
        await leader.ready()
        standby = await ServeProcess.start(*common, "--standby")
        procs.append(standby)
        new = (await standby.until(r"listening on (http://\S+)")).group(1)
        await standby.until("standing by")
        leader.proc.send_signal(signal.SIGSTOP)  # alive, but silent past its lease
        await standby.until(r"ready in [0-9.]+ s", timeout=30)
        async with aiohttp.ClientSession() as http:
            assert await stream_chat(http, new, "led-by-the-standby")
        leader.proc.send_signal(signal.SIGCONT)
        assert await asyncio.wait_for(leader.proc.wait(), 30) == 3
        await leader.until("stepping down")
    finally:
        for p in procs:
            if p.proc.returncode is None:
                p.proc.send_signal(signal.SIGCONT)
            await p.close()
    follower = await NatsLog.follow(own_nats.url, name="paused")
    try:
        ends = [
            ev for ev in follower.events_for("led-by-the-standby") if isinstance(ev, TERMINAL_TYPES)
        ]
        assert len(ends) == 1
    finally:
        await follower.aclose()


@in_session_loop
async def test_a_hand_started_worker_given_both_servers_moves_to_the_standby(
    tmp_path: Path, own_nats: NatsServer
) -> None:
    cfg = tmp_path / "p.toml"
    cfg.write_text(PIPELINE)
    ports = [free_port(), free_port()]
    eps = [f"tcp://127.0.0.1:{p}" for p in ports]
    common = ("--pipeline", str(cfg), "--log", own_nats.url, "--log-name", "byhand")
    common += ("--spawn", "none")
    leader = await ServeProcess.start(*common, "--workers-endpoint", eps[0])
    procs = [leader]
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "omnix.cli", "worker", "--connect", ",".join(eps),
        "--stage", "thinker", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await leader.ready()
        standby = await ServeProcess.start(*common, "--workers-endpoint", eps[1], "--standby")
        procs.append(standby)
        await standby.until("standing by")
        front = await ServeProcess.start(
            "--log", own_nats.url, "--log-name", "byhand", verb="frontend"
        )
        procs.append(front)
        await front.ready()
        async with aiohttp.ClientSession() as http:
            undisturbed = await stream_chat(http, front.url, "calm")
            # The worker notices its server is gone by its heartbeats (10 s),
            # then joins the standby, which leads by then.
            moved = await stream_chat(http, front.url, "moved", 40, leader.kill9)
            assert moved == undisturbed
    finally:
        for p in procs:
            await p.close()
        worker.kill()
        await worker.wait()
