"""``omnix bench diffusion``: images/s alone and four at a time, and cancels.

Owns one measurement of a diffusion pipeline served on its real engines
(default ``tiny-image``, whose stage batches up to 4 requests of equal
shape into one pipeline call), over HTTP on loopback:

* ``images_per_s_c1``: ``POST /v1/images/generations`` one at a time;
* ``images_per_s_c4``: four clients, each sending its next request when
  its last one answered (equal shapes, so the engine can batch them);
* ``images_per_s_c4_over_c1``: their ratio (the issue's target is 1.5 on
  the tiny image model).  The two levels alternate over ``--rounds``
  rounds of ``--requests`` images each, so a drift in the host's speed
  falls on both;
* ``e2e_ms_p50_c1`` / ``_c4``: a request's time to its answer;
* ``cancel_steps_after_p50`` / ``_max``: for ``--cancels`` long requests
  cancelled (``POST /v1/requests/{id}/cancel``) once they have reported
  three steps, how many ``progress`` events the log holds after the
  ``cancel_requested``: the step in flight and any already on their way;
  ``cancel_ms_p50``: from the cancel to the request's end.

Then ``caches``: for each of ``--cache-pipelines`` (tiny-image and
tiny-video), each step cache of ``--cache`` against none: steps/s, images
(or video seconds) a second at c=1 and c=4, and fidelity to the uncached
output of the same seed (``diffusion_cache.py``).  Then ``cfg_batch``:
on ``--cfg-pipeline`` (tiny-video), classifier-free guidance's two
forwards a step batched into one against two: steps/s at c=1 and c=4 and
fidelity to the unbatched output of the same seed (``diffusion_cfg.py``).
``--part`` runs one of the three alone.

``--device cuda`` (or ``--sizes real|tiny``) measures instead the same
cache table on a published model at its real size with random weights
(Wan 2.1 T2V 1.3B, FLUX.1-dev): ``diffusion_gpu.py``.

Prints one JSON object on its last line with ``--json``; ``load_avg_1m``
says how busy the host was.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any

from omnix.bench import diffusion_gpu
from omnix.bench.diffusion_cache import DEFAULT_CACHES, cache_table
from omnix.bench.diffusion_cfg import cfg_table
from omnix.bench.loop import run_on_loop
from omnix.bench.pipeline_arg import load_pipeline_arg
from omnix.events.types import CancelRequested, Progress
from omnix.usage import UsageError, count, int_in


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pipeline", default="tiny-image", metavar="NAME|PATH", help="a diffusion pipeline"
    )
    parser.add_argument(
        "--requests", type=count, default=24, help="images per level per round (default 24)"
    )
    parser.add_argument("--rounds", type=count, default=3, help="rounds of both levels (default 3)")
    parser.add_argument(
        "--concurrency", type=count, default=4, help="clients of the batched level (default 4)"
    )
    parser.add_argument(
        "--steps",
        type=count,
        default=None,
        help="denoising steps (default 8; the published-size table: 20, 8 at --sizes tiny)",
    )
    parser.add_argument("--size", type=count, default=64, help="width and height (default 64)")
    parser.add_argument(
        "--cancels", type=int_in(0, what="a count"), default=5, help="requests to cancel (5)"
    )
    parser.add_argument(
        "--part",
        choices=("all", "http", "caches", "cfg"),
        default="all",
        help="the HTTP measurement, the cache table, the CFG batching table, or all (default)",
    )
    parser.add_argument(
        "--cache",
        action="append",
        default=None,
        metavar="KIND[,OPT=VALUE...]",
        help="a step cache to measure against none, as omnix serve --cache takes it (repeat; "
        f"default: {' '.join(DEFAULT_CACHES)})",
    )
    parser.add_argument(
        "--cache-pipelines",
        default="tiny-image,tiny-video",
        metavar="NAME,...",
        help="the pipelines of the cache table (default tiny-image,tiny-video)",
    )
    parser.add_argument(
        "--cache-requests",
        type=count,
        default=8,
        help="requests alone, and calls of four, per cache in the cache table (default 8)",
    )
    parser.add_argument(
        "--cfg-pipeline",
        default="tiny-video",
        metavar="NAME|PATH",
        help="the pipeline of the CFG batching table (default tiny-video; tiny-image: Flux "
        "with true CFG)",
    )
    parser.add_argument(
        "--cfg-requests",
        type=count,
        default=8,
        help="requests alone, and calls of four, per side of the CFG batching table (default 8)",
    )
    diffusion_gpu.add_arguments(parser)


class _Client:
    def __init__(self, session: Any, url: str, body: dict[str, Any]) -> None:
        self.session = session
        self.url = url
        self.body = body
        self.errors: list[str] = []
        self.e2e: list[float] = []

    async def one(self, seed: int) -> None:
        t0 = time.perf_counter()
        async with self.session.post(
            self.url + "/v1/images/generations", json={**self.body, "seed": seed}
        ) as r:
            await r.read()
            if r.status != 200:
                self.errors.append(f"{r.status}")
                return
        self.e2e.append((time.perf_counter() - t0) * 1000)

    async def level(self, n: int, clients: int, seed: int) -> float:
        """Seconds to answer ``n`` requests from ``clients`` closed-loop clients."""
        todo = iter(range(n))

        async def worker() -> None:
            for i in todo:
                await self.one(seed + i)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return time.perf_counter() - t0


async def _cancels(server: Any, session: Any, n: int, size: int) -> tuple[list[int], list[float]]:
    """Progress events after each cancel, and ms from cancel to the end."""
    omni = server.omni
    after: list[int] = []
    took: list[float] = []
    for k in range(n):
        rid = f"bench-cancel-{k}-{os.getpid()}"
        body = {"prompt": "a long render", "size": f"{size}x{size}", "steps": 1000}
        post = asyncio.ensure_future(
            session.post(
                server.url + "/v1/images/generations", json=body, headers={"X-Request-Id": rid}
            )
        )
        while True:
            rs = omni.state(rid)
            steps = max((st.progress_step for st in rs.stages), default=0) if rs else 0
            if steps >= 3:
                break
            await asyncio.sleep(0.002)
        t0 = time.perf_counter()
        async with session.post(server.url + f"/v1/requests/{rid}/cancel") as r:
            await r.read()
        resp = await post
        resp.release()
        took.append((time.perf_counter() - t0) * 1000)
        events = list(omni.log.events_for(rid))
        cut = next(e.pos for e in events if isinstance(e, CancelRequested))
        after.append(sum(1 for e in events if isinstance(e, Progress) and e.pos > cut))
    return after, took


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if args.part in ("all", "http"):
        res.update(await _http(args))
    if args.part in ("all", "caches"):
        specs = tuple(args.cache or DEFAULT_CACHES)
        res["caches"] = {
            name: await cache_table(load_pipeline_arg(name), specs, args.cache_requests, args.steps)
            for name in filter(None, (n.strip() for n in args.cache_pipelines.split(",")))
        }
        res["cache_steps"] = args.steps
    if args.part in ("all", "cfg"):
        cfg = load_pipeline_arg(args.cfg_pipeline)
        res["cfg_batch"] = await cfg_table(cfg, args.cfg_requests, args.steps)
        res["cfg_batch"]["steps"] = args.steps
    if args.part != "http":
        res.setdefault("errors", 0)
        res["load_avg_1m"] = round(os.getloadavg()[0], 2)
    return res


async def _http(args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    from omnix.testing.serving import serve_scripted

    cfg = load_pipeline_arg(args.pipeline)
    if "image" not in cfg.outputs:
        raise UsageError(f"pipeline {cfg.name!r} makes no images: give a diffusion pipeline")
    body = {"prompt": "a red cube", "size": f"{args.size}x{args.size}", "steps": args.steps}
    n, rounds = args.requests, args.rounds
    async with serve_scripted(cfg, processes=True, telemetry=False) as server:
        timeout = aiohttp.ClientTimeout(total=3600)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            one, many = _Client(session, server.url, body), _Client(session, server.url, body)
            await one.level(args.concurrency * 2, args.concurrency, 0)  # warm up
            one.e2e.clear()
            t1 = t4 = 0.0
            for r in range(rounds):
                t1 += await one.level(n, 1, 1000 * r)
                t4 += await many.level(n, args.concurrency, 1000 * r + 500)
            after, took = await _cancels(server, session, args.cancels, args.size)
    c1, c4 = n * rounds / t1, n * rounds / t4
    errors = one.errors + many.errors
    return {
        "images_per_s_c1": round(c1, 2),
        "images_per_s_c4": round(c4, 2),
        "images_per_s_c4_over_c1": round(c4 / c1, 3),
        "e2e_ms_p50_c1": round(statistics.median(one.e2e), 1) if one.e2e else None,
        "e2e_ms_p50_c4": round(statistics.median(many.e2e), 1) if many.e2e else None,
        "cancel_steps_after_p50": statistics.median(after) if after else None,
        "cancel_steps_after_max": max(after) if after else None,
        "cancel_ms_p50": round(statistics.median(took), 1) if took else None,
        "concurrency": args.concurrency,
        "requests": n * rounds,
        "steps": args.steps,
        "size": args.size,
        "pipeline": cfg.name,
        "errors": len(errors),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def run(args: argparse.Namespace) -> int:
    if diffusion_gpu.wanted(args):
        return diffusion_gpu.run(args)
    args.steps = args.steps or 8
    res = run_on_loop(_bench(args))
    if not getattr(args, "json", False) and "caches" in res:
        for name, table in res["caches"].items():
            for spec, row in table.items():
                print(f"{name} {spec}: {row}")
    if not getattr(args, "json", False) and "cfg_batch" in res:
        table = res["cfg_batch"]
        for side in ("off", "on"):
            print(f"{table['pipeline']} cfg_batch {side}: {table[side]}")
    if not getattr(args, "json", False) and "images_per_s_c1" in res:
        print(
            f"{res['pipeline']}: {res['images_per_s_c1']} images/s alone, "
            f"{res['images_per_s_c4']} at {res['concurrency']} (x{res['images_per_s_c4_over_c1']}); "
            f"cancel: {res['cancel_steps_after_max']} steps after at most, "
            f"{res['cancel_ms_p50']} ms p50; load {res['load_avg_1m']}"
        )
    print(json.dumps(res))
    if res["errors"]:
        print(f"{res['errors']} requests failed", file=sys.stderr)
        return 1
    return 0
