"""``omnix bench telemetry``: log throughput with the telemetry projection on vs off.

Owns: the benchmark only (not the projection, ``omnix/telemetry``).

What it measures: the CPU cost of appending synthetic tiny-omni-shaped
requests (``omnix.telemetry.synthetic``: streamed text, sentence-forwarded
talker input, codec frames, audio chunks with blob refs -- about 175 events
a request, 1 in 20 cancelled midway) to a ``MemoryLog``, with and without
``Telemetry.run(log)`` following it as it would live (Prometheus reader
attached; no tracer, since spans are built only when OTLP is configured).

How, on a shared machine: passes of ``--requests`` requests alternate
between a log followed by the projection and one that is not, in pairs
(the order inside a pair alternating), each timed in CPU time of this
thread from the first append until the projection has read the last event.
One ``Telemetry`` follows every "on" pass, as one follows a server's log
for its life, so its periodic bucketing is paid where it falls.  CPU time
keeps other processes' load out of the figure; whole passes keep every
cost the projection adds (its wake-ups, its passes, its bucketing) in the
pass it belongs to: in interleaved blocks of a few requests, work the
projection defers by its polling interval would land in whichever block
was running, sometimes an "off" one (a dry run that does nothing shows
that as a bias).  The figure is the median of the pairs' off/on time
ratios (= on/off throughput).

A second figure (``telemetry_traces_throughput_ratio``, informative) builds
the spans too and hands them to a discarding exporter.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import msgspec
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from omnix.events.clock import ManualClock
from omnix.events.log import MemoryLog
from omnix.events.types import Event
from omnix.telemetry.setup import Telemetry
from omnix.telemetry.synthetic import Outcome, TinyOmniShape, tiny_omni_events, worker_events
from omnix.usage import count

_T0 = 1_700_000_000_000_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--requests", type=count, default=100, help="requests per pass (default 100)"
    )
    parser.add_argument(
        "--rounds", type=count, default=300, help="pairs of on/off passes (default 300)"
    )
    parser.add_argument(
        "--yield-every", type=count, default=4,
        help="the producer yields to the event loop every N requests (default 4)",
    )  # fmt: skip
    parser.add_argument("--no-traces", action="store_true", help="skip the traces-on figure")


class _Discard(SpanExporter):
    """Spans are built and exported to nowhere: the cost of tracing without I/O."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def workload(n: int, shape: TinyOmniShape | None = None) -> list[list[Event]]:
    """Worker joins, then ``n`` requests' events (one list per request)."""
    shape = shape or TinyOmniShape()
    workers = [msgspec.structs.replace(ev, ts_ns=_T0) for ev in worker_events()]
    out = [workers]
    pos = len(workers)
    for i in range(n):
        outcome: Outcome = "cancelled" if i % 20 == 19 else "finished"
        evs = tiny_omni_events(f"req-{i}", _T0 + i * 50_000_000, pos, shape, outcome=outcome)
        out.append(evs)
        pos += len(evs)
    return out


async def _pass(work: list[list[Event]], tel: Telemetry | None, block: int) -> float:
    """Append ``work`` to a fresh log in blocks of ``block`` requests,
    yielding to the loop after each block as a server's tasks do; with
    ``tel``, its ``run`` task follows the log, as it would live.  Returns
    this thread's CPU seconds from the first append until the projection
    has read the last event, so every cost the projection adds lands in
    the pass it belongs to.  One ``Telemetry`` serves every pass of a mode,
    as one serves a server's life: its series and its bucketing (every
    ``Projection.FOLD_EVERY`` ended requests) carry over."""
    log = MemoryLog(ManualClock(_T0))
    task = None
    if tel is not None:
        task = asyncio.create_task(tel.run(log, 0))
        await asyncio.sleep(0)  # at its first wait, as a live one would be
    gc.collect()
    clock = time.thread_time
    t = clock()
    for k in range(0, len(work), block):
        for evs in work[k : k + block]:
            for ev in evs:
                log.append(ev)
        await asyncio.sleep(0)
    log.close()
    if tel is not None and task is not None:
        tel.projection.wake()
        await task
    elapsed = clock() - t
    if tel is not None:
        assert tel.projection.position == log.next_pos
    return elapsed


async def _measure(args: argparse.Namespace, work: list[list[Event]], mode: str) -> list[float]:
    """Off/on CPU-time ratios of ``--rounds`` pairs of passes, the order
    inside a pair alternating."""
    tel = Telemetry.from_env(
        "tiny-omni", environ={}, span_exporter=_Discard() if mode == "traces" else None
    )
    try:
        warm = work[: max(2, len(work) // 10)]
        await _pass(warm, None, args.yield_every)
        await _pass(warm, tel, args.yield_every)
        ratios: list[float] = []
        for r in range(args.rounds):
            if r % 2:
                t_off = await _pass(work, None, args.yield_every)
                t_on = await _pass(work, tel, args.yield_every)
            else:
                t_on = await _pass(work, tel, args.yield_every)
                t_off = await _pass(work, None, args.yield_every)
            ratios.append(t_off / t_on)
        return ratios
    finally:
        tel.shutdown()


def _off_rate(work: list[list[Event]]) -> float:
    """Requests/s of plain appends (best of 3), for scale."""
    best = float("inf")
    for _ in range(3):
        log = MemoryLog(ManualClock(_T0))
        gc.collect()
        t = time.thread_time()
        for evs in work:
            for ev in evs:
                log.append(ev)
        best = min(best, time.thread_time() - t)
    return (len(work) - 1) / best


def run(args: argparse.Namespace) -> int:
    work = workload(args.requests)
    n_events = sum(len(w) for w in work)

    async def main() -> dict[str, Any]:
        res: dict[str, Any] = {"metrics": await _measure(args, work, "metrics")}
        if not args.no_traces:
            res["traces"] = await _measure(args, work, "traces")
        # One scrape after a round's worth of requests, for scale.
        log = MemoryLog(ManualClock(_T0))
        tel = Telemetry.from_env("tiny-omni", environ={})
        for evs in work:
            for ev in evs:
                log.append(ev)
        tel.catch_up(log)
        t = time.perf_counter()
        _, body = tel.prometheus_text()
        res["scrape_ms"] = (time.perf_counter() - t) * 1e3
        res["scrape_bytes"] = len(body)
        tel.shutdown()
        return res

    res = asyncio.run(main())
    ratios = res["metrics"]
    off_rps = _off_rate(work)
    ratio = statistics.median(ratios)
    quart = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratio, ratio, ratio]
    figures = {
        "telemetry_throughput_ratio": round(ratio, 4),
        "ratio_p25": round(quart[0], 4),
        "ratio_p75": round(quart[2], 4),
        "pairs": len(ratios),
        "requests_per_s_off": round(off_rps, 1),
        "requests_per_s_on_est": round(off_rps * ratio, 1),
        "events_per_request": round(n_events / args.requests, 1),
        "events_per_s_off": round(off_rps * n_events / args.requests),
        "scrape_ms": round(res["scrape_ms"], 2),
        "scrape_bytes": res["scrape_bytes"],
        "requests_per_pass": args.requests,
    }
    if "traces" in res:
        figures["telemetry_traces_throughput_ratio"] = round(statistics.median(res["traces"]), 4)
    print(
        f"telemetry bench: {figures['events_per_request']} events/request, "
        f"{args.requests} requests a pass, {args.rounds} pairs of passes, yielding every {args.yield_every}"
    )
    print(
        f"  off: {figures['requests_per_s_off']:.0f} req/s "
        f"({figures['events_per_s_off']} events/s, CPU time)"
    )
    print(
        f"  on/off (metrics, Prometheus): median {ratio:.4f} "
        f"(quartiles {figures['ratio_p25']:.4f}..{figures['ratio_p75']:.4f}, "
        f"{len(ratios)} pairs of passes)"
    )
    if "telemetry_traces_throughput_ratio" in figures:
        print(
            f"  on/off (+ spans, discarding exporter): median "
            f"{figures['telemetry_traces_throughput_ratio']:.4f}"
        )
    print(f"  one scrape: {figures['scrape_ms']} ms, {figures['scrape_bytes']} bytes")
    if getattr(args, "json", False):
        print(json.dumps(figures))
    return 0
