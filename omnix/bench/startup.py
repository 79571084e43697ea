"""``omnix bench startup``: how long ``omnix serve`` takes to be ready, and at what CPU.

Owns two figures of one pipeline (``--pipeline``, tiny-omni by default),
each measured ``--runs`` times, warm and cold alternating:

* ``ready_s``: from starting ``omnix serve`` to its "ready in" line (every
  spawned worker ready);
* ``cpu_s``: the CPU time (user + system) the server and every process
  under it had spent by then: the workers, their engines' processes, the
  zygote.

Warm is the default (workers forked from a zygote, docs/runtime.md); cold
is ``--cold-workers`` (each worker a fresh Python).  The JSON has
``ready_s_{warm,cold}_{min,median}``, ``cpu_s_{warm,cold}_{min,median}``,
``ready_cold_over_warm`` and ``cpu_cold_over_warm`` (medians), and the load
average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

from omnix.bench.report import progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pipeline", default="tiny-omni", help="a built-in name or a file")
    parser.add_argument("--runs", type=int, default=3, help="starts of each kind (default 3)")
    parser.add_argument(
        "--timeout", type=float, default=300.0, metavar="S", help="give a start up after S s"
    )


def _tree_cpu(pid: int, seen: dict[int, float]) -> None:
    """Each process under ``pid`` (itself included): its CPU seconds so far."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        seen[p.pid] = max(seen.get(p.pid, 0.0), t.user + t.system)


async def _start(pipeline: str, cold: bool, timeout: float) -> tuple[float, float]:  # noqa: ASYNC109
    from omnix.testing.served import ServeProcess

    t0 = time.perf_counter()
    proc = await ServeProcess.start("--pipeline", pipeline, *(("--cold-workers",) if cold else ()))
    seen: dict[int, float] = {}
    try:
        ready = asyncio.ensure_future(proc.ready(timeout))
        while not ready.done():
            _tree_cpu(proc.proc.pid, seen)
            await asyncio.wait([ready], timeout=0.1)
        ready.result()
        ready_s = time.perf_counter() - t0
        _tree_cpu(proc.proc.pid, seen)
        return ready_s, sum(seen.values())
    finally:
        await proc.stop(30.0)


def run(args: argparse.Namespace) -> int:
    if args.runs < 1:
        raise SystemExit(f"{args._prog}: --runs must be at least 1")
    load_before = os.getloadavg()[0]
    began = time.perf_counter()
    got: dict[str, list[tuple[float, float]]] = {"warm": [], "cold": []}
    for i in range(args.runs):
        for kind in ("warm", "cold"):
            ready_s, cpu_s = asyncio.run(_start(args.pipeline, kind == "cold", args.timeout))
            got[kind].append((ready_s, cpu_s))
            progress(
                f"run {i + 1}/{args.runs} {kind}: ready in {ready_s:.1f} s, {cpu_s:.1f} CPU-s",
                began,
            )
    out: dict[str, float | int | str] = {"pipeline": args.pipeline, "runs": args.runs}
    for kind, rows in got.items():
        for j, name in enumerate(("ready_s", "cpu_s")):
            values = [r[j] for r in rows]
            out[f"{name}_{kind}_min"] = round(min(values), 2)
            out[f"{name}_{kind}_median"] = round(statistics.median(values), 2)
    out["ready_cold_over_warm"] = round(
        float(out["ready_s_cold_median"]) / float(out["ready_s_warm_median"]), 2
    )
    out["cpu_cold_over_warm"] = round(
        float(out["cpu_s_cold_median"]) / float(out["cpu_s_warm_median"]), 2
    )
    out["load_avg_1m_before"] = round(load_before, 2)
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:28} {v}")
    return 0
