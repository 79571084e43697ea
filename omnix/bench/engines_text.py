"""``omnix bench engines``' tiny-text part: omnix against vLLM's ``AsyncLLM`` driven directly.

Owns: ``DirectSide`` (``AsyncLLM`` in this process, driven as omnix's
engine drives it, on the CPUs omnix would give its engine core), a batch
of ``c`` requests sent at once and timed from its start (``_batch``), the
alternating rounds per concurrency level (``text_phase``) and their
figures and targets (``text_figures``: TTFT p50 <= 1.10 x direct + 2 ms,
tokens/s >= 0.95 x direct, CPU per token by process role, tokens that
matched).  Does not own omnix's side (``engines_sides.OmnixSide``) nor
the verb (``engines``).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from omnix.bench.cpu_meter import CpuMeter
from omnix.bench.engines_sides import (
    PROMPTS,
    SEED0,
    OmnixSide,
    Sample,
    freeze_startup_heap,
    p50,
    say,
)
from omnix.events.types import StageParams

if TYPE_CHECKING:
    from omnix.stages.options import RuntimeOptions

LEVELS = (1, 8, 32)

TTFT_RATIO, TTFT_SLACK_MS = 1.10, 2.0
TPS_RATIO = 0.95


class Batch(msgspec.Struct):
    wall: float
    samples: list[Sample]
    cpu: dict[str, float] = {}  # seconds of CPU per process role during the batch


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
        say(f"starting {s.name} ...")
        s.meter = CpuMeter()
        before = s.meter.children()
        async with asyncio.timeout(limit_s):
            await s.start()
        s.meter.adopt(before)
        say(f"{s.name} ready in {time.perf_counter() - t0:.1f} s")


async def text_phase(
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
        freeze_startup_heap()
        n = args.max_tokens
        say("warming up both sides")
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
            say(f"concurrency {c}: {args.rounds} rounds x {per_round} batches of {c} per side")
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
                say(f"closing {s.name} failed: {type(exc).__name__}: {exc}")


def text_figures(res: dict[int, dict[str, list[Batch]]]) -> dict[str, Any]:
    fig: dict[str, Any] = {}
    for c, sides in res.items():
        per: dict[str, dict[str, float]] = {}
        for name, batches in sides.items():
            samples = [s for b in batches for s in b.samples]
            tokens = sum(s.tokens for s in samples)
            per[name] = {
                "ttft_p50_ms": p50([s.ttft * 1e3 for s in samples]),
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
                per[name]["to_started_p50_ms"] = p50([s.to_started_ms for s in samples])
                per[name]["to_chunk_p50_ms"] = p50([s.to_chunk_ms for s in samples])
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
