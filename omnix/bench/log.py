"""``omnix bench log``: how fast the core appends, stores and folds.

Owns: the log benchmark (the memory and disk append paths, the 1M-event
fold, state size, peak memory).  Does not own the log or the reducer; it
only drives their public API.  The event mix and the timers are
``logwork.py``'s; ``--backend nats`` runs the replicated log's figures
instead (``lognats.py``).

Figures (``--json`` adds one JSON object as the last line):

* ``memory_append_fold_events_per_s``: ``MemoryLog.append`` of pre-built
  events (validation against the reducer, position and time stamp, store,
  fold: everything but building the event objects, which the producer
  pays), on the system clock.
* ``disk_batched_fsync_events_per_s``: the same into a ``DiskLog`` with
  ``fsync="batch"`` (5 ms group commit), timed until ``close()`` has
  fsynced the last record.
* ``fold_1m_seconds``: ``fold(log.read())`` over that log of ``--events``
  (default 1M) events: read the segments, decode, reduce into a fresh
  state; the log keeps no event objects.  ``reopen_1m_seconds`` beside it
  is what a restart costs without snapshots: recovery also verifies every
  checksum and rebuilds the position and request indexes.
* ``reopen_after_1m_events_s``: the same 1M events appended to a
  ``DiskLog`` with its default snapshots (every 100,000 appends) and a
  ``Retention`` with its default policy (2,000 ended requests), then
  reopened: the newest snapshot plus the records from the oldest retained
  request on (``reopen_after_1m_folded_events`` were folded,
  ``reopen_after_1m_indexed_events`` read).
* ``memory_append_fold_retention_events_per_s``: the memory append run
  with a ``Retention`` (default policy) listening: its accounting's cost.
* ``state_bytes_per_request``: measured memory the fold retains per request
  (tracemalloc over 5,000 requests' decoded events: the state structs,
  their strings, the dict slot).  The deep ``sys.getsizeof`` of one
  finished 3-stage ``RequestState`` (every reachable object counted once,
  shared strings included: an upper bound) and its msgpack size are
  printed beside it.
* ``peak_rss_mb``: the process's peak resident set.

Rates and times are wall-clock, the best of ``--repeat`` runs (the median
is printed beside it).  Each also comes as CPU time of this process
(``*_cpu_*`` keys): on a machine shared with other work, wall time includes
waiting for a core, CPU time does not.

The mix: each request is admitted, routed to thinker (8 text chunks), to
talker (two input pieces, the first after thinker's third chunk: async
chunk; 6 codec chunks) and to code2wav (4 audio chunks carrying blob
references), each stage started and finished, then finished: 31 events,
with ``--concurrency`` requests in flight, interleaved.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from omnix.bench.lognats import run_nats
from omnix.bench.logwork import _machine, _Timer, batches, request_lifecycle, workload
from omnix.events.codec import decode_event, encode_event
from omnix.events.disklog import DiskLog, LogConfig
from omnix.events.log import EventLog, MemoryLog
from omnix.events.reducer import Fold, RequestState, fold
from omnix.events.retention import Retention, RetentionPolicy
from omnix.usage import UsageError, count

TARGETS = {
    "memory_append_fold_events_per_s": (">=", 200_000),
    "disk_batched_fsync_events_per_s": (">=", 100_000),
    "fold_1m_seconds": ("<=", 5.0),
    "state_bytes_per_request": ("<=", 2048),
    "reopen_after_1m_events_s": ("<=", 0.5),
}


class LogBenchResult(msgspec.Struct, frozen=True):
    memory_append_fold_events_per_s: float
    disk_batched_fsync_events_per_s: float
    fold_1m_seconds: float
    state_bytes_per_request: int
    peak_rss_mb: float
    # context
    events: int
    memory_events: int
    reopen_1m_seconds: float
    memory_append_fold_events_per_cpu_s: float
    disk_batched_fsync_events_per_cpu_s: float
    fold_1m_cpu_seconds: float
    reopen_1m_cpu_seconds: float
    state_deep_sizeof_bytes: int
    state_encoded_bytes: int
    disk_bytes_per_event: float
    disk_index_bytes_per_event: float
    load_average: float
    reopen_after_1m_events_s: float = 0.0
    reopen_after_1m_cpu_s: float = 0.0
    reopen_after_1m_folded_events: int = 0
    reopen_after_1m_indexed_events: int = 0
    memory_append_fold_retention_events_per_s: float = 0.0
    disk_retention_snapshots_events_per_s: float = 0.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--events",
        type=count,
        default=1_000_000,
        help="events for the disk and fold runs (default 1M)",
    )
    parser.add_argument(
        "--memory-events", type=count, default=300_000, help="events for the memory append run"
    )
    parser.add_argument("--concurrency", type=count, default=256, help="requests in flight")
    parser.add_argument(
        "--repeat",
        type=count,
        default=3,
        help="runs of each timed part; the best is reported (default 3)",
    )
    parser.add_argument(
        "--dir", default=None, help="where to write the disk log (default: a temp dir)"
    )
    parser.add_argument(
        "--backend",
        choices=("disk", "nats"),
        default="disk",
        help="disk: the memory and disk logs (default); nats: the log replicated on "
        "JetStream (starts its own nats-server nodes; lognats.py)",
    )
    parser.add_argument(
        "--nats-events",
        type=count,
        default=200_000,
        help="events per run with --backend nats (default 200,000)",
    )
    parser.add_argument(
        "--yield-every",
        type=count,
        default=256,
        help="with --backend nats: appends between two yields to the loop (default 256)",
    )


# --------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------


def deep_sizeof(obj: object) -> int:
    """Bytes of every object reachable from ``obj``, each counted once."""
    seen: set[int] = set()
    stack = [obj]
    total = 0
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, msgspec.Struct):
            stack.extend(getattr(o, f) for f in o.__struct_fields__)
        elif isinstance(o, (tuple, list)):
            stack.extend(o)
        elif isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
    return total


def _timed_appends(log: EventLog, n: int, concurrency: int, close: bool = False) -> _Timer:
    """Append ``n`` events of the workload to ``log``, timing only the
    appends (and the close, whose last group commit makes them durable)."""
    timer = _Timer()
    for batch in batches(n, concurrency):
        append = log.append
        with timer:
            for ev in batch:
                append(ev)
    if close:
        with timer:
            log.close()
    return timer


def bench_memory(n: int, concurrency: int) -> tuple[int, _Timer]:
    log = MemoryLog()
    timer = _timed_appends(log, n, concurrency)
    return len(log), timer


def bench_memory_retention(n: int, concurrency: int) -> tuple[int, _Timer]:
    log = MemoryLog()
    Retention(log, RetentionPolicy())
    timer = _timed_appends(log, n, concurrency)
    return len(log), timer


def bench_disk_retained(root: Path, n: int, concurrency: int) -> tuple[int, _Timer]:
    """Append ``n`` events with default snapshots and retention; return the
    log's length and the append timer (until close)."""
    log = DiskLog(root, LogConfig(fsync="batch"))
    Retention(log, RetentionPolicy())
    timer = _timed_appends(log, n, concurrency, close=True)
    return len(log), timer


def bench_disk(root: Path, n: int, concurrency: int) -> tuple[int, _Timer, int]:
    # No snapshots: the append path and the full refold as before them.
    log = DiskLog(root, LogConfig(fsync="batch", snapshot_every=0))
    timer = _timed_appends(log, n, concurrency, close=True)
    return len(log), timer, sum(p.stat().st_size for p in log.segment_paths())


def state_sizes(concurrency: int, n_req: int = 5_000) -> tuple[int, int, int]:
    """(bytes the fold retains per request, deep bytes of one finished
    request's state, its msgpack bytes).

    The first is measured: fold ``n_req`` requests' events decoded from their
    encoded form (as a reopened log does, so every string is the request's
    own copy) under tracemalloc, and divide what stays allocated by the
    number of requests: the state structs, their strings, the dict slot.
    """
    log = MemoryLog(events=request_lifecycle("req-000000042"))
    rs = log.state.requests["req-000000042"]
    assert rs.status == "finished" and len(rs.stages) == 3
    deep = deep_sizeof(rs)
    encoded = len(msgspec.msgpack.encode(rs))
    blobs = [encode_event(ev) for ev in MemoryLog(events=workload(31 * n_req, concurrency)).read()]
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    f = Fold()
    for b in blobs:
        f.apply(decode_event(b))
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert all(isinstance(s, RequestState) for s in f.requests.values())
    return retained // len(f.requests), deep, encoded


def _report(label: str, runs: list[_Timer], count: int, unit: str) -> _Timer:
    """Print the best of the runs (the least disturbed by other processes),
    the median beside it so the spread shows; return the best."""
    best = min(runs, key=lambda t: t.wall)
    med = statistics.median(t.wall for t in runs)
    if unit == "rate":
        print(
            f"  {label:<30}{count / best.wall:12,.0f} events/s   "
            f"(median {count / med:,.0f}; {count / best.cpu:,.0f} per CPU-second)"
        )
    else:
        print(f"  {label:<30}{best.wall:12.2f} s   (median {med:.2f} s; {best.cpu:.2f} CPU-s)")
    return best


def _repeat(reps: int, one: Callable[[], tuple[int, _Timer]]) -> tuple[int, list[_Timer]]:
    """``one()`` ``reps`` times (a collection after each): its count and every timer."""
    runs = []
    count = 0
    for _ in range(reps):
        count, t = one()
        runs.append(t)
        gc.collect()
    return count, runs


def _memory_phase(args: argparse.Namespace, reps: int) -> tuple[float, float, float]:
    """Memory appends, without and with retention: (events/s, per CPU-s, with retention)."""
    conc = args.concurrency
    n_mem, runs = _repeat(reps, lambda: bench_memory(args.memory_events, conc))
    t_mem = _report("memory append+validate+fold", runs, n_mem, "rate")
    n_ret, runs = _repeat(reps, lambda: bench_memory_retention(args.memory_events, conc))
    t_ret = _report("  ... with retention listening", runs, n_ret, "rate")
    return n_mem / t_mem.wall, n_mem / t_mem.cpu, n_ret / t_ret.wall


def _disk_phase(root: Path, n: int, conc: int, reps: int) -> tuple[float, float, int]:
    """Disk appends, fsync=batch: (events/s, per CPU-s, bytes on disk)."""
    disk_bytes = 0

    def one() -> tuple[int, _Timer]:
        nonlocal disk_bytes
        if root.exists():
            shutil.rmtree(root)
        count, t, disk_bytes = bench_disk(root, n, conc)
        return count, t

    n_disk, runs = _repeat(reps, one)
    t_disk = _report("disk append, fsync=batch", runs, n_disk, "rate")
    print(f"  {'':<30}{disk_bytes / n:12.1f} bytes/event on disk")
    return n_disk / t_disk.wall, n_disk / t_disk.cpu, disk_bytes


def _reopen_phase(root: Path, n: int, reps: int) -> tuple[_Timer, _Timer, float]:
    """Reopening the disk log without snapshots, and folding what it reads:
    (fold, reopen, index bytes per event)."""
    reopen_runs, fold_runs = [], []
    index_bytes = 0.0
    for _ in range(reps):
        gc.collect()
        with _Timer() as t:
            log = DiskLog(root, LogConfig(snapshot_every=0))
        reopen_runs.append(t)
        gc.collect()
        with _Timer() as t:
            replay = fold(log.read())
        fold_runs.append(t)
        assert replay.digest() == log.state.digest()
        index_bytes = log.index_bytes / len(log)
        log.close()
        del log, replay
    t_fold = _report("fold(log.read()): decode+reduce", fold_runs, n, "time")
    t_reopen = _report("reopen: verify+fold+index", reopen_runs, n, "time")
    return t_fold, t_reopen, index_bytes


def _retained_phase(tmp: Path, n: int, conc: int, reps: int) -> dict[str, Any]:
    """The same history with snapshots and retention: reopen folds the
    newest snapshot's suffix only.  The result's fields."""
    kept = tmp / "retained"
    if kept.exists():
        shutil.rmtree(kept)
    n_kept, t_kept_append = bench_disk_retained(kept, n, conc)
    kept_runs = []
    folded = indexed = 0
    for _ in range(reps):
        gc.collect()
        with _Timer() as t:
            klog = DiskLog(kept)
        kept_runs.append(t)
        folded, indexed = klog.recovery.folded, klog.recovery.indexed
        assert len(klog) == n_kept
        klog.close()
        del klog
    t_kept = _report("reopen after 1M, snapshots", kept_runs, n, "time")
    print(
        f"  {'':<30}{folded:12,d} events folded, {indexed:,} read (snapshot + suffix); "
        f"appends with retention+snapshots: {n_kept / t_kept_append.wall:,.0f} events/s"
    )
    return {
        "reopen_after_1m_events_s": round(t_kept.wall, 3),
        "reopen_after_1m_cpu_s": round(t_kept.cpu, 3),
        "reopen_after_1m_folded_events": folded,
        "reopen_after_1m_indexed_events": indexed,
        "disk_retention_snapshots_events_per_s": round(n_kept / t_kept_append.wall),
    }


def _sizes(conc: int, n: int) -> tuple[int, int, int]:
    """State bytes per request (printed): (retained, deep sizeof, msgpack)."""
    # 5,000 requests, fewer in a quick run (--events below 155,000).
    per_req, deep, encoded = state_sizes(conc, min(5_000, max(100, n // 31)))
    print(
        f"  state per request             {per_req:12,d} bytes retained by the fold per "
        "request (tracemalloc, decoded events)"
    )
    print(
        f"                                {deep:12,d} bytes deep sizeof of one finished "
        f"3-stage RequestState (shared strings counted); {encoded} bytes msgpack"
    )
    return per_req, deep, encoded


def _check_targets(result: LogBenchResult) -> None:
    failed = []
    for key, (op, target) in TARGETS.items():
        value = getattr(result, key)
        ok = value >= target if op == ">=" else value <= target
        if not ok:
            failed.append(f"{key}={value} (target {op} {target})")
    print("  targets: " + ("all met" if not failed else "MISSED " + "; ".join(failed)))


def run(args: argparse.Namespace) -> int:
    if args.backend == "nats":
        return run_nats(args)
    n = args.events
    conc = args.concurrency
    tmp = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="omnix-bench-log-"))
    try:
        tmp.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"--dir {tmp}: cannot write the disk log there ({exc.strerror or exc})"
        ) from None
    root = tmp / "log"
    if root.exists():
        shutil.rmtree(root)
    try:
        print(
            f"omnix bench log: {n:,} events (disk, fold), {args.memory_events:,} (memory), "
            f"{conc} requests in flight, 31 events per request"
        )
        reps = max(1, args.repeat)
        mem_rate, mem_cpu_rate, ret_rate = _memory_phase(args, reps)
        disk_rate, disk_cpu_rate, disk_bytes = _disk_phase(root, n, conc, reps)
        t_fold, t_reopen, index_bytes = _reopen_phase(root, n, reps)
        retained = _retained_phase(tmp, n, conc, reps)
        print(
            f"  disk log index                {index_bytes:12.1f} bytes/event in memory "
            f"(+ one dict entry per request); no event objects kept"
        )
        gc.collect()
        per_req, deep, encoded = _sizes(conc, n)
        rss, load = _machine()
        result = LogBenchResult(
            memory_append_fold_events_per_s=round(mem_rate),
            disk_batched_fsync_events_per_s=round(disk_rate),
            fold_1m_seconds=round(t_fold.wall, 3),
            state_bytes_per_request=per_req,
            peak_rss_mb=round(rss, 1),
            events=n,
            memory_events=args.memory_events,
            reopen_1m_seconds=round(t_reopen.wall, 3),
            memory_append_fold_events_per_cpu_s=round(mem_cpu_rate),
            disk_batched_fsync_events_per_cpu_s=round(disk_cpu_rate),
            fold_1m_cpu_seconds=round(t_fold.cpu, 3),
            reopen_1m_cpu_seconds=round(t_reopen.cpu, 3),
            state_deep_sizeof_bytes=deep,
            state_encoded_bytes=encoded,
            disk_bytes_per_event=round(disk_bytes / n, 1),
            disk_index_bytes_per_event=round(index_bytes, 1),
            load_average=round(load, 2),
            memory_append_fold_retention_events_per_s=round(ret_rate),
            **retained,
        )
        _check_targets(result)
        if args.json:
            print(json.dumps(msgspec.to_builtins(result)))
        return 0
    finally:
        if not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)
