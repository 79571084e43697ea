"""``omnix bench replay``: how fast traces fold and drive.

Owns: the replay benchmark and its synthetic trace.  The trace is made by
running many concurrent requests of a tiny-omni-shaped scripted pipeline
(thinker -> talker -> code2wav, async chunk, two replicas of the AR
stages) through the real orchestrator, sequencer and reducer on the
virtual-time ``SimRuntime``; it is exported as a whole-log trace and cached
under ``~/.cache/omnix/bench`` (``--no-cache`` rebuilds it).

Measured, each on the decoded events (the read is timed separately):

* fold: ``Fold.apply_all`` over every event plus the digest (what ``omnix
  replay TRACE`` does after reading);
* drive: ``omnix.replay.drive.drive`` (orchestrator + sequencer + memory
  log, every decision compared byte for byte with the recording).

With ``--json`` the last line is one JSON object with ``fold_events_per_s``
and ``drive_events_per_s`` (wall clock, best of ``--repeat``) and the rest
of the figures, including the same rates per second of CPU time (what the
replay cost when other processes share the cores) and the load average.  Targets on a
2-core machine: fold >= 300k events/s, drive >= 50k events/s.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import omnix
from omnix.pipelines.config import PipelineConfig, ScriptedArgs
from omnix.usage import UsageError, count

BENCH_PIPELINE = """
name = "bench-omni"
description = "tiny-omni's shape on scripted engines, for the replay benchmark"
[[stages]]
name = "thinker"
replicas = 2
engine = { kind = "scripted", chunks_per_piece = 32, delay_ms = 2, capacity = 16 }
max_queue = 256
[[stages]]
name = "talker"
replicas = 2
engine = { kind = "scripted", chunks_per_piece = 6, delay_ms = 1, output_modality = "codec", capacity = 16 }
max_queue = 256
[[stages]]
name = "code2wav"
engine = { kind = "scripted", chunks_per_piece = 1, delay_ms = 1, output_modality = "audio", capacity = 32 }
max_queue = 256
[[edges]]
source = "thinker"
target = "talker"
forward = "sentence"
every = 8
[[edges]]
source = "talker"
target = "code2wav"
forward = "chunk"
every = 8
[outputs]
text = "thinker"
audio = "code2wav"
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=count, default=1_000_000, help="trace size (events)")
    parser.add_argument(
        "--repeat", type=count, default=3, help="runs of each measurement (best kept)"
    )
    parser.add_argument("--no-cache", action="store_true", help="rebuild the synthetic trace")
    parser.add_argument("--trace", default=None, help="benchmark this trace file instead")


def bench_pipeline() -> PipelineConfig:
    from omnix.pipelines.validate import parse_pipeline

    return parse_pipeline(BENCH_PIPELINE, source="<bench-omni>")


async def _generate(n_events: int) -> bytes:
    """A whole-log trace of at least ``n_events`` events."""
    from omnix.events.blobs import MemoryBlobStore
    from omnix.events.clock import ManualClock
    from omnix.events.log import MemoryLog
    from omnix.events.types import RequestSpec, WorkerJoined
    from omnix.orchestrator.decide import Orchestrator
    from omnix.orchestrator.dispatch import Dispatcher
    from omnix.orchestrator.sequencer import Sequencer
    from omnix.testing.sim import SimRuntime
    from omnix.trace import export_trace

    cfg = bench_pipeline()
    clock = ManualClock()
    log = MemoryLog(clock)
    blobs = MemoryBlobStore()
    orch = Orchestrator(cfg)
    seq = Sequencer(log, orch)
    # No deadline timer: nothing here has a deadline, and the timer's
    # per-event listener would only slow generation down.
    sim = SimRuntime(cfg, seq.emit, blobs, clock)
    log.add_listener(Dispatcher(log, sim, blobs, cfg))
    for st in cfg.stages:
        assert isinstance(st.engine, ScriptedArgs)  # BENCH_PIPELINE's stages are scripted
        cap = st.engine.capacity
        for rep in range(st.min_replicas):
            seq.append(
                WorkerJoined(
                    worker_id=f"{st.name}/{rep}",
                    stage=st.name,
                    replica=rep,
                    engine="scripted",
                    capacity=cap,
                )
            )
    i = 0
    while log.next_pos < n_events:
        # Arrivals in bursts: enough concurrency to queue and to reject.
        for _ in range(12):
            spec = RequestSpec(prompt=f"prompt {i}", outputs=("text", "audio"), seed=i)
            seq.submit(f"req-{i:07d}", spec)
            i += 1
        for _ in range(700):
            if not sim.step():
                break
    sim.run_until_idle()
    return export_trace(log, blobs, cfg, None)


def _cache_path(n_events: int) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "omnix" / "bench"
    from omnix.orchestrator.decide import RULES_VERSION
    from omnix.trace import TRACE_FORMAT_VERSION

    return (
        base
        / f"replay-{n_events}-f{TRACE_FORMAT_VERSION}-r{RULES_VERSION}-{omnix.__version__}.trace"
    )


def _best(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Best wall time and best CPU time of ``repeat`` runs.  On a shared
    machine the wall time includes waiting for a core; the CPU time is what
    the replay itself cost."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        gc.collect()
        t, c = time.perf_counter(), time.process_time()
        fn()
        cpu = min(cpu, time.process_time() - c)
        wall = min(wall, time.perf_counter() - t)
    return wall, cpu


def run(args: argparse.Namespace) -> int:
    from omnix.events.reducer import Fold
    from omnix.replay.drive import drive
    from omnix.trace import TraceError, read_trace, write_trace

    gen_s = 0.0
    if args.trace:
        path = Path(args.trace)
    else:
        path = _cache_path(args.events)
        if args.no_cache or not path.exists():
            print(f"generating a {args.events:,}-event trace (cached at {path}) ...", flush=True)
            t = time.perf_counter()
            write_trace(path, asyncio.run(_generate(args.events)))
            gen_s = time.perf_counter() - t
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"--trace {path}: cannot read it ({exc.strerror or exc})") from None
    t = time.perf_counter()
    try:
        trace = read_trace(data, verify=False)
    except TraceError as exc:
        raise UsageError(f"--trace {path}: {exc}") from None
    read_s = time.perf_counter() - t
    n = len(trace.events)
    events = trace.events

    def do_fold() -> None:
        f = Fold()
        f.apply_all(events)  # what reading a trace does
        if f.digest() != trace.digest:
            raise SystemExit("bench: the fold's digest does not match the trace's")

    # gc stays on: replay runs with it on, and the event types are gc=False.
    fold_s, fold_cpu = _best(do_fold, args.repeat)

    def do_drive() -> None:
        drive(trace)

    drive_s, drive_cpu = _best(do_drive, max(1, args.repeat - 1))
    load = round(os.getloadavg()[0], 2)
    figures = {
        "events": n,
        "requests": len(trace.fold().requests),
        "decisions": trace.decisions,
        "trace_bytes": len(data),
        "read_events_per_s": round(n / read_s),
        "fold_events_per_s": round(n / fold_s),
        "drive_events_per_s": round(n / drive_s),
        "fold_cpu_events_per_s": round(n / fold_cpu),
        "drive_cpu_events_per_s": round(n / drive_cpu),
        "load_average": load,
        "cpus": os.cpu_count(),
        "generate_s": round(gen_s, 2),
    }
    print(
        f"trace   {path} ({len(data) / 1e6:.1f} MB, {n:,} events, {figures['requests']:,} requests)"
    )
    print(f"read    {figures['read_events_per_s']:>12,} events/s  (decode, no verify)")
    print(
        f"fold    {figures['fold_events_per_s']:>12,} events/s  (target >= 300,000; "
        f"{figures['fold_cpu_events_per_s']:,}/s of CPU time)"
    )
    print(
        f"drive   {figures['drive_events_per_s']:>12,} events/s  (target >= 50,000; "
        f"{figures['drive_cpu_events_per_s']:,}/s of CPU time)"
    )
    if load > (os.cpu_count() or 1):
        print(
            f"note: load average {load} on {os.cpu_count()} CPUs: other "
            "processes took cores during the run, so wall-clock rates are below what replay "
            "achieves alone (see the CPU-time rates)"
        )
    if args.json:
        print(json.dumps(figures))
    return 0
