"""Chaos on the replicated log, as the issue asks: a leader, warm standbys
and two frontends (real ``omnix`` processes) serving tiny-omni (text +
audio, greedy) on a real JetStream.  Each round starts 8 streaming
requests through the frontends and kills something with SIGKILL at a
point the test's seeded RNG draws (once every request has had that many
deltas, none ended): the leader (a warm standby takes over; the killed
server comes back as a standby while the next round runs, so two are
kept and the next round's kill always finds one standing by), or, in the
second variant, one node of a three-node JetStream cluster (R=3).  The
undisturbed answers are non-empty, text and audio; every response
completes, equal byte for byte (text and audio) to them; no request is
lost or duplicated; each has exactly one terminal event; in the leader
variant the log shows each round's takeover between its requests'
admissions and their ends (every kill landed while all 8 were in
flight); and the whole log replays with zero divergence afterwards.

``OMNIX_CHAOS_ROUNDS`` sets the rounds of the leader variant (20, the
issue's count, by default)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import msgspec
import pytest

from omnix.events.natslog import NatsLog
from omnix.events.types import (
    TERMINAL_TYPES,
    Admitted,
    Event,
    Rejected,
    StageParams,
    WorkerLost,
)
from omnix.orchestrator.recovery import RESTART_REASON
from omnix.pipelines.validate import load_pipeline
from omnix.replay.drive import drive
from omnix.testing.nats_server import NatsCluster, NatsServer
from omnix.testing.served import ServeProcess
from omnix.testing.sse import sse_events
from omnix.trace import export_trace, read_trace

pytestmark = [pytest.mark.engines, pytest.mark.starts_first]
in_session_loop = pytest.mark.asyncio(loop_scope="session")

ROUNDS = int(os.environ.get("OMNIX_CHAOS_ROUNDS", "20"))
PROMPTS = [f"Say something about the number {i}." for i in range(8)]
LOG = "chaos"
#: Warm standbys kept: one takes over, the other is ready for the next
#: round while the killed server comes back.
STANDBYS = 2


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
    http: aiohttp.ClientSession,
    url: str,
    rid: str,
    prompt: str,
    out: Answer,
    progress: asyncio.Event,
) -> Answer:
    """One streamed chat completion into ``out`` (``deltas`` counts as
    they come; ``progress`` is set at each)."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "modalities": ["text", "audio"],
        "audio": {"voice": "default", "format": "pcm16"},
        "stream": True,
    }
    text, audio = [], []
    try:
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
                    progress.set()
    finally:
        # A request that fails wakes the round too: it fails the test
        # rather than leaving the round waiting for deltas that never come.
        progress.set()
    out.text, out.audio = "".join(text), b"".join(audio)
    return out


async def one_round(
    http: aiohttp.ClientSession,
    fronts: list[str],
    tag: str,
    kill: Callable[[], Awaitable[None]] | None = None,
    at_deltas: int = 1,
) -> dict[str, Answer]:
    """8 requests over the frontends; ``kill()`` as soon as every one of
    them has had ``at_deltas`` deltas, and none has ended."""
    progress = asyncio.Event()
    answers = {f"{tag}-{i}": Answer() for i in range(len(PROMPTS))}
    tasks = [
        asyncio.ensure_future(stream(http, fronts[i % len(fronts)], rid, p, out, progress))
        for i, (p, (rid, out)) in enumerate(zip(PROMPTS, answers.items(), strict=True))
    ]
    try:
        if kill is not None:
            while not all(a.deltas >= at_deltas for a in answers.values()):
                assert not any(t.done() for t in tasks), (
                    f"{tag}: a request ended before every one had {at_deltas} deltas: "
                    f"{[(a.deltas, a.done) for a in answers.values()]}"
                )
                progress.clear()
                await progress.wait()
            await kill()
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
    return answers


def check_calm(calm: dict[str, Answer]) -> list[Answer]:
    """The undisturbed answers every round is held to: complete, and each
    with text and audio (an empty one would make "equal" prove nothing)."""
    for rid, ans in calm.items():
        assert ans.done, f"{rid}: the undisturbed request did not complete"
        assert ans.text.strip(), f"{rid}: the undisturbed answer has no text"
        assert len(ans.audio) >= 2, f"{rid}: the undisturbed answer has no audio"
    return list(calm.values())


def check_answers(got: dict[str, Answer], want: list[Answer]) -> None:
    for i, ans in enumerate(got.values()):
        assert ans.done, f"request {i} did not complete"
        assert ans.text == want[i].text, f"request {i}: text differs"
        assert ans.audio == want[i].audio, f"request {i}: audio differs"


def kills_in_flight(events: list[Event], rounds: list[list[str]]) -> None:
    """Each round's kill landed while all its requests were in flight: the
    takeover that followed it (the new leader's ``WorkerLost`` "server
    restarted" for the killed server's replicas) comes after every one of
    the round's admissions and before any of their terminal events.  Only
    the leader appends, so nothing of the round can sit between the kill
    and that takeover."""
    takeovers = [ev.pos for ev in events if type(ev) is WorkerLost and ev.reason == RESTART_REASON]
    for rids in rounds:
        want = set(rids)
        admitted = [ev.pos for ev in events if type(ev) is Admitted and ev.request_id in want]
        ended = [
            ev.pos for ev in events if isinstance(ev, TERMINAL_TYPES) and ev.request_id in want
        ]
        assert len(admitted) == len(rids) and len(ended) == len(rids), rids
        between = [p for p in takeovers if max(admitted) < p < min(ended)]
        assert between, (
            f"{rids[0]}..: no takeover between the last admission (pos {max(admitted)}) and "
            f"the first end (pos {min(ended)}): the kill did not land while all were in flight"
        )


async def check_log(
    url: str, rids: list[str], cfg: Path, killed_rounds: list[list[str]] | None = None
) -> None:
    follower = await NatsLog.follow(url, name=LOG)
    try:
        events = list(follower.read())
        admitted = Counter(ev.request_id for ev in events if isinstance(ev, Admitted | Rejected))
        assert set(admitted) == set(rids) and set(admitted.values()) == {1}
        for rid in rids:
            ends = [ev for ev in follower.events_for(rid) if isinstance(ev, TERMINAL_TYPES)]
            assert len(ends) == 1, (rid, ends)
        if killed_rounds is not None:
            kills_in_flight(events, killed_rounds)
        trace = read_trace(export_trace(follower, follower.blobs, load_pipeline(cfg), None))
        assert drive(trace).ok
    finally:
        await follower.aclose()


def serve_flags(cfg: Path, url: str) -> tuple[str, ...]:
    # Retention keeps every request of the run: the log is checked whole after.
    return ("--pipeline", str(cfg), "--log", url, "--log-name", LOG, "--retain", "2h")


class Servers:
    """The leader, its standbys (in start order) and the frontends."""

    def __init__(self, cfg: Path, url: str) -> None:
        self.cfg, self.url = cfg, url
        self.replicas = "3" if "," in url else "1"
        self.leader: ServeProcess | None = None
        self.standbys: list[ServeProcess] = []
        self.fronts: list[ServeProcess] = []
        self.procs: list[ServeProcess] = []

    def flags(self) -> tuple[str, ...]:
        return (*serve_flags(self.cfg, self.url), "--log-replicas", self.replicas)

    async def _start(self, *args: str, verb: str = "serve") -> ServeProcess:
        p = await ServeProcess.start(*args, verb=verb)
        self.procs.append(p)
        return p

    async def add_standby(self) -> ServeProcess:
        """A standby started now; it warms its workers while the caller
        goes on (``standing_by`` waits for it)."""
        p = await self._start(*self.flags(), "--standby")
        self.standbys.append(p)
        return p

    async def start(self, standbys: int) -> None:
        """The servers side by side, each as a standby: the first to warm
        takes the free lease and leads (the others stand by); then the
        frontends, which ask the leader for its pipeline."""
        for _ in range(standbys + 1):
            await self.add_standby()
        await self.takeover(300)
        self.fronts = [
            await self._start("--log", self.url, "--log-name", LOG, verb="frontend")
            for _ in range(2)
        ]
        await asyncio.gather(*(f.ready(120) for f in self.fronts))

    async def standing_by(self, timeout: float = 300) -> None:  # noqa: ASYNC109
        """Until at least one standby stands by (warm, waiting for the lease)."""
        waits = [asyncio.ensure_future(s.seen("standing by", timeout)) for s in self.standbys]
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()
        finally:
            for t in waits:
                t.cancel()

    async def takeover(self, timeout: float = 60) -> ServeProcess:  # noqa: ASYNC109
        """The standby that leads now (its 'ready in' line comes once it does)."""
        waits = {
            asyncio.ensure_future(s.seen(r"ready in [0-9.]+ s", timeout)): s for s in self.standbys
        }
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            t = next(iter(done))
            t.result()
            new = waits[t]
        finally:
            for t in waits:
                t.cancel()
        self.standbys.remove(new)
        self.leader = new
        return new

    async def kill_leader(self) -> None:
        assert self.leader is not None
        await self.leader.kill9()

    async def close(self) -> None:
        for p in self.procs:
            await p.close()


@in_session_loop
@pytest.mark.timeout(3000)  # 20 rounds, each restarting a tiny-omni server
async def test_leader_killed_at_random_points_loses_and_changes_nothing(tmp_path: Path) -> None:
    cfg = chaos_pipeline(tmp_path)
    rng = random.Random(20261206)
    with NatsServer(tmp_path / "nats") as nats:
        servers = Servers(cfg, nats.url)
        rids: list[str] = []
        killed: list[list[str]] = []
        try:
            await servers.start(standbys=STANDBYS)
            async with aiohttp.ClientSession() as http:
                urls = [f.url for f in servers.fronts]
                calm = await one_round(http, urls, "calm")
                want = check_calm(calm)
                rids += calm
                # The kill lands in the first third of the shortest answer's
                # deltas: every request is still in flight there.
                most = min(a.deltas for a in want) // 3
                assert most >= 1, [a.deltas for a in want]
                for n in range(ROUNDS):
                    t0 = time.perf_counter()
                    await servers.standing_by()
                    t1 = time.perf_counter()
                    got = await one_round(
                        http, urls, f"r{n}", servers.kill_leader, rng.randint(1, most)
                    )
                    check_answers(got, want)
                    rids += got
                    killed.append(list(got))
                    await servers.takeover()
                    # The killed server comes back as a standby, warming
                    # while the next rounds run.
                    await servers.add_standby()
                    print(
                        f"round {n}: {t1 - t0:.1f} s for a standby, "
                        f"{time.perf_counter() - t1:.1f} s for the round and takeover"
                    )
        finally:
            await servers.close()
        await check_log(nats.url, rids, cfg, killed)


@in_session_loop
@pytest.mark.timeout(900)
async def test_a_jetstream_node_killed_mid_stream_changes_nothing(tmp_path: Path) -> None:
    cfg = chaos_pipeline(tmp_path)
    with NatsCluster(tmp_path / "nats") as cluster:
        servers = Servers(cfg, cluster.url)
        try:
            await servers.start(standbys=1)
            await servers.standing_by()
            async with aiohttp.ClientSession() as http:
                urls = [f.url for f in servers.fronts]
                calm = await one_round(http, urls, "calm")
                want = check_calm(calm)

                async def kill_node() -> None:
                    cluster.nodes[0].kill()

                most = min(a.deltas for a in want) // 3
                got = await one_round(http, urls, "node", kill_node, max(1, most // 2))
                check_answers(got, want)
        finally:
            await servers.close()
        await check_log(cluster.url, [*calm, *got], cfg)
