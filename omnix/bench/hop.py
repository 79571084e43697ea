"""``omnix bench hop``: the cost of one orchestration hop and of streaming.

Owns: two measurements of the stage runtime with a real worker process
and a scripted engine, events appended to a ``MemoryLog`` (validated by
the reducer, as in production):

* hop latency: ``runtime.send(WorkItem)`` to a worker whose engine makes
  one output, until that stage's ``StageFinished`` (after its
  ``StageStarted`` and ``Chunk``) is in the log: p50 and p99 over
  ``--hops`` sequential hops.
* chunk events/s through one worker: one request whose engine streams
  ``--chunks`` outputs as fast as it can; the rate at which Chunk events
  land in the log.
* the floor: a bare ZMQ round trip from this process (the same ROUTER
  options and loop-driven reads as the runtime) to an echo process (a
  blocking ``recv`` loop), measured in the same run.  On a loaded machine
  both grow; the hop's cost is what it adds to the floor.

Does not measure engines or HTTP (``omnix bench engines``, ``bench http``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from omnix.bench.loop import run_on_loop
from omnix.events.blobs import MemoryBlobStore
from omnix.events.log import MemoryLog
from omnix.events.types import (
    Admitted,
    Chunk,
    Event,
    RequestSpec,
    Routed,
    StageFailed,
    StageFinished,
)
from omnix.pipelines.config import PipelineConfig, ScriptedArgs, StageConfig
from omnix.stages.options import RuntimeOptions
from omnix.stages.runtime import StageRuntime
from omnix.transport.sockets import check_endpoint
from omnix.transport.work import InputPiece, WorkItem
from omnix.usage import arg_type, count


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hops", type=count, default=3000, help="sequential hops to time")
    parser.add_argument(
        "--chunks", type=count, default=100_000, help="chunks streamed for the rate"
    )
    parser.add_argument(
        "--endpoint",
        default=None,
        type=arg_type(check_endpoint, "endpoint"),
        help="tcp://127.0.0.1:0 to measure tcp (default ipc)",
    )
    parser.add_argument("--no-uvloop", action="store_true", help="run on the default asyncio loop")
    parser.add_argument(
        "--pin",
        choices=("auto", "off"),
        default="off",
        help="auto: with 2+ CPUs, pin this process to the first CPU and the worker to the "
        "second (docs/runtime.md: helps an idle small machine, can hurt a busy one); "
        "off (default): no pinning",
    )


# A bare ZMQ echo over the same kind of sockets: the floor a hop stands on,
# measured in the same run so that a loaded machine shows in both numbers.
_ECHO = """
import sys, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.ROUTING_ID, b"echo")
s.connect(sys.argv[1])
s.send(b"hi")
while (m := s.recv()) != b"bye":
    s.send(m)
"""


async def _zmq_floor(n: int, endpoint: str | None, worker_cpu: str | None) -> tuple[float, float]:
    import sys

    import zmq

    from omnix.transport.sockets import (
        LoopReader,
        default_ipc_endpoint,
        make_router,
        readable,
        remove_endpoint_dir,
    )

    tmp = None
    if endpoint is None:
        endpoint, tmp = default_ipc_endpoint()
    ctx = zmq.Context()
    sock, endpoint = make_router(ctx, endpoint)
    pin = None if worker_cpu is None else (lambda: os.sched_setaffinity(0, {int(worker_cpu)}))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _ECHO, endpoint, preexec_fn=pin
    )
    loop = asyncio.get_running_loop()
    waiter: list[asyncio.Future[None]] = []

    def on_readable() -> None:
        while readable(sock):
            sock.recv_multipart()
            if waiter and not waiter[0].done():
                waiter[0].set_result(None)

    reader = LoopReader(loop, sock, on_readable)
    try:
        hello = loop.create_future()
        waiter.append(hello)
        await asyncio.wait_for(hello, 30)  # the echo's hello
        waiter.pop()
        lat = []
        for _ in range(n):
            fut = loop.create_future()
            waiter.append(fut)
            t0 = time.perf_counter_ns()
            sock.send_multipart([b"echo", b"x" * 64])
            reader.kick()
            await fut
            waiter.pop()
            lat.append((time.perf_counter_ns() - t0) / 1000)
        sock.send_multipart([b"echo", b"bye"])
    finally:
        reader.close()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        sock.close(0)
        ctx.term()
        remove_endpoint_dir(tmp)
    lat.sort()
    return lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]


def _pipeline(chunks: int) -> PipelineConfig:
    return PipelineConfig(
        name="bench-hop",
        stages=(
            StageConfig(name="one", engine=ScriptedArgs(chunks_per_piece=1, capacity=4)),
            StageConfig(name="stream", engine=ScriptedArgs(chunks_per_piece=chunks, capacity=4)),
        ),
    )


async def _bench(args: argparse.Namespace) -> dict[str, float]:
    log = MemoryLog()
    done: dict[str, asyncio.Future[None]] = {}

    def emit(ev: Event) -> None:
        try:
            log.append(ev)
        except Exception:
            return
        if isinstance(ev, (StageFinished, StageFailed)):
            fut = done.pop(ev.request_id, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    pinned = args.pin == "auto" and len(os.sched_getaffinity(0)) >= 2
    worker_cpus = None
    if pinned:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[0]})  # before ZMQ starts its I/O thread
        worker_cpus = {"one": str(cpus[1]), "stream": str(cpus[1])}
    runtime = StageRuntime(
        _pipeline(args.chunks),
        emit,
        MemoryBlobStore(),
        RuntimeOptions(
            endpoint=args.endpoint, forward_worker_output=False, worker_cpus=worker_cpus or {}
        ),
    )
    await runtime.start()
    loop = asyncio.get_running_loop()
    piece = (InputPiece(text="go"),)
    try:

        async def run_one(rid: str, stage: str) -> float:
            log.append(
                Admitted(request_id=rid, pipeline="bench-hop", spec=RequestSpec(prompt="go"))
            )
            log.append(
                Routed(request_id=rid, stage=stage, replica=0, seq=0, sources=(0,), last=True)
            )
            fut = done[rid] = loop.create_future()
            t0 = time.perf_counter_ns()
            runtime.send(WorkItem(rid, stage, 0, 0, True, piece))
            await fut
            return (time.perf_counter_ns() - t0) / 1000

        for i in range(200):  # warm up both processes' code paths
            await run_one(f"w{i}", "one")
        lat = sorted([await run_one(f"h{i}", "one") for i in range(args.hops)])
        p50 = lat[len(lat) // 2]
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]

        before = sum(1 for ev in log.read() if isinstance(ev, Chunk))
        t0 = time.perf_counter()
        await run_one("stream", "stream")
        elapsed = time.perf_counter() - t0
        chunks = sum(1 for ev in log.read() if isinstance(ev, Chunk)) - before
        rate = chunks / elapsed
    finally:
        await runtime.shutdown()
    floor50, floor99 = await _zmq_floor(
        args.hops, args.endpoint, worker_cpus["one"] if worker_cpus else None
    )
    return {
        "hop_p50_us": round(p50, 1),
        "hop_p99_us": round(p99, 1),
        "chunk_events_per_s": round(rate),
        "hops": args.hops,
        "chunks": chunks,
        "transport": "tcp" if (args.endpoint or "").startswith("tcp") else "ipc",
        "pinned": pinned,
        "zmq_rtt_p50_us": round(floor50, 1),
        "zmq_rtt_p99_us": round(floor99, 1),
    }


def run(args: argparse.Namespace) -> int:
    res = run_on_loop(_bench(args), uvloop=not args.no_uvloop)
    if not getattr(args, "json", False):
        print(
            f"hop p50 {res['hop_p50_us']:.0f} us, p99 {res['hop_p99_us']:.0f} us "
            f"({res['hops']} hops over {res['transport']}, {'pinned' if res['pinned'] else 'not pinned'})"
        )
        print(
            f"chunk events/s through one worker: {res['chunk_events_per_s']:,} ({res['chunks']} chunks)"
        )
        print(
            f"floor, a bare ZMQ round trip on the same sockets: p50 {res['zmq_rtt_p50_us']:.0f} us, "
            f"p99 {res['zmq_rtt_p99_us']:.0f} us"
        )
    print(json.dumps(res))
    return 0
