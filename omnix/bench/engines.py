"""``omnix bench engines``: what omnix costs on top of the engine it drives.

Owns two measurements on real engines and the tiny models, in one run:

* ``tiny-text`` through omnix vs vLLM's ``AsyncLLM`` driven directly, on
  the same ``thinker`` folder with the very ``AsyncEngineArgs`` omnix's
  ``VllmEngine`` builds (``omnix.engines.vllm_engine.engine_args``): TTFT
  p50 (the batch's start to the first streamed token) and tokens/s (output tokens over
  the wall time of a batch of ``c`` simultaneous requests) at concurrency
  1, 8 and 32.  Same prompts (through the same chat template), same
  sampling (the stage's defaults, a fixed ``max_tokens``), the same seed per
  request index, so both sides generate the same tokens; the run reports
  how many requests matched token for token.  Targets: omnix
  TTFT p50 <= 1.10 x direct + 2 ms, tokens/s >= 0.95 x direct.
* ``tiny-omni`` TTFP (submit to the first audio chunk) with async chunk
  forwarding on (the built-in config) and off (the same config with every
  edge's ``forward = "finish"``); target: forwarding at least halves it.
  Both variants run on the same workers, placed by the runtime's default
  (``--vllm-cpu-placement``).

Fairness on a small shared machine: both sides run the same engine
layout and placement (``--vllm-cpu-placement``, docs/runtime.md): the
direct engine core is started on the CPUs omnix's runtime gives its
worker's engine core, and this process, the client of both sides and
omnix's server, is pinned to the frontend CPUs (``pin_server``).  Both
sides are started (one after the other), then measured in alternating
rounds (the order swapped every round), so a change in the machine's load
hits both; between rounds the bench sleeps ``--settle`` seconds (with
vLLM's ``mp`` layout its model process busy-polls for 1 s after its last
step).  Each request's TTFT counts from its batch's start on both sides
(``_batch``).  The load average is printed before and after.

A quick run of the bench's own code (``tests/bench/test_smoke.py``):
``--levels 1 --rounds 1 --requests 1`` and ``--ttfp-pipeline`` a scripted
thinker -> talker -> code2wav (the figures then mean nothing).

Does not own the engines, the runtime or the API it drives (it uses
``Omni`` and ``AsyncLLM`` as a user would), nor the HTTP layer (``omnix
bench http``) or a hop's floor (``omnix bench hop``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from omnix.bench.loop import run_on_loop
from omnix.events.types import (
    Admitted,
    Chunk,
    Event,
    RequestEvent,
    RequestSpec,
    Scaled,
    StageParams,
    StageStarted,
)
from omnix.usage import UsageError, arg_type, count

if TYPE_CHECKING:
    from omnix.stages.options import RuntimeOptions
    from omnix.stages.runtime import StageRuntime
    from omnix.transport.work import WorkItem

# Varied lengths so prefill is not one shape; request i uses PROMPTS[i % n]
# and seed SEED0 + i on both sides.
PROMPTS = (
    "Tell me a story about a cat.",
    "What is the capital of France, and why?",
    "Write a haiku about the sea at night.",
    "Explain how a bicycle stays upright while it moves forward.",
    "List three colours.",
    "Summarise the plot of a detective novel in two sentences, without naming the detective.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes with the steps numbered.",
)
SEED0 = 1000
LEVELS = (1, 8, 32)

TTFT_RATIO, TTFT_SLACK_MS = 1.10, 2.0
TPS_RATIO = 0.95
TTFP_CUT = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _text_flags(parser)
    _ttfp_flags(parser)
    _setup_flags(parser)


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise ValueError(f"{text!r} is not a list of concurrency levels, e.g. 1,8,32") from None
    if not levels or levels[0] < 1:
        raise ValueError(f"{text!r}: give concurrency levels of 1 or more, e.g. 1,8,32")
    return levels


def _text_flags(parser: argparse.ArgumentParser) -> None:
    """The tiny-text comparison: tokens, rounds, batches, levels."""
    parser.add_argument(
        "--max-tokens",
        type=count,
        default=48,
        help="tokens per tiny-text request (default %(default)s)",
    )
    # Many short rounds: the host's speed drifts over seconds (an engine
    # core's CPU per token moved 144-195 us between 2-second stretches of
    # one process), and finer alternation cancels more of it than a few
    # long rounds.
    parser.add_argument(
        "--rounds",
        type=count,
        default=16,
        help="alternating rounds per concurrency level (default %(default)s)",
    )
    parser.add_argument(
        "--requests",
        type=count,
        default=6,
        metavar="N",
        help="requests per side per round at concurrency 1 (at c > 1: max(B, N // c) batches of c, "
        "B from --batches; default %(default)s)",
    )
    # A burst's TTFT p50 swings from batch to batch (20-60 ms at c=32: how
    # vLLM groups arrivals into prefill steps), so the pooled p50 needs many
    # batches (rounds x B) to hold still from run to run.
    parser.add_argument(
        "--batches",
        type=count,
        default=2,
        metavar="B",
        help="at least this many batches of c per side per round at concurrency > 1 "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=0.3,
        metavar="S",
        help="pause between rounds, default %(default)s (use 1.2 with cpu_executor = "
        '"mp": vLLM\'s model process then busy-polls for 1 s after its last step)',
    )
    parser.add_argument(
        "--levels",
        type=arg_type(_levels, "levels"),
        default=LEVELS,
        metavar="C,...",
        help="concurrency levels of the tiny-text part (default 1,8,32; a quick run: 1)",
    )


def _ttfp_flags(parser: argparse.ArgumentParser) -> None:
    """The TTFP comparison: requests, tokens, the talker's CPUs, the pipeline."""
    parser.add_argument(
        "--ttfp-requests",
        type=count,
        default=16,
        help="tiny-omni requests per variant (default %(default)s)",
    )
    parser.add_argument(
        "--thinker-tokens",
        type=count,
        default=96,
        help="tiny-omni thinker max_tokens (default %(default)s)",
    )
    parser.add_argument(
        "--talker-tokens",
        type=count,
        default=64,
        help="tiny-omni talker max_tokens per piece (default %(default)s)",
    )
    parser.add_argument(
        "--talker-cpus",
        default="",
        metavar="LIST",
        help="pin tiny-omni's talker worker (and its vLLM processes) to these CPUs, e.g. 1, "
        "instead of the runtime's placement (docs/runtime.md)",
    )
    parser.add_argument(
        "--ttfp-pipeline",
        default="tiny-omni",
        metavar="NAME|PATH",
        help="the thinker -> talker -> code2wav pipeline of the TTFP part (default tiny-omni; "
        "a scripted one makes a quick run of the bench itself)",
    )


def _setup_flags(parser: argparse.ArgumentParser) -> None:
    """Placement, which parts run, models and start-up."""
    parser.add_argument(
        "--vllm-cpu-placement",
        choices=("spread", "vllm"),
        default="spread",
        help="the runtime's placement on CPU (docs/runtime.md), applied to both sides: spread "
        "(default: vLLM engine cores on CPUs of their own, this process and the workers on the "
        "rest) or vllm (no placement: vLLM's and the OS's own choice)",
    )
    parser.add_argument("--skip-text", action="store_true", help="only the TTFP part")
    parser.add_argument("--skip-ttfp", action="store_true", help="only the tiny-text part")
    parser.add_argument(
        "--model-dir", default=None, help="tiny model dir (default $OMNIX_MODEL_DIR)"
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="bound on engine start-up (slow on a busy 2-core machine)",
    )


def _say(msg: str) -> None:
    print(f"[bench engines] {msg}", file=sys.stderr, flush=True)


def _p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


class Sample(msgspec.Struct):
    """One request as a client saw it (times in seconds, perf_counter)."""

    index: int
    ttft: float
    tokens: int
    ids: tuple[int, ...] = ()
    # omnix only: where the time to the first token went (ms), from log stamps
    to_started_ms: float = 0.0  # submit -> the worker's Started in the log
    to_chunk_ms: float = 0.0  # submit -> the first Chunk in the log
    ttfp: float = 0.0  # tiny-omni: submit -> first audio chunk
    rid: str = ""  # omnix only: the request id, for those stamps
    submit_ns: int = 0  # omnix only: the batch's start on the log's clock


class Batch(msgspec.Struct):
    wall: float
    samples: list[Sample]
    cpu: dict[str, float] = {}  # seconds of CPU per process role during the batch


class CpuMeter:
    """CPU seconds of this process and of one side's child processes, by
    role: wall-clock figures on a shared 2-core machine move with everyone
    else's load, CPU per token far less.  Roles: ``bench`` (this process:
    the direct client, or omnix's orchestrator, log and client), ``omnix
    worker``, ``engine core`` and ``model`` (vLLM's processes), and
    ``steal``, the machine-wide time the hypervisor took meanwhile."""

    def __init__(self) -> None:
        import psutil

        self._me = psutil.Process()
        self._machine_times = psutil.cpu_times
        self.procs: list[Any] = []

    def children(self) -> set[int]:
        return {p.pid for p in self._me.children(recursive=True)}

    def adopt(self, before: set[int]) -> None:
        """This side's processes: the children that appeared since ``before``."""
        self.procs = [p for p in self._me.children(recursive=True) if p.pid not in before]

    @staticmethod
    def _role(p: Any) -> str:
        try:
            name, cmd = p.name(), " ".join(p.cmdline()[:3])
        except Exception:
            return "gone"
        if "EngineCore" in name:
            return "engine core"
        if "Worker" in name and "VLLM" in name:
            return "model"
        if "omnix.stages.worker_cli" in cmd:
            return "omnix worker"
        return "other"

    def sample(self) -> dict[str, float]:
        # Not a process: the time the hypervisor ran someone else on this
        # VM's CPUs (all of them).  A guest may count it in its processes'
        # CPU time, so a side whose engine core looks slower per token
        # while steal rose was slowed by the host, not by its own work.
        out: dict[str, float] = {"steal": getattr(self._machine_times(), "steal", 0.0)}
        for role, p in [("bench", self._me)] + [(self._role(p), p) for p in self.procs]:
            try:
                t = p.cpu_times()
            except Exception:
                continue
            out[role] = out.get(role, 0.0) + t.user + t.system
        return out


# -- the two sides of the tiny-text comparison ---------------------------------


class DirectSide:
    """vLLM ``AsyncLLM`` in this process, driven as omnix's engine drives it
    (chat template, token prompt through the renderer, DELTA outputs), minus
    everything omnix adds."""

    name = "direct"

    def __init__(self, vargs: Any, sampling: StageParams, engine_cpus: str | None) -> None:
        self.vargs = vargs
        self.sampling = sampling
        self.engine_cpus = engine_cpus  # placed as omnix's runtime places its worker's
        self.llm: Any = None
        self.tok: Any = None
        self.meter: CpuMeter | None = None

    async def start(self) -> None:
        from omnix.engines.vllm_engine import engine_args, set_env_defaults
        from omnix.models.paths import resolve_model

        set_env_defaults(self.vargs)
        folder = resolve_model(self.vargs.model)
        ea = engine_args(self.vargs, folder)
        await asyncio.to_thread(self._make, ea)
        self.tok = self.llm.tokenizer

    def _make(self, ea: Any) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        from omnix.stages.placement import engine_affinity

        with engine_affinity(self.engine_cpus):
            self.llm = AsyncLLM.from_engine_args(ea)

    async def close(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)

    async def one(self, index: int, max_tokens: int, t0: float) -> Sample:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        p = self.sampling
        text = self.tok.apply_chat_template(
            [{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        prompt = self.tok.encode(text, add_special_tokens=False)
        kw: dict[str, Any] = {
            "n": 1,
            "max_tokens": max_tokens,
            "seed": SEED0 + index,
            "output_kind": RequestOutputKind.DELTA,
            "skip_clone": True,  # as omnix's engine
        }
        for f in ("temperature", "top_p", "top_k"):
            if getattr(p, f) is not None:
                kw[f] = getattr(p, f)
        (inp,) = self.llm.renderer.render_cmpl([{"prompt_token_ids": prompt}])
        first = 0.0
        ids: list[int] = []
        async for out in self.llm.generate(inp, SamplingParams(**kw), f"d{index}-{t0}"):
            delta = out.outputs[0].token_ids
            if delta and not first:
                first = time.perf_counter()
            ids.extend(delta)
        return Sample(index, first - t0, len(ids), tuple(ids))


class OmnixSide:
    """``Omni`` on a pipeline with real worker processes."""

    def __init__(self, name: str, pipeline: Any, runtime_options: RuntimeOptions) -> None:
        from omnix.api import Omni

        self.name = name
        self.omni = Omni(pipeline, runtime_options=runtime_options)
        self.meter: CpuMeter | None = None

    async def start(self) -> None:
        await self.omni.start()
        await self.omni.wait_ready()  # bounded by the caller (--start-timeout)

    async def close(self) -> None:
        await self.omni.shutdown(grace_s=2.0)

    def _rid(self) -> str | None:
        return None  # Omni picks one

    async def one(self, index: int, max_tokens: int, t0: float) -> Sample:
        spec = RequestSpec(
            prompt=PROMPTS[index % len(PROMPTS)],
            stage_params={"thinker": StageParams(max_tokens=max_tokens)},
            seed=SEED0 + index,
            api="bench",
        )
        return await self._run(index, spec, t0)

    async def one_omni(self, index: int, thinker_tokens: int, talker_tokens: int) -> Sample:
        spec = RequestSpec(
            prompt=PROMPTS[index % len(PROMPTS)],
            outputs=("text", "audio"),
            stage_params={
                "thinker": StageParams(max_tokens=thinker_tokens),
                "talker": StageParams(max_tokens=talker_tokens),
            },
            seed=SEED0 + index,
            api="bench",
        )
        # Cancelled at its first audio chunk: TTFP is measured by then, and
        # the rest (every thinker sentence spoken, up to talker_tokens codes
        # each) would only make the run long.
        return await self._run(index, spec, time.perf_counter(), stop_at_audio=True)

    async def _run(
        self, index: int, spec: RequestSpec, t0: float, stop_at_audio: bool = False
    ) -> Sample:
        from omnix.api import Overloaded

        omni = self.omni
        wall0 = time.time_ns() - int((time.perf_counter() - t0) * 1e9)
        ev = omni.submit(spec, self._rid())
        if not isinstance(ev, Admitted):
            raise Overloaded(ev)
        rid = ev.request_id
        first = first_audio = 0.0
        ids: list[int] = []
        async for out in omni.stream(rid):
            if out.modality == "text":
                if out.token_ids and not first:
                    first = time.perf_counter()
                ids.extend(out.token_ids)
            elif out.modality == "audio" and not first_audio:
                first_audio = time.perf_counter()
                if stop_at_audio:
                    omni.cancel(rid)
        rs = omni.state(rid)
        ok = ("finished", "cancelled") if stop_at_audio and first_audio else ("finished",)
        if rs is None or rs.status not in ok:
            status, reason = (rs.status, rs.reason) if rs is not None else ("?", "")
            raise RuntimeError(f"request {rid} ended {status}: {reason}")
        return Sample(
            index,
            first - t0,
            len(ids),
            tuple(ids),
            ttfp=first_audio - t0 if first_audio else 0.0,
            rid=rid,
            submit_ns=wall0,
        )

    def annotate(self, samples: list[Sample]) -> None:
        """Where each request's time to first token went (log stamps, this
        process's wall clock): its thinker's Started and first Chunk.  Read
        after the batch's wall time is taken: walking ~50 events a request
        at the batch's end cost omnix ~2 ms of every c=32 batch's wall."""
        for s in samples:
            started = chunk = 0
            for e in self.omni.log.events_for(s.rid):
                if isinstance(e, StageStarted) and e.stage == "thinker" and not started:
                    started = e.ts_ns
                elif isinstance(e, Chunk) and e.stage == "thinker" and not chunk:
                    chunk = e.ts_ns
                    break
            s.to_started_ms = (started - s.submit_ns) / 1e6
            s.to_chunk_ms = (chunk - s.submit_ns) / 1e6


async def _batch(
    c: int,
    start: int,
    one: Callable[[int, float], Awaitable[Sample]],
    meter: CpuMeter | None = None,
    annotate: Callable[[list[Sample]], None] | None = None,
) -> Batch:
    """``c`` requests submitted at once (indices start..start+c-1).

    Every request's TTFT counts from the batch's start, on both sides: the
    client issues all ``c`` at that instant, and the time a request then
    waits behind the others' preparation (the direct client's chat template
    and ``add_request`` calls, done one after the other on its loop; omnix's
    admission and its worker's same calls) is part of its time to first
    token.  Timing each from its own coroutine's start would hide that
    queueing on the direct side only, where the preparation runs before
    the later coroutines start."""
    cpu0 = meter.sample() if meter else {}
    t0 = time.perf_counter()
    samples = list(await asyncio.gather(*(one(start + j, t0) for j in range(c))))
    wall = time.perf_counter() - t0
    cpu = {k: v - cpu0.get(k, 0.0) for k, v in meter.sample().items()} if meter else {}
    if annotate is not None:
        annotate(samples)
    return Batch(wall, samples, cpu)


# -- the tiny-text comparison ------------------------------------------------------


def _freeze_heap() -> None:
    """Take what the start-up left on the heap out of the collector's reach
    (``omnix.stages.worker.freeze_heap``).

    This process holds the direct side's ``AsyncLLM`` (torch, transformers,
    vLLM: ~600k objects) beside omnix's server, so an unfrozen full
    collection stopped it for ~300 ms, once or twice a run, in the middle
    of whichever side's batch it fell on.  vLLM's server and omnix's
    workers freeze after their load for the same reason; omnix's own server
    process holds no such heap (~30k objects, a full collection ~5 ms)."""
    from omnix.stages.worker import freeze_heap

    freeze_heap()


#: The two sides of the tiny-text comparison.
Side = DirectSide | OmnixSide
#: Runs request ``index`` of a batch that started at ``t0``.
OneRequest = Callable[[int, float], Awaitable[Sample]]


def _one(side: Side, max_tokens: int) -> OneRequest:
    return lambda i, t0: side.one(i, max_tokens, t0)


async def _start_all(sides: Sequence[Side], limit_s: float) -> None:
    # One after the other: two engines loading at once on 2 cores only make
    # each start slower, and a start failure then names its side.
    for s in sides:
        t0 = time.perf_counter()
        _say(f"starting {s.name} ...")
        s.meter = CpuMeter()
        before = s.meter.children()
        async with asyncio.timeout(limit_s):
            await s.start()
        s.meter.adopt(before)
        _say(f"{s.name} ready in {time.perf_counter() - t0:.1f} s")


async def _text_phase(
    args: argparse.Namespace, pipeline: Any, options: RuntimeOptions
) -> dict[int, dict[str, list[Batch]]]:
    from omnix.pipelines.plan import merge_params
    from omnix.stages.placement import available_cpus, cpu_plan

    stage = pipeline.stage("thinker")
    sampling = merge_params(stage.sampling, StageParams(max_tokens=args.max_tokens))
    # The direct engine is placed as omnix places its worker's (this process,
    # the client of both sides, is pinned to the frontend CPUs by omnix's
    # runtime when it starts, pin_server).
    plan = cpu_plan(pipeline, available_cpus()) if args.vllm_cpu_placement == "spread" else None
    direct = DirectSide(stage.engine, sampling, plan.engines["thinker/0"] if plan else None)
    omnix_ = OmnixSide("omnix", pipeline, options)
    sides: list[Side] = [direct, omnix_]
    try:
        await _start_all(sides, args.start_timeout)
        _freeze_heap()
        n = args.max_tokens
        _say("warming up both sides")
        levels: tuple[int, ...] = args.levels
        for s in sides:
            for c in sorted({1, min(8, max(levels)), max(levels)}):
                await _batch(c, 900_000, _one(s, n))
        out: dict[int, dict[str, list[Batch]]] = {}
        for c in levels:
            per_round = max(
                args.batches if c > 1 else 1, args.requests // c
            )  # batches of c per side per round
            batches: dict[str, list[Batch]] = {"direct": [], "omnix": []}
            _say(f"concurrency {c}: {args.rounds} rounds x {per_round} batches of {c} per side")
            for r in range(args.rounds):
                order = sides if r % 2 == 0 else sides[::-1]
                for s in order:
                    await asyncio.sleep(args.settle)
                    for b in range(per_round):
                        # The same request indices on both sides: same prompt, same seed.
                        start = (c * 10_000) + (r * per_round + b) * c
                        annotate = s.annotate if isinstance(s, OmnixSide) else None
                        batches[s.name].append(
                            await _batch(c, start, _one(s, n), s.meter, annotate)
                        )
            out[c] = batches
        return out
    finally:
        for s in sides:
            try:
                await s.close()
            except Exception as exc:  # keep closing the others
                _say(f"closing {s.name} failed: {type(exc).__name__}: {exc}")


def _text_figures(res: dict[int, dict[str, list[Batch]]]) -> dict[str, Any]:
    fig: dict[str, Any] = {}
    for c, sides in res.items():
        per: dict[str, dict[str, float]] = {}
        for name, batches in sides.items():
            samples = [s for b in batches for s in b.samples]
            tokens = sum(s.tokens for s in samples)
            per[name] = {
                "ttft_p50_ms": _p50([s.ttft * 1e3 for s in samples]),
                "tokens_per_s": tokens / sum(b.wall for b in batches),
                "tokens": tokens,
                "requests": len(samples),
            }
            cpu: dict[str, float] = {}
            for b in batches:
                for role, sec in b.cpu.items():
                    cpu[role] = cpu.get(role, 0.0) + sec
            for role, sec in cpu.items():
                per[name][f"cpu_us_per_token_{role.replace(' ', '_')}"] = sec / tokens * 1e6
            if name == "omnix":
                per[name]["to_started_p50_ms"] = _p50([s.to_started_ms for s in samples])
                per[name]["to_chunk_p50_ms"] = _p50([s.to_chunk_ms for s in samples])
        d, o = per["direct"], per["omnix"]
        direct_ids = {s.index: s.ids for b in sides["direct"] for s in b.samples}
        same = sum(1 for b in sides["omnix"] for s in b.samples if direct_ids.get(s.index) == s.ids)
        fig[f"ttft_p50_ratio_c{c}"] = round(o["ttft_p50_ms"] / d["ttft_p50_ms"], 3)
        fig[f"tokens_per_s_ratio_c{c}"] = round(o["tokens_per_s"] / d["tokens_per_s"], 3)
        fig[f"ttft_p50_ms_direct_c{c}"] = round(d["ttft_p50_ms"], 2)
        fig[f"ttft_p50_ms_omnix_c{c}"] = round(o["ttft_p50_ms"], 2)
        fig[f"tokens_per_s_direct_c{c}"] = round(d["tokens_per_s"], 1)
        fig[f"tokens_per_s_omnix_c{c}"] = round(o["tokens_per_s"], 1)
        fig[f"omnix_to_started_p50_ms_c{c}"] = round(o["to_started_p50_ms"], 2)
        fig[f"omnix_to_first_chunk_p50_ms_c{c}"] = round(o["to_chunk_p50_ms"], 2)
        for side, vals in (("direct", d), ("omnix", o)):
            for k, v in vals.items():
                if k.startswith("cpu_us_per_token_"):
                    fig[f"{k}_{side}_c{c}"] = round(v, 1)
        for name, batches in sides.items():
            # A stall (seconds) would hide in a mean: show the slowest batch.
            fig[f"batch_wall_max_ms_{name}_c{c}"] = round(max(b.wall for b in batches) * 1e3, 1)
        fig[f"requests_c{c}"] = o["requests"]
        fig[f"same_tokens_c{c}"] = same
        fig[f"ttft_ok_c{c}"] = o["ttft_p50_ms"] <= TTFT_RATIO * d["ttft_p50_ms"] + TTFT_SLACK_MS
        fig[f"tokens_per_s_ok_c{c}"] = o["tokens_per_s"] >= TPS_RATIO * d["tokens_per_s"]
    return fig


# -- TTFP with async chunk on and off --------------------------------------------------


def unchunked(pipeline: Any) -> Any:
    """The same pipeline with every edge forwarding only at the source's finish."""
    return msgspec.structs.replace(
        pipeline,
        edges=tuple(msgspec.structs.replace(e, forward="finish") for e in pipeline.edges),
    )


class SharedWorkers:
    """One ``StageRuntime`` (one set of worker processes) under two ``Omni``
    instances that differ only in their edges.

    Both variants then run on the very same engine processes (no placement
    or warm-up difference between them) and start-up is paid once.  Worker
    events go to both logs (each orchestrator needs its ``WorkerJoined``);
    a request's events go to the ``Omni`` whose prefix its id carries.  The
    variants are measured one at a time, so neither orchestrator's view of
    a replica's load is ever wrong.
    """

    def __init__(self, pipeline: Any, options: RuntimeOptions) -> None:
        from omnix.events.blobs import MemoryBlobStore
        from omnix.stages.runtime import StageRuntime

        self.blobs = MemoryBlobStore()
        self._owners: dict[str, Callable[[Event], None]] = {}
        self.runtime = StageRuntime(pipeline, emit=self._emit, blobs=self.blobs, options=options)

    def attach(self, prefix: str, emit: Callable[[Event], None]) -> None:
        self._owners[prefix] = emit

    def detach(self, prefix: str) -> None:
        self._owners.pop(prefix, None)

    def _emit(self, ev: Event) -> None:
        if not isinstance(ev, RequestEvent):  # a worker's event: every log needs it
            for emit in self._owners.values():
                emit(ev)
            return
        owner = self._owners.get(ev.request_id.partition("-")[0])
        if owner is not None:
            owner(ev)

    async def shutdown(self) -> None:
        self._owners.clear()  # the logs are closed by now
        await self.runtime.shutdown()


class _RuntimeView:
    """The shared runtime as one ``Omni`` drives it: ``start`` and
    ``shutdown`` do nothing (``SharedWorkers`` starts and stops the workers
    once, for both variants)."""

    def __init__(self, runtime: StageRuntime) -> None:
        self._rt = runtime

    async def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass

    def send(self, work: WorkItem) -> None:
        self._rt.send(work)

    def abort(self, request_id: str, stage: str, replica: int) -> None:
        self._rt.abort(request_id, stage, replica)

    def release(self, request_id: str) -> None:
        self._rt.release(request_id)

    def scale(self, ev: Scaled) -> None:
        self._rt.scale(ev)


class OmniVariant(OmnixSide):
    """An ``Omni`` over ``SharedWorkers``; request ids start with ``name``."""

    def __init__(self, name: str, pipeline: Any, shared: SharedWorkers) -> None:
        from omnix.api import Omni

        self.name = name
        self.meter = None
        self.omni = Omni(
            pipeline,
            blobs=shared.blobs,
            runtime_factory=lambda p, e, b: _RuntimeView(shared.runtime),
        )
        self._shared = shared
        shared.attach(name, self.omni.sequencer.emit)
        self._n = 0

    async def close(self) -> None:
        try:
            await self.omni.shutdown(grace_s=2.0)
        finally:
            self._shared.detach(self.name)  # its log is closed

    def _rid(self) -> str:
        self._n += 1
        return f"{self.name}-{self._n}"


async def _ttfp_phase(
    args: argparse.Namespace, pipeline: Any, options: RuntimeOptions
) -> dict[str, Any]:
    import dataclasses

    opts = options
    if args.talker_cpus:
        opts = dataclasses.replace(options, worker_cpus={"talker": args.talker_cpus})
    shared = SharedWorkers(pipeline, opts)
    plan = shared.runtime.cpu_plan
    # Created before the workers start, so both logs see them join.
    on = OmniVariant("chunked", pipeline, shared)
    off = OmniVariant("unchunked", unchunked(pipeline), shared)
    sides = [on, off]
    samples: dict[str, list[Sample]] = {"chunked": [], "unchunked": []}
    tt, ta = args.thinker_tokens, args.talker_tokens
    try:
        t0 = time.perf_counter()
        _say("starting tiny-omni's workers (thinker, talker, code2wav) ...")
        await shared.runtime.start()
        for s in sides:
            await s.start()
        _say(f"tiny-omni ready in {time.perf_counter() - t0:.1f} s")
        _freeze_heap()
        _say("warming up both variants")
        for s in sides:
            await s.one_omni(900_000, tt, ta)
        rounds = min(4, max(1, args.ttfp_requests))
        per_round = max(1, args.ttfp_requests // rounds)
        _say(f"TTFP: {rounds} rounds x {per_round} sequential requests per variant")
        for r in range(rounds):
            for s in sides if r % 2 == 0 else sides[::-1]:
                await asyncio.sleep(args.settle)
                for k in range(per_round):
                    samples[s.name].append(await s.one_omni(50_000 + r * per_round + k, tt, ta))
    finally:
        for s in sides:
            try:
                await s.close()
            except Exception as exc:
                _say(f"closing {s.name} failed: {type(exc).__name__}: {exc}")
        await shared.shutdown()
    fig: dict[str, Any] = {}
    for name, ss in samples.items():
        fig[f"ttfp_ms_{name}"] = round(_p50([s.ttfp * 1e3 for s in ss]), 1)
        fig[f"ttft_ms_{name}"] = round(_p50([s.ttft * 1e3 for s in ss]), 1)
    fig["ttfp_cut"] = round(fig["ttfp_ms_chunked"] / fig["ttfp_ms_unchunked"], 3)
    fig["ttfp_ok"] = fig["ttfp_ms_chunked"] <= TTFP_CUT * fig["ttfp_ms_unchunked"]
    fig["ttfp_requests"] = len(samples["chunked"])
    fig["ttfp_thinker_tokens"] = tt
    fig["ttfp_talker_tokens"] = ta
    fig["talker_cpus"] = args.talker_cpus or "unpinned"
    fig["vllm_cpus"] = describe_plan(plan)
    return fig


def describe_plan(plan: Any) -> str:
    """The runtime's CPU placement in a line (docs/runtime.md)."""
    if plan is None:
        return "not placed"
    engines = ", ".join(f"{w} engine core on {c}" for w, c in plan.engines.items())
    return f"server and vLLM workers on {plan.frontend}; {engines}"


# -- entry point ----------------------------------------------------------------------------


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from omnix.models.prepare import prepare_models
    from omnix.pipelines.validate import PipelineError, load_pipeline
    from omnix.stages.options import RuntimeOptions

    text = load_pipeline("tiny-text")
    try:
        omni = load_pipeline(args.ttfp_pipeline)
    except PipelineError as exc:
        raise UsageError(str(exc)) from None
    from pathlib import Path

    for p in (text, omni):  # builds what is missing (seconds), exports OMNIX_MODEL_DIR
        prepare_models(p, Path(args.model_dir) if args.model_dir else None)
    # A worker is declared lost after 2 s without heartbeats by default; on
    # a 2-core machine shared with other work (and vLLM's busy-polling
    # processes) a starved worker went silent that long during its first
    # request.  A loss is not what this bench measures: tolerate 10 s.
    # pin_server: this process is omnix's server (and the direct client):
    # the runtime puts it on the frontend CPUs as ``omnix serve`` does.
    options = RuntimeOptions(
        start_timeout_s=args.start_timeout,
        lost_after_s=10.0,
        vllm_cpu_placement=args.vllm_cpu_placement,
        pin_server=True,
    )
    res: dict[str, Any] = {"load_average_start": round(os.getloadavg()[0], 2)}
    if not args.skip_text:
        res.update(_text_figures(await _text_phase(args, text, options)))
        res["max_tokens"] = args.max_tokens
        res["levels"] = list(args.levels)
    if not args.skip_ttfp:
        res.update(await _ttfp_phase(args, omni, options))
    res["load_average_end"] = round(os.getloadavg()[0], 2)
    res["cpus"] = os.cpu_count()
    return res


def _table(res: dict[str, Any]) -> None:
    if "ttft_p50_ratio_c1" in res:
        print(f"tiny-text, {res['max_tokens']} tokens per request, omnix vs vLLM AsyncLLM direct")
        print(
            f"{'c':>3} {'TTFT p50 direct':>16} {'omnix':>9} {'ratio':>7} {'target':>8}"
            f" {'tok/s direct':>13} {'omnix':>9} {'ratio':>7}  same tokens"
        )
        for c in res["levels"]:
            d, o = res[f"ttft_p50_ms_direct_c{c}"], res[f"ttft_p50_ms_omnix_c{c}"]
            target = TTFT_RATIO * d + TTFT_SLACK_MS
            ok_t = "ok" if res[f"ttft_ok_c{c}"] else "MISSED"
            ok_r = "ok" if res[f"tokens_per_s_ok_c{c}"] else "MISSED"
            print(
                f"{c:>3} {d:>13.1f} ms {o:>6.1f} ms {res[f'ttft_p50_ratio_c{c}']:>7.3f} "
                f"{target:>5.1f} ms {res[f'tokens_per_s_direct_c{c}']:>13.0f} "
                f"{res[f'tokens_per_s_omnix_c{c}']:>9.0f} {res[f'tokens_per_s_ratio_c{c}']:>7.3f}  "
                f"{res[f'same_tokens_c{c}']}/{res[f'requests_c{c}']}   TTFT {ok_t}, tok/s {ok_r}"
            )
        print(
            "omnix TTFT split (p50, from log stamps): submit -> worker Started in the log / "
            "-> first Chunk in the log"
        )
        for c in res["levels"]:
            print(
                f"{c:>3} {res[f'omnix_to_started_p50_ms_c{c}']:>8.2f} ms / "
                f"{res[f'omnix_to_first_chunk_p50_ms_c{c}']:.2f} ms"
            )
        print(
            "CPU per output token (us; moves far less with load than wall time), by process: bench = this process "
            "(direct: the AsyncLLM client; omnix: orchestrator, log, client); host steal = time "
            "the hypervisor took from this machine's CPUs"
        )
        for c in res["levels"]:
            parts = []
            for side in ("direct", "omnix"):
                roles = [
                    ("bench", "bench"),
                    ("omnix_worker", "worker"),
                    ("engine_core", "engine core"),
                    ("model", "model"),
                    ("steal", "host steal"),
                ]
                vals = [
                    f"{label} {res[k]:.0f}"
                    for key, label in roles
                    if (k := f"cpu_us_per_token_{key}_{side}_c{c}") in res
                ]
                parts.append(f"{side}: " + ", ".join(vals))
            print(f"{c:>3} " + " | ".join(parts))
    if "ttfp_ms_chunked" in res:
        print(
            f"tiny-omni TTFP p50 over {res['ttfp_requests']} sequential requests (thinker "
            f"max_tokens {res['ttfp_thinker_tokens']}, talker {res['ttfp_talker_tokens']} per "
            f"piece, talker CPUs: {res['talker_cpus']}, vLLM workers placed: {res['vllm_cpus']})"
        )
        print(
            f"  async chunk on  {res['ttfp_ms_chunked']:8.1f} ms   (TTFT {res['ttft_ms_chunked']:.1f} ms)"
        )
        print(
            f"  async chunk off {res['ttfp_ms_unchunked']:8.1f} ms   (TTFT {res['ttft_ms_unchunked']:.1f} ms)"
        )
        print(
            f"  on/off {res['ttfp_cut']:.3f} (target <= {TTFP_CUT}): "
            f"{'ok' if res['ttfp_ok'] else 'MISSED'}"
        )
    print(
        f"load average (1 min) {res['load_average_start']} at start, {res['load_average_end']} "
        f"at end, on {res['cpus']} CPUs"
    )


def run(args: argparse.Namespace) -> int:
    # What the runtime gives its workers (so the direct engine's processes,
    # spawned from here, run with the same setting); vLLM sets its model
    # process's own thread count and binding either way.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        res = run_on_loop(_bench(args))
    finally:
        gc.unfreeze()  # frozen at exit, triton reports leaks (worker.exit_without_finalizing)
    _table(res)
    print(json.dumps(res))
    return 0
