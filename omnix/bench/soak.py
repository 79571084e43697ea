"""``omnix bench soak``: does a long-running server's memory stay flat?

Owns: one measurement.  ``omnix serve`` (the default pipeline, tiny-omni,
real engines, an in-memory log) runs as a subprocess on a free port with
``--retain-requests N`` (default 200), so the retention window is full
once the warm-up is over.  A client in this process sends ``--warmup``
chat requests with audio output (``modalities: ["text", "audio"]``,
non-streamed), then ``--requests`` more at ``--concurrency``, and reads the
server process's RSS (psutil; the ``omnix serve`` process alone, not its
worker processes: the engines' memory is theirs and vLLM's) before and
after those (and after every ``--segment`` of them, to show where it
flattens).  The figure is the RSS growth per request over the measured
requests (target: at most 2 KB per request; before retention ~130 KB).
``retained_requests`` is ``omnix_requests_retained`` from ``/metrics`` at
the end.  ``--json`` prints one JSON object on the last line.

Does not own the server (``omnix serve``), retention
(``omnix.events.retention``) or what the engines cost (``omnix bench
engines``).  Runs real vLLM engines: on a shared machine wrap it in
``flock /tmp/omnix-engine.lock``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from omnix.bench.loop import run_on_loop
from omnix.bench.pipeline_arg import load_pipeline_arg, prepare_pipeline_models
from omnix.testing.served import ServeProcess
from omnix.usage import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--warmup", type=int, default=500, help="requests before measuring (default 500)"
    )
    parser.add_argument(
        "--requests", type=int, default=2000, help="requests measured (default 2000)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=10, help="requests in flight (default 10)"
    )
    parser.add_argument(
        "--segment",
        type=int,
        default=500,
        help="read the server's RSS after every this many measured requests (default 500)",
    )
    parser.add_argument(
        "--retain-requests",
        type=int,
        default=200,
        help="the server's --retain-requests (default 200)",
    )
    parser.add_argument(
        "--pipeline", default=None, help="pipeline to serve (default: omnix serve's)"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=16, help="max_completion_tokens per request (default 16)"
    )
    parser.add_argument(
        "--model-dir", default=None, help="tiny model dir (default $OMNIX_MODEL_DIR)"
    )
    parser.add_argument(
        "--start-timeout", type=float, default=900.0, help="seconds the server gets to be ready"
    )


async def _start_server(args: argparse.Namespace) -> ServeProcess:
    pipeline = ("--pipeline", args.pipeline) if args.pipeline else ()
    served = await ServeProcess.start("--retain-requests", str(args.retain_requests), *pipeline)
    try:
        await served.ready(args.start_timeout)
    except BaseException:
        await served.close()
        raise
    return served


async def _load(url: str, n: int, concurrency: int, max_tokens: int) -> tuple[int, int]:
    """``n`` chat requests with audio output; (ok, errors)."""
    import aiohttp

    body = {
        "messages": [{"role": "user", "content": "Say something about the sea."}],
        "modalities": ["text", "audio"],
        "audio": {"format": "wav", "voice": "alloy"},
        "max_completion_tokens": max_tokens,
    }
    ok = errors = 0
    started = 0
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency), timeout=timeout
    ) as http:

        async def client() -> None:
            nonlocal ok, errors, started
            while started < n:
                started += 1
                async with http.post(url + "/v1/chat/completions", json=body) as r:
                    await r.read()
                    if r.status == 200:
                        ok += 1
                    else:
                        errors += 1

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return ok, errors


async def _metric(url: str, name: str) -> float | None:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    import psutil

    from omnix.pipelines.registry import DEFAULT_PIPELINE

    # Builds what is missing and exports OMNIX_MODEL_DIR (the server inherits it).
    pipeline = load_pipeline_arg(args.pipeline or DEFAULT_PIPELINE)
    prepare_pipeline_models(pipeline, args.model_dir)
    res: dict[str, Any] = {
        "load_average_start": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    t0 = time.perf_counter()
    served = await _start_server(args)
    url = served.url
    res["server_ready_s"] = round(time.perf_counter() - t0, 1)
    try:
        server = psutil.Process(served.proc.pid)
        w_ok, w_err = await _load(url, args.warmup, args.concurrency, args.max_tokens)
        await asyncio.sleep(1.0)  # the projection and the sweep catch up
        rss0 = server.memory_info().rss
        t1 = time.perf_counter()
        ok = errors = 0
        curve: list[float] = []  # RSS (MB) after each segment: where it flattens
        left = args.requests
        while left > 0:
            n = min(left, args.segment)
            s_ok, s_err = await _load(url, n, args.concurrency, args.max_tokens)
            ok, errors, left = ok + s_ok, errors + s_err, left - n
            curve.append(round(server.memory_info().rss / 2**20, 1))
        elapsed = time.perf_counter() - t1
        await asyncio.sleep(1.0)
        rss1 = server.memory_info().rss
        retained = await _metric(url, "omnix_requests_retained")
    finally:
        await served.stop(grace_s=60.0)
    res.update(
        {
            "rss_growth_kb_per_request": round((rss1 - rss0) / 1024 / max(1, args.requests), 3),
            "requests": args.requests,
            "rss_start_mb": round(rss0 / 2**20, 1),
            "rss_end_mb": round(rss1 / 2**20, 1),
            "rss_mb_by_segment": curve,
            "segment": args.segment,
            "retained_requests": None if retained is None else int(retained),
            "retain_requests": args.retain_requests,
            "warmup": args.warmup,
            "warmup_errors": w_err,
            "warmup_ok": w_ok,
            "ok": ok,
            "errors": errors,
            "concurrency": args.concurrency,
            "requests_per_s": round(args.requests / elapsed, 2) if elapsed else None,
            "rss_measured": "the omnix serve process only (not its worker processes)",
            "load_average_end": round(os.getloadavg()[0], 2),
        }
    )
    return res


def run(args: argparse.Namespace) -> int:
    if args.warmup < 0 or args.requests < 1 or args.concurrency < 1 or args.segment < 1:
        raise UsageError("--requests, --concurrency and --segment must be >= 1, --warmup >= 0")
    res = run_on_loop(_bench(args))
    if not args.json:
        print(
            f"server RSS {res['rss_start_mb']} MB -> {res['rss_end_mb']} MB over {res['requests']} "
            f"chat requests with audio ({res['errors']} errors): "
            f"{res['rss_growth_kb_per_request']} KB per request (target <= 2); "
            f"{res['retained_requests']} requests retained (--retain-requests {res['retain_requests']})"
        )
        print(f"RSS after each {res['segment']} requests (MB): {res['rss_mb_by_segment']}")
        print(
            f"load average (1 min) {res['load_average_start']} at start, {res['load_average_end']} at end, "
            f"on {res['cpus']} CPUs"
        )
    else:
        print(json.dumps(res))
    return 0 if res["errors"] == 0 else 1
