"""``omnix bench log --backend nats``: appends acknowledged through JetStream.

Owns: the replicated log's throughput figures.  It starts its own real
servers (``omnix.testing.nats_server``): one ``nats-server -js`` node,
then a three-node JetStream cluster on loopback, and appends the log
benchmark's event mix (``logwork.py``'s workload) through ``NatsLog`` in
leader mode, yielding to the loop every ``--yield-every`` appends as a
server does between requests (the publisher runs then: group commit).

Figures (``--json`` adds one JSON object as the last line):

* ``nats_append_events_per_s``: events appended (validated, stored,
  folded) and acked by a one-node JetStream (R=1, file storage), timed from
  the first append until ``flush()`` returned for the last.
* ``nats_append_events_per_s_r3``: the same on a three-node cluster with
  an R=3 stream (each batch acked once a quorum stored it).
* ``nats_messages`` / ``nats_events_per_message``: the messages the R=1 run
  published (group commit: many events per message).

The best of ``--repeat`` runs is reported, the median beside it; the
1-minute load average comes with them (the servers share this machine's
cores with the benchmark).  Does not own the log nor the servers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path

import msgspec

from omnix.bench.logwork import _machine, _Timer, batches
from omnix.events.natslog import NatsLog
from omnix.testing.nats_server import NatsCluster, NatsServer

TARGETS = {"nats_append_events_per_s": (">=", 50_000)}


class NatsLogBenchResult(msgspec.Struct, frozen=True):
    nats_append_events_per_s: float
    nats_append_events_per_s_r3: float
    nats_append_events_per_s_median: float
    nats_append_events_per_s_r3_median: float
    nats_messages: int
    nats_events_per_message: float
    events: int
    peak_rss_mb: float
    load_average: float


async def _one(
    url: str, name: str, n: int, conc: int, every: int, replicas: int
) -> tuple[float, int]:
    """Append ``n`` events to a fresh log; (wall seconds until all acked, messages)."""
    log = await NatsLog.open(url, name=name, replicas=replicas, snapshot_every=0, timeout_s=30)
    timer = _Timer()
    try:
        for batch in batches(n, conc):
            append = log.append
            with timer:
                for i, ev in enumerate(batch):
                    append(ev)
                    if i % every == 0:
                        await asyncio.sleep(0)
                await asyncio.sleep(0)
        with timer:
            await log.flush()
        info = await log.conn.js.stream_info(log.names.stream)
        assert log.durable_pos == n
        return timer.wall, info.state.messages
    finally:
        await log.aclose()


async def _runs(
    url: str, tag: str, args: argparse.Namespace, replicas: int
) -> tuple[list[float], int]:
    rates = []
    msgs = 0
    for k in range(max(1, args.repeat)):
        wall, msgs = await _one(
            url, f"bench{tag}{k}", args.nats_events, args.concurrency, args.yield_every, replicas
        )
        rates.append(args.nats_events / wall)
    return rates, msgs


def _print(label: str, rates: list[float]) -> None:
    print(
        f"  {label:<30}{max(rates):12,.0f} events/s   (median {statistics.median(rates):,.0f}; "
        "appended, folded and acked)"
    )


def run_nats(args: argparse.Namespace) -> int:
    n = args.nats_events
    print(
        f"omnix bench log --backend nats: {n:,} events per run, {args.concurrency} requests "
        f"in flight, the loop yields every {args.yield_every} appends"
    )
    with tempfile.TemporaryDirectory(prefix="omnix-bench-nats-") as tmp:
        root = Path(tmp)
        with NatsServer(root / "single") as srv:
            r1, msgs = asyncio.run(_runs(srv.url, "r1", args, 1))
        _print("NatsLog, 1 node, R=1", r1)
        print(f"  {'':<30}{msgs:12,d} messages ({n / max(msgs, 1):,.0f} events each: group commit)")
        with NatsCluster(root / "cluster") as cluster:
            r3, _ = asyncio.run(_runs(cluster.url, "r3", args, 3))
        _print("NatsLog, 3 nodes, R=3", r3)
    rss, load = _machine()
    result = NatsLogBenchResult(
        nats_append_events_per_s=round(max(r1)),
        nats_append_events_per_s_r3=round(max(r3)),
        nats_append_events_per_s_median=round(statistics.median(r1)),
        nats_append_events_per_s_r3_median=round(statistics.median(r3)),
        nats_messages=msgs,
        nats_events_per_message=round(n / max(msgs, 1), 1),
        events=n,
        peak_rss_mb=round(rss, 1),
        load_average=round(load, 2),
    )
    failed = [
        f"{k}={getattr(result, k)} (target {op} {t})"
        for k, (op, t) in TARGETS.items()
        if not (getattr(result, k) >= t if op == ">=" else getattr(result, k) <= t)
    ]
    print("  targets: " + ("all met" if not failed else "MISSED " + "; ".join(failed)))
    if args.json:
        print(json.dumps(msgspec.to_builtins(result)))
    return 0
