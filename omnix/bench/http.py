"""``omnix bench http``: what the HTTP layer itself costs per stream.

Owns: one measurement: short streamed chat completions (``stream=true``,
``--chunks`` text chunks each) through ``HttpServer`` on loopback, served by
a scripted no-op pipeline (one stage, no delay), requested by an aiohttp
client in a separate process with ``--concurrency`` streams in flight,
bounded by ``--streams`` and ``--seconds``.  Reports SSE streams/s and SSE
events/s (``data:`` frames the client received, ``[DONE]`` included) and,
as a baseline, the same requests through ``Omni`` without HTTP, so the
difference is the HTTP layer's share.

The stage runs in process by default (``--runtime inproc``: no worker hop,
so the figure is the HTTP layer plus the log, not ZMQ); ``--runtime
workers`` runs it in a real worker process.  Telemetry is off unless
``--telemetry``.  Does not measure engines (``omnix bench engines``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import time
from typing import Any

from omnix.bench.loop import run_on_loop
from omnix.pipelines.config import PipelineConfig, ScriptedArgs, StageConfig
from omnix.pipelines.validate import validate_pipeline
from omnix.usage import count


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--streams", type=count, default=3000, help="streams to run at most")
    parser.add_argument("--seconds", type=float, default=15.0, help="stop after this long")
    parser.add_argument("--concurrency", type=count, default=32, help="streams in flight")
    parser.add_argument("--chunks", type=count, default=16, help="text chunks per stream")
    parser.add_argument(
        "--runtime",
        choices=("inproc", "workers"),
        default="inproc",
        help="where the scripted stage runs",
    )
    parser.add_argument("--telemetry", action="store_true", help="run the telemetry projection too")
    parser.add_argument(
        "--no-uvloop", action="store_true", help="serve on the default asyncio loop"
    )


def _pipeline(chunks: int) -> PipelineConfig:
    cfg = PipelineConfig(
        name="bench-http",
        stages=(
            StageConfig(
                name="thinker",
                engine=ScriptedArgs(chunks_per_piece=chunks, capacity=1024),
                max_queue=100_000,
            ),
        ),
        outputs={"text": "thinker"},
    )
    validate_pipeline(cfg)
    return cfg


# -- the client (its own process) ------------------------------------------------


async def _client(url: str, streams: int, seconds: float, concurrency: int) -> dict[str, Any]:
    import aiohttp

    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    headers = {"Content-Type": "application/json"}
    done = events = errors = 0
    started = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> tuple[int, bool]:
            async with session.post(url, data=body, headers=headers) as r:
                raw = await r.read()
                ok = r.status == 200 and raw.endswith(b"data: [DONE]\n\n")
                return raw.count(b"data: "), ok

        for _ in range(min(concurrency, 20)):  # warm up connections and code paths
            await one()
        t0 = time.perf_counter()
        deadline = t0 + seconds

        async def worker() -> None:
            nonlocal done, events, errors, started
            while started < streams and time.perf_counter() < deadline:
                started += 1
                n, ok = await one()
                events += n
                done += ok
                errors += not ok

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return {"streams": done, "events": events, "errors": errors, "elapsed_s": elapsed}


def _client_main(url: str, streams: int, seconds: float, concurrency: int, out: Any) -> None:
    out.put(asyncio.run(_client(url, streams, seconds, concurrency)))


# -- the server (this process) ---------------------------------------------------


async def _omni_baseline(omni: Any, streams: int, seconds: float, concurrency: int) -> float:
    """Streams/s of the same requests through ``Omni`` directly."""
    from omnix.api import new_seed
    from omnix.events.types import ChatMessage, RequestSpec

    spec = RequestSpec(messages=(ChatMessage("user", "hi"),), seed=new_seed(), api="bench")
    count = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds

    async def worker() -> None:
        nonlocal count
        while count < streams and time.perf_counter() < deadline:
            count += 1
            ev = omni.submit(spec)
            async for _ in omni.events(ev.request_id):
                pass

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return count / (time.perf_counter() - t0)


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from omnix.testing.serving import serve_scripted

    cfg = _pipeline(args.chunks)
    async with serve_scripted(
        cfg, processes=args.runtime == "workers", telemetry=args.telemetry
    ) as server:
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        url = server.url + "/v1/chat/completions"
        proc = ctx.Process(
            target=_client_main,
            args=(url, args.streams, args.seconds, args.concurrency, out),
            daemon=True,
        )
        proc.start()
        # Wait on a thread: the server must keep serving on this loop.
        res = await asyncio.to_thread(out.get, True, args.seconds + 120)
        await asyncio.to_thread(proc.join, 10)
        baseline = await _omni_baseline(server.omni, args.streams, args.seconds, args.concurrency)
    elapsed = res["elapsed_s"]
    streams_per_s = res["streams"] / elapsed
    return {
        "sse_streams_per_s": round(streams_per_s, 1),
        "sse_events_per_s": round(res["events"] / elapsed, 1),
        "omni_streams_per_s": round(baseline, 1),
        "http_overhead_us_per_stream": round(1e6 / streams_per_s - 1e6 / baseline, 1)
        if streams_per_s
        else None,
        "streams": res["streams"],
        "errors": res["errors"],
        "events_per_stream": round(res["events"] / max(1, res["streams"] + res["errors"]), 2),
        "concurrency": args.concurrency,
        "chunks": args.chunks,
        "runtime": args.runtime,
        "telemetry": bool(args.telemetry),
        "elapsed_s": round(elapsed, 2),
    }


def run(args: argparse.Namespace) -> int:
    res = run_on_loop(_bench(args), uvloop=not args.no_uvloop)
    if not getattr(args, "json", False):
        print(
            f"SSE streams/s {res['sse_streams_per_s']:,.0f}, SSE events/s {res['sse_events_per_s']:,.0f} "
            f"({res['streams']} streams of {res['events_per_stream']} events, concurrency "
            f"{res['concurrency']}, {res['runtime']} stage, {res['errors']} errors)"
        )
        print(
            f"same requests through Omni without HTTP: {res['omni_streams_per_s']:,.0f} streams/s "
            f"(HTTP adds ~{res['http_overhead_us_per_stream']} us per stream)"
        )
    print(json.dumps(res))
    return 0 if res["errors"] == 0 else 1
