"""``omnix bench log``: how fast the core appends, stores and folds.

Owns: the log benchmark (a realistic event mix, the memory and disk append
paths, the 1M-event fold, state size, peak memory).  Does not own the log or
the reducer; it only drives their public API.

Figures (``--json`` adds one JSON object as the last line):

* ``memory_append_fold_events_per_s``: ``MemoryLog.append`` of pre-built
  events (validation against the reducer, position and time stamp, store,
  fold: everything but building the event objects, which the producer
  pays), on the system clock.
* ``disk_batched_fsync_events_per_s``: the same into a ``DiskLog`` with
  ``fsync="batch"`` (5 ms group commit), timed until ``close()`` has
  fsynced the last record.
* ``fold_1m_seconds``: reopening that log of ``--events`` (default 1M)
  events: read every segment, verify every checksum, decode, fold into a
  fresh state and rebuild the indexes.  ``fold(log.read())`` (decode and
  fold, no checks) is printed beside it.
* ``state_bytes_per_request``: the deep in-memory size (``sys.getsizeof`` of
  every object reachable from it, each counted once, shared strings
  included) of the ``RequestState`` of a finished 3-stage request of the
  mix; its msgpack size and the fold's measured cost per request are
  printed beside it.
* ``peak_rss_mb``: the process's peak resident set.

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
import resource
import shutil
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import msgspec

from omnix.events.disklog import DiskLog, LogConfig
from omnix.events.log import MemoryLog
from omnix.events.reducer import RequestState, fold
from omnix.events.types import (
    Admitted,
    BlobRef,
    Chunk,
    Event,
    Finished,
    RequestSpec,
    Routed,
    StageFinished,
    StageStarted,
)

TARGETS = {
    "memory_append_fold_events_per_s": (">=", 200_000),
    "disk_batched_fsync_events_per_s": (">=", 100_000),
    "fold_1m_seconds": ("<=", 5.0),
    "state_bytes_per_request": ("<=", 2048),
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
    fold_read_1m_seconds: float
    state_encoded_bytes: int
    fold_bytes_per_request: int
    disk_bytes_per_event: float
    disk_index_bytes_per_event: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--events", type=int, default=1_000_000, help="events for the disk and fold runs (default 1M)"
    )
    parser.add_argument(
        "--memory-events", type=int, default=300_000, help="events for the memory append run"
    )
    parser.add_argument("--concurrency", type=int, default=256, help="requests in flight")
    parser.add_argument("--dir", default=None, help="where to write the disk log (default: a temp dir)")


# --------------------------------------------------------------------------
# The workload
# --------------------------------------------------------------------------

_SPEC = RequestSpec(
    prompt="Describe the sound of rain on a tin roof, then say it aloud.",
    outputs=("text", "audio"),
    seed=7,
    api="chat.completions",
    model="qwen3-omni",
)
_BLOB = BlobRef(digest="9f86d081884c7d659a2feaa0c55ad015", nbytes=19200, dtype="<f4", shape=(4800,))


def request_lifecycle(rid: str) -> Iterator[Event]:
    """The 31 events of one thinker -> talker -> code2wav request."""
    yield Admitted(request_id=rid, pipeline="qwen3-omni", spec=_SPEC)
    yield Routed(request_id=rid, stage="thinker", replica=0, seq=0, sources=(0,), last=True)
    yield StageStarted(request_id=rid, stage="thinker", replica=0)
    for i in range(8):
        yield Chunk(
            request_id=rid, stage="thinker", replica=0, index=i, modality="text",
            text=" word", token_ids=(1000 + i,),
        )
        if i == 2:  # async chunk: talker starts on the first sentence
            yield Routed(request_id=rid, stage="talker", replica=1, seq=0, sources=(3, 4, 5), last=False)
            yield StageStarted(request_id=rid, stage="talker", replica=1)
    yield StageFinished(
        request_id=rid, stage="thinker", replica=0, chunks=8, prompt_tokens=14, output_tokens=8
    )
    yield Routed(request_id=rid, stage="talker", replica=1, seq=1, sources=(6, 7, 8), last=True)
    for i in range(6):
        yield Chunk(
            request_id=rid, stage="talker", replica=1, index=i, modality="codec",
            token_ids=(11, 12, 13, 14, 15, 16, 17, 18),
        )
    yield StageFinished(request_id=rid, stage="talker", replica=1, chunks=6, output_tokens=48)
    yield Routed(request_id=rid, stage="code2wav", replica=0, seq=0, sources=(20,), last=True)
    yield StageStarted(request_id=rid, stage="code2wav", replica=0)
    for i in range(4):
        yield Chunk(request_id=rid, stage="code2wav", replica=0, index=i, modality="audio", blob=_BLOB)
    yield StageFinished(request_id=rid, stage="code2wav", replica=0, chunks=4)
    yield Finished(request_id=rid)


def workload(n_events: int, concurrency: int) -> Iterator[Event]:
    """``n_events`` events of many requests in flight, interleaved round-robin."""
    flights: list[Iterator[Event]] = []
    made = 0
    started = 0
    while made < n_events:
        while len(flights) < concurrency:
            flights.append(request_lifecycle(f"req-{started:09d}"))
            started += 1
        alive = []
        for life in flights:
            ev = next(life, None)
            if ev is None:
                continue
            alive.append(life)
            yield ev
            made += 1
            if made == n_events:
                return
        flights = alive


def batches(n_events: int, concurrency: int, size: int = 20_000) -> Iterator[list[Event]]:
    """The workload in pre-built batches, so construction stays untimed and
    memory stays bounded."""
    batch: list[Event] = []
    for ev in workload(n_events, concurrency):
        batch.append(ev)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


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


def bench_memory(n: int, concurrency: int) -> float:
    log = MemoryLog()
    elapsed = 0.0
    for batch in batches(n, concurrency):
        append = log.append
        t0 = time.perf_counter()
        for ev in batch:
            append(ev)
        elapsed += time.perf_counter() - t0
    return len(log) / elapsed


def bench_disk(root: Path, n: int, concurrency: int) -> tuple[float, int]:
    log = DiskLog(root, LogConfig(fsync="batch"))
    elapsed = 0.0
    for batch in batches(n, concurrency):
        append = log.append
        t0 = time.perf_counter()
        for ev in batch:
            append(ev)
        elapsed += time.perf_counter() - t0
    t0 = time.perf_counter()
    log.close()  # the last group commit: everything durable
    elapsed += time.perf_counter() - t0
    return len(log) / elapsed, sum(p.stat().st_size for p in log.segment_paths())


def state_sizes(concurrency: int) -> tuple[int, int, int]:
    """(deep bytes of one finished request's state, its msgpack bytes,
    measured fold bytes per request over many requests)."""
    log = MemoryLog(events=request_lifecycle("req-000000042"))
    rs = log.state.requests["req-000000042"]
    assert rs.status == "finished" and len(rs.stages) == 3
    deep = deep_sizeof(rs)
    encoded = len(msgspec.msgpack.encode(rs))
    n_req = 20_000
    events = list(workload(31 * n_req, concurrency))
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    f = fold(events)
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert all(isinstance(s, RequestState) for s in f.requests.values())
    return deep, encoded, grown // len(f.requests)


def run(args: argparse.Namespace) -> int:
    n = args.events
    conc = args.concurrency
    tmp = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="omnix-bench-log-"))
    root = tmp / "log"
    if root.exists():
        shutil.rmtree(root)
    try:
        print(f"omnix bench log: {n:,} events (disk, fold), {args.memory_events:,} (memory), "
              f"{conc} requests in flight, 31 events per request")

        mem_rate = bench_memory(args.memory_events, conc)
        print(f"  memory append+validate+fold   {mem_rate:12,.0f} events/s")

        disk_rate, disk_bytes = bench_disk(root, n, conc)
        print(f"  disk append, fsync=batch      {disk_rate:12,.0f} events/s  "
              f"({disk_bytes / n:.0f} bytes/event on disk)")

        gc.collect()
        t0 = time.perf_counter()
        log = DiskLog(root)
        reopen = time.perf_counter() - t0
        index_bytes = (
            log._offs.itemsize * len(log._offs) + log._prev.itemsize * len(log._prev)
        ) / len(log)
        print(f"  reopen {len(log):,} events       {reopen:12.2f} s   "
              "(read, verify checksums, decode, fold, index)")
        t0 = time.perf_counter()
        replay = fold(log.read())
        fold_read = time.perf_counter() - t0
        assert replay.digest() == log.state.digest()
        print(f"  fold(log.read())              {fold_read:12.2f} s   (decode + fold)")
        print(f"  disk log index                {index_bytes:12.1f} bytes/event in memory "
              f"(+ one dict entry per request); no event objects kept")
        log.close()
        del log, replay
        gc.collect()

        deep, encoded, per_req = state_sizes(conc)
        print(f"  state per request             {deep:12,d} bytes (deep sizeof of a finished "
              f"3-stage RequestState); {encoded} bytes msgpack; fold costs {per_req:,} bytes/request")

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        print(f"  peak RSS                      {rss:12.0f} MB")

        result = LogBenchResult(
            memory_append_fold_events_per_s=round(mem_rate),
            disk_batched_fsync_events_per_s=round(disk_rate),
            fold_1m_seconds=round(reopen, 3),
            state_bytes_per_request=deep,
            peak_rss_mb=round(rss, 1),
            events=n,
            memory_events=args.memory_events,
            fold_read_1m_seconds=round(fold_read, 3),
            state_encoded_bytes=encoded,
            fold_bytes_per_request=per_req,
            disk_bytes_per_event=round(disk_bytes / n, 1),
            disk_index_bytes_per_event=round(index_bytes, 1),
        )
        failed = []
        for key, (op, target) in TARGETS.items():
            value = getattr(result, key)
            ok = value >= target if op == ">=" else value <= target
            if not ok:
                failed.append(f"{key}={value} (target {op} {target})")
        print("  targets: " + ("all met" if not failed else "MISSED " + "; ".join(failed)))
        if args.json:
            print(json.dumps(msgspec.to_builtins(result)))
        return 0
    finally:
        if not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)
