"""Capture the replay corpus (``replay/`` at the project root): test support.

Owns: the corpus cases (a normal text+audio request, a cancel mid-stream,
a worker lost mid-stream, a deadline expiry, a rejected overload, a
busy server whose trace needs the cross-request closure, and the same
burst on a talker that scales up and back down), running each on
a fresh server, exporting its trace and checking it before writing it:
every trace must fold to its digest and drive with zero divergence, and
where the request came through HTTP the client's bytes must be
regenerated exactly (they are saved beside the trace as ``NAME.body``).

Does not own the trace format (``omnix.trace``) or replaying
(``omnix.replay.drive``).

    python -m omnix.testing.corpus --out replay/              # both sets below
    python -m omnix.testing.corpus --out replay/ --runtime sim
    python -m omnix.testing.corpus --out replay/ --pipeline tiny-omni

Sets, by file name prefix:

* ``scripted-omni-*``: the built-in tiny-omni pipeline's graph (its edges,
  forwarding and outputs) with scripted engines, served over HTTP through
  real worker processes (``StageRuntime``) with a disk log, exported from
  the log directory as ``omnix trace export`` does;
* ``sim-omni-*``: the same pipeline on the virtual-time ``SimRuntime``;
* ``tiny-omni-*`` (``--pipeline tiny-omni``): the built-in pipeline with
  its real engines, once its models are built (``omnix models init``).

Recapture when a behaviour change is intended (docs/replay.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from omnix.events.types import Chunk, Event, Rejected, RequestSpec
from omnix.pipelines.config import PipelineConfig, ReplicaRange, ScriptedArgs
from omnix.stages.options import RuntimeOptions

if TYPE_CHECKING:
    import aiohttp

    from omnix.api import Omni
    from omnix.http.app import HttpServer

CASES = ("normal", "cancel", "worker-lost", "deadline", "rejected", "busy", "media", "scaling")
#: Cases that need the HTTP layer's media decoding (not on the simulator).
HTTP_ONLY = ("media",)

MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


def media_messages() -> list[dict[str, object]]:
    """One user message with a 2 s clip, a small image and a question."""
    from omnix.testing.media import audio_part, image_part

    parts = [
        audio_part(2.0),
        image_part(64, 48),
        {"type": "text", "text": "What do you hear and see?"},
    ]
    return [{"role": "user", "content": parts}]


def scripted_omni(**changes: object) -> PipelineConfig:
    """tiny-omni's graph with scripted engines: the same stages, edges,
    forwarding rules and outputs, outputs made by deterministic scripts."""
    from omnix.pipelines.validate import load_pipeline, validate_pipeline

    base = load_pipeline("tiny-omni")
    engines = {
        "thinker": ScriptedArgs(chunks_per_piece=24, delay_ms=4.0),
        "talker": ScriptedArgs(chunks_per_piece=6, delay_ms=2.0, output_modality="codec"),
        "code2wav": ScriptedArgs(chunks_per_piece=1, delay_ms=1.0, output_modality="audio"),
    }
    stages = []
    for st in base.stages:
        st = msgspec.structs.replace(st, engine=engines[st.name], sampling=type(st.sampling)())
        extra = changes.get(st.name)
        if isinstance(extra, dict):
            st = msgspec.structs.replace(st, **extra)
        stages.append(st)
    cfg = msgspec.structs.replace(
        base,
        name="scripted-omni",
        description="tiny-omni's graph on scripted engines (replay corpus)",
        stages=tuple(stages),
    )
    validate_pipeline(cfg, "<scripted-omni>")
    return cfg


def _variant(cfg: PipelineConfig, case: str) -> PipelineConfig:
    """The per-case server config: a full thinker for ``rejected``, two
    talkers for ``busy`` and ``worker-lost`` (a migration needs a spare)."""

    def with_stage(name: str, **kw: object) -> PipelineConfig:
        stages = tuple(
            msgspec.structs.replace(st, **kw) if st.name == name else st for st in cfg.stages
        )
        return msgspec.structs.replace(cfg, stages=stages)

    if case == "rejected":
        eng = cfg.stage("thinker").engine
        if isinstance(eng, ScriptedArgs):
            return with_stage(
                "thinker", max_queue=0, engine=msgspec.structs.replace(eng, capacity=1)
            )
        return with_stage("thinker", max_queue=0)
    if case in ("busy", "worker-lost"):
        # worker-lost: the lost talker's stage continues on the other one.
        return with_stage("talker", replicas=2)
    if case == "scaling":
        # One talker request at a time: a burst queues, a second talker
        # starts, and drains once the burst is over.
        eng = cfg.stage("talker").engine
        if isinstance(eng, ScriptedArgs):
            eng = msgspec.structs.replace(eng, capacity=1)
        ranged = ReplicaRange(min=1, max=2, up_after=1, down_after_s=0.05)
        return with_stage("talker", replicas=ranged, engine=eng)
    return cfg


@dataclass
class Captured:
    name: str
    path: Path
    events: int
    targets: tuple[str, ...]
    body: bytes | None  # what the HTTP client received, when it went through HTTP


def _check(data: bytes, body: bytes | None, name: str) -> None:
    from omnix.replay.client import client_bytes
    from omnix.replay.drive import drive
    from omnix.trace import read_trace

    trace = read_trace(data)
    res = drive(trace, raise_on_divergence=False)
    if res.divergence is not None:
        raise RuntimeError(f"captured {name} does not drive:\n{res.divergence.report()}")
    if body is not None:
        again = client_bytes(trace)
        if again != body:
            raise RuntimeError(
                f"captured {name}: rendering the trace gives {len(again)} bytes, the client "
                f"received {len(body)}; the HTTP renderer is not a pure function of the log"
            )


# --------------------------------------------------------------------------
# Real workers, over HTTP
# --------------------------------------------------------------------------


def _runtime_options(cfg: PipelineConfig) -> RuntimeOptions:
    """Quiet scripted workers; real engines get time to load (vLLM on a
    busy CPU box can take minutes) and keep their logs for diagnosis."""
    scripted = all(isinstance(st.engine, ScriptedArgs) for st in cfg.stages)
    if scripted:
        return RuntimeOptions(forward_worker_output=False)
    return RuntimeOptions(
        start_timeout_s=float(os.environ.get("OMNIX_CAPTURE_START_TIMEOUT_S", "900"))
    )


async def _capture_workers_case(cfg: PipelineConfig, case: str, prefix: str, out: Path) -> Captured:
    from omnix.api import Omni
    from omnix.http.app import HttpServer
    from omnix.trace import export_from_dir, write_trace

    with tempfile.TemporaryDirectory(prefix="omnix-capture-") as tmp:
        omni = Omni(_variant(cfg, case), log_dir=tmp, runtime_options=_runtime_options(cfg))
        await omni.start()
        server = HttpServer(omni, telemetry=False)
        await server.start()
        try:
            targets, body = await _run_case(omni, server, case)
            # Every request must end before shutdown, or the shutdown's own
            # cancels would become part of the case.
            for rid in list(omni.log.state.requests):
                await asyncio.wait_for(_until_terminal(omni, rid), 60)
        finally:
            await omni.shutdown(grace_s=5.0)
            await server.close()
        data = export_from_dir(tmp, targets)
    name = f"{prefix}-{case}"
    _check(data, body, name)
    path = write_trace(out / f"{name}.trace", data)
    body_path = out / f"{name}.body"
    if body is not None:
        body_path.write_bytes(body)
    elif body_path.exists():
        body_path.unlink()
    return Captured(name, path, len(read_events(data)), tuple(targets), body)


def read_events(data: bytes) -> list[Event]:
    from omnix.trace import read_trace

    return read_trace(data, verify=False).events


async def _until_terminal(omni: Omni, rid: str) -> None:
    async for _ in omni.events(rid):
        pass


async def _http_chat(
    server: HttpServer,
    session: aiohttp.ClientSession,
    *,
    stream: bool = True,
    messages: list[dict[str, object]] | None = None,
) -> tuple[int, str, bytes]:
    body: dict[str, object] = {
        "messages": messages or MESSAGES,
        "modalities": ["text", "audio"],
        "audio": {"format": "pcm16", "voice": "default"},
        "stream": stream,
        "seed": 7,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with session.post(server.url + "/v1/chat/completions", json=body) as r:
        raw = await r.read()
        return r.status, r.headers.get("X-Request-Id", ""), raw


def _on_chunk(omni: Omni, pred: Callable[[Chunk], bool], action: Callable[[Chunk], object]) -> None:
    """Run ``action`` once, right after the first chunk matching ``pred``."""
    done = False

    def listener(ev: Event) -> None:
        nonlocal done
        if not done and type(ev) is Chunk and pred(ev):
            done = True
            action(ev)

    omni.log.add_listener(listener)


def _kill_worker(omni: Omni, wid: str) -> None:
    ws = omni.log.state.workers[wid]
    if ws.pid <= 0:
        raise RuntimeError(f"worker {wid} has no pid in the log: cannot kill it")
    os.kill(ws.pid, signal.SIGKILL)


async def _until_drained(omni: Omni, stage: str, limit_s: float = 30.0) -> None:
    """Until ``stage`` is back to its ``min`` with no replica draining."""
    scaler = omni.orchestrator.scaler
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    cfg = omni.pipeline.stage(stage).scaling
    assert cfg is not None
    while len(scaler.members(stage)) > cfg.min or scaler.draining(stage):
        if loop.time() > deadline:  # pragma: no cover
            raise RuntimeError(f"stage {stage!r} did not scale back down in {limit_s:g} s")
        await asyncio.sleep(0.02)


async def _run_case(omni: Omni, server: HttpServer, case: str) -> tuple[list[str], bytes | None]:
    """Run one case; the target request ids and the HTTP client's bytes."""
    spec = RequestSpec(
        messages=(), prompt="Tell me about the sea.", outputs=("text", "audio"), seed=7
    )
    if case == "cancel":
        _on_chunk(
            omni,
            lambda ev: ev.stage == "code2wav",
            lambda ev: omni.cancel(ev.request_id, "client"),
        )
    elif case == "worker-lost":
        _on_chunk(
            omni,
            lambda ev: ev.stage == "talker" and ev.index == 2,
            lambda ev: _kill_worker(omni, f"talker/{ev.replica}"),
        )
    if case == "deadline":
        # The HTTP API has no deadline parameter: submit as the offline API does.
        ev = omni.submit(msgspec.structs.replace(spec, deadline_ms=60), request_id="deadline-1")
        return [ev.request_id], None
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        if case in ("normal", "cancel", "worker-lost"):
            _, rid, raw = await _http_chat(server, session)
            return [rid], raw
        if case == "media":
            status, rid, raw = await _http_chat(server, session, messages=media_messages())
            if status != 200:  # pragma: no cover
                raise RuntimeError(f"the media chat was answered {status}: {raw[:300]!r}")
            return [rid], raw
        if case == "rejected":
            # Fill every thinker slot (a real engine reports its own
            # capacity) in one go, so none can free up in between; the
            # thinker has no queue, so the next request is refused.
            cap = sum(
                ws.capacity
                for ws in omni.log.state.workers.values()
                if ws.stage == "thinker" and ws.alive
            )
            for i in range(cap):
                omni.submit(spec, request_id=f"fill-{i}")
            status, rid, raw = await _http_chat(server, session, stream=False)
            if status < 400:  # pragma: no cover
                raise RuntimeError("no request was refused: the overload case did not happen")
            return [rid], raw
        # busy: four requests a few ms apart; the trace of the third needs
        # the others (least-loaded talker choice, shared replicas).
        # scaling: the same burst starts a second talker.
        tasks = []
        for _ in range(4):
            tasks.append(asyncio.ensure_future(_http_chat(server, session)))
            await asyncio.sleep(0.015)
        results = await asyncio.gather(*tasks)
        if case == "scaling":
            await _until_drained(omni, "talker")
        admitted = [rid for rid in omni.log.state.requests]
        third = admitted[2]
        body = next(raw for _, rid, raw in results if rid == third)
        return [third], body


# --------------------------------------------------------------------------
# The virtual-time simulator
# --------------------------------------------------------------------------


async def _capture_sim_case(cfg: PipelineConfig, case: str, out: Path) -> Captured:
    from omnix.testing.sim import start_sim
    from omnix.trace import export_trace, write_trace

    omni, sim = await start_sim(_variant(cfg, case))
    spec = RequestSpec(prompt="Tell me about the sea.", outputs=("text", "audio"), seed=7)
    targets: list[str]
    if case == "deadline":
        targets = [
            omni.submit(
                msgspec.structs.replace(spec, deadline_ms=20), request_id="deadline-1"
            ).request_id
        ]
    elif case == "rejected":
        omni.submit(spec, request_id="rejected-0")
        ev = omni.submit(spec, request_id="rejected-1")
        assert isinstance(ev, Rejected), ev
        targets = [ev.request_id]
    elif case in ("busy", "scaling"):
        targets = []
        for i in range(4):
            targets.append(omni.submit(spec, request_id=f"{case}-{i}").request_id)
            for _ in range(9):
                sim.step()
        targets = [targets[2]]
    else:
        targets = [omni.submit(spec, request_id=f"{case}-1").request_id]
        if case == "cancel":
            while not any(type(e) is Chunk and e.stage == "code2wav" for e in omni.log.read()):
                assert sim.step()
            omni.cancel(targets[0], "client")
        elif case == "worker-lost":
            while not any(
                type(e) is Chunk and e.stage == "talker" and e.index == 2 for e in omni.log.read()
            ):
                assert sim.step()
            sim.kill("talker", 0)
    sim.run_until_idle()
    data = export_trace(omni.log, omni.blobs, omni.pipeline, targets)
    name = f"sim-omni-{case}"
    _check(data, None, name)
    path = write_trace(out / f"{name}.trace", data)
    return Captured(name, path, len(read_events(data)), tuple(targets), None)


# --------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------


async def capture_corpus(
    out: str | os.PathLike[str],
    *,
    runtime: str = "all",
    pipeline: str | None = None,
    cases: tuple[str, ...] = CASES,
    report: Callable[[Captured], None] | None = None,
) -> list[Captured]:
    """Capture ``cases`` into ``out``; returns what was written."""
    outdir = Path(out)
    os.makedirs(outdir, exist_ok=True)
    done: list[Captured] = []

    async def step(coro: Awaitable[Captured]) -> None:
        c = await coro
        done.append(c)
        if report is not None:
            report(c)

    if pipeline is not None:
        from omnix.pipelines.validate import load_pipeline

        cfg = load_pipeline(pipeline)
        for case in cases:
            await step(_capture_workers_case(cfg, case, cfg.name, outdir))
        return done
    cfg = scripted_omni()
    if runtime in ("all", "sim"):
        for case in cases:
            if case not in HTTP_ONLY:
                await step(_capture_sim_case(cfg, case, outdir))
    if runtime in ("all", "workers"):
        for case in cases:
            await step(_capture_workers_case(cfg, case, "scripted-omni", outdir))
    return done


def run_capture(
    out: str, *, runtime: str = "all", pipeline: str | None = None, cases: list[str] | None = None
) -> int:
    def report(c: Captured) -> None:
        body = f", client body {len(c.body)} bytes" if c.body is not None else ""
        print(
            f"wrote {c.path} ({c.events} events, target {', '.join(c.targets)}{body}): drives clean"
        )

    unknown = sorted(set(cases or ()) - set(CASES))
    if unknown:
        print(
            f"omnix capture-corpus: unknown case(s) {unknown}; cases: {', '.join(CASES)}",
            file=sys.stderr,
        )
        return 2
    try:
        asyncio.run(
            capture_corpus(
                out, runtime=runtime, pipeline=pipeline, cases=tuple(cases or CASES), report=report
            )
        )
    except Exception as exc:
        print(f"omnix capture-corpus: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m omnix.testing.corpus", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", default="replay")
    p.add_argument("--runtime", choices=("all", "workers", "sim"), default="all")
    p.add_argument("--pipeline", default=None)
    p.add_argument("--case", action="append", default=None, choices=CASES)
    a = p.parse_args(argv)
    return run_capture(a.out, runtime=a.runtime, pipeline=a.pipeline, cases=a.case)


if __name__ == "__main__":
    sys.exit(main())
