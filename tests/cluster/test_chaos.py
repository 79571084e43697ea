"""Chaos on the replicated log, as the issue asks: a leader, a standby and
two frontends (real ``omnix`` processes) serving tiny-omni (text + audio,
greedy) on a real JetStream.  Each round starts 8 streaming requests
through the frontends and kills something with SIGKILL at a point the
test's seeded RNG draws: the leader (the standby takes over; the killed
server comes back as the next standby), or, in the second variant, one
node of a three-node JetStream cluster (R=3).  Every response completes,
equal byte for byte (text and audio) to an undisturbed run; no request is
lost or duplicated; each has exactly one terminal event; and the whole log
replays with zero divergence afterwards.

``OMNIX_CHAOS_ROUNDS`` sets the rounds of the leader variant (20, the
issue's count, by default)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
from collections import Counter
from pathlib import Path

import aiohttp
import msgspec
import pytest

from omnix.events.natslog import NatsLog
from omnix.events.types import TERMINAL_TYPES, Admitted, Rejected, StageParams
from omnix.pipelines.validate import load_pipeline
from omnix.replay.drive import drive
from omnix.testing.nats_server import NatsCluster, NatsServer
from omnix.testing.served import ServeProcess
from omnix.testing.sse import sse_events
from omnix.trace import export_trace, read_trace

pytestmark = pytest.mark.engines
in_session_loop = pytest.mark.asyncio(loop_scope="session")

ROUNDS = int(os.environ.get("OMNIX_CHAOS_ROUNDS", "20"))
PROMPTS = [f"Say something about the number {i}." for i in range(8)]
LOG = "chaos"


def chaos_pipeline(tmp: Path) -> Path:
    """tiny-omni with its thinker and talker greedy (a continuation then
    reproduces the undisturbed run exactly)."""
    cfg = load_pipeline("tiny-omni")
    greedy = {"thinker": StageParams(temperature=0.0, max_tokens=24),
              "talker": StageParams(temperature=0.0, max_tokens=48)}  # fmt: skip
    stages = tuple(
        msgspec.structs.replace(st, sampling=greedy[st.name]) if st.name in greedy else st
        for st in cfg.stages
    )
    path = tmp / "chaos-omni.json"
    path.write_bytes(msgspec.json.encode(msgspec.structs.replace(cfg, stages=stages)))
    return path


class Answer(msgspec.Struct):
    text: str = ""
    audio: bytes = b""
    done: bool = False
    deltas: int = 0


async def stream(
    http: aiohttp.ClientSession, url: str, rid: str, prompt: str, reached: asyncio.Event | None
) -> Answer:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "modalities": ["text", "audio"],
        "audio": {"voice": "default", "format": "pcm16"},
        "stream": True,
    }
    out = Answer()
    text, audio = [], []
    async with http.post(
        url + "/v1/chat/completions", json=body, headers={"X-Request-Id": rid}
    ) as r:
        assert r.status == 200, await r.text()
        async for event in sse_events(r.content):
            if event.done:
                out.done = True
                break
            for choice in json.loads(event.data).get("choices", []):
                delta = choice.get("delta") or {}
                text.append(delta.get("content") or "")
                if delta.get("audio") and delta["audio"].get("data"):
                    audio.append(base64.b64decode(delta["audio"]["data"]))
                out.deltas += 1
                if reached is not None and out.deltas >= 3:
                    reached.set()
    out.text, out.audio = "".join(text), b"".join(audio)
    return out


async def one_round(
    http: aiohttp.ClientSession, fronts: list[str], tag: str, kill=None, delay: float = 0.0
) -> dict[str, Answer]:
    """8 requests over the frontends; ``kill()`` ``delay`` s after the
    first deltas arrived."""
    reached = asyncio.Event()
    tasks = {
        f"{tag}-{i}": asyncio.ensure_future(
            stream(http, fronts[i % len(fronts)], f"{tag}-{i}", p, reached)
        )
        for i, p in enumerate(PROMPTS)
    }
    if kill is not None:
        await reached.wait()
        await asyncio.sleep(delay)
        await kill()
    return {rid: await t for rid, t in tasks.items()}


def check_answers(got: dict[str, Answer], want: list[Answer]) -> None:
    for i, ans in enumerate(got.values()):
        assert ans.done, f"request {i} did not complete"
        assert ans.text == want[i].text, f"request {i}: text differs"
        assert ans.audio == want[i].audio, f"request {i}: audio differs"


async def check_log(url: str, rids: list[str], cfg: Path) -> None:
    follower = await NatsLog.follow(url, name=LOG)
    try:
        admitted = Counter(
            ev.request_id for ev in follower.read() if isinstance(ev, Admitted | Rejected)
        )
        assert set(admitted) == set(rids) and set(admitted.values()) == {1}
        for rid in rids:
            ends = [ev for ev in follower.events_for(rid) if isinstance(ev, TERMINAL_TYPES)]
            assert len(ends) == 1, (rid, ends)
        trace = read_trace(export_trace(follower, follower.blobs, load_pipeline(cfg), None))
        assert drive(trace).ok
    finally:
        await follower.aclose()


def serve_flags(cfg: Path, url: str) -> tuple[str, ...]:
    # Retention keeps every request of the run: the log is checked whole after.
    return ("--pipeline", str(cfg), "--log", url, "--log-name", LOG, "--retain", "2h")


async def start_servers(cfg: Path, url: str) -> tuple[ServeProcess, ServeProcess, list]:
    common = (*serve_flags(cfg, url), "--log-replicas")
    replicas = "3" if "," in url else "1"
    leader = await ServeProcess.start(*common, replicas)
    await leader.ready(300)
    standby = await ServeProcess.start(*common, replicas, "--standby")
    await standby.until("standing by", 300)
    fronts = [
        await ServeProcess.start("--log", url, "--log-name", LOG, verb="frontend") for _ in range(2)
    ]
    for f in fronts:
        await f.ready(60)
    return leader, standby, fronts


@in_session_loop
@pytest.mark.timeout(3000)  # 20 rounds, each restarting a tiny-omni server
async def test_leader_killed_at_random_points_loses_and_changes_nothing(tmp_path: Path) -> None:
    cfg = chaos_pipeline(tmp_path)
    rng = random.Random(20261206)
    with NatsServer(tmp_path / "nats") as nats:
        leader, standby, fronts = await start_servers(cfg, nats.url)
        procs = [leader, standby, *fronts]
        rids: list[str] = []
        try:
            async with aiohttp.ClientSession() as http:
                urls = [f.url for f in fronts]
                calm = await one_round(http, urls, "calm")
                want = list(calm.values())
                rids += calm
                for n in range(ROUNDS):
                    got = await one_round(http, urls, f"r{n}", leader.kill9, rng.uniform(0, 1.5))
                    check_answers(got, want)
                    rids += got
                    await standby.until(r"ready in [0-9.]+ s", 60)  # it leads now
                    # The killed server comes back as the next standby.
                    common = serve_flags(cfg, nats.url)
                    leader, standby = standby, await ServeProcess.start(*common, "--standby")
                    procs.append(standby)
                    await standby.until("standing by", 300)
        finally:
            for p in procs:
                await p.close()
        await check_log(nats.url, rids, cfg)


@in_session_loop
@pytest.mark.timeout(900)
async def test_a_jetstream_node_killed_mid_stream_changes_nothing(tmp_path: Path) -> None:
    cfg = chaos_pipeline(tmp_path)
    with NatsCluster(tmp_path / "nats") as cluster:
        leader, standby, fronts = await start_servers(cfg, cluster.url)
        procs = [leader, standby, *fronts]
        try:
            async with aiohttp.ClientSession() as http:
                urls = [f.url for f in fronts]
                calm = await one_round(http, urls, "calm")

                async def kill_node() -> None:
                    cluster.nodes[0].kill()

                got = await one_round(http, urls, "node", kill_node, 0.5)
                check_answers(got, list(calm.values()))
        finally:
            for p in procs:
                await p.close()
        await check_log(cluster.url, [*calm, *got], cfg)
