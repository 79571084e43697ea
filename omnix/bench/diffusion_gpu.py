"""``omnix bench diffusion --device cuda --sizes real``: the cache table at a published size.

Owns one measurement of a published diffusion model with random weights
(``omnix.models.diffusion_real``: Wan 2.1 T2V 1.3B, default, or
FLUX.1-dev), built once on the device into ``--build-dir`` and served
from there by real ``DiffusersEngine`` s in this process (no HTTP, no
worker), one per side of the table:

* ``off``: uncached, the stage's defaults (Wan: its guidance batched);
* each ``--cache`` spec (a kind the family does not run: ``skipped``);
* ``cfg_batch=off``, on Wan (whose two guidance forwards a step omnix
  batches by default; FLUX.1-dev's requests here use no true CFG);
* ``compile=MODE[+CACHE]`` for each ``--compile`` (default ``blocks`` on
  CUDA; none on a CPU, where inductor takes minutes).

Each side is started, warmed (a request alone; a compiled side also a
call of four, so its recompiles are out of the figures), then measured
``--runs`` times: a request alone (seed 1) and a call of four (seeds
11-14).  The sides are loaded together and take turns run by run where
their weights fit in half the device's free memory (Wan 1.3B); else
(FLUX.1-dev's 12 B) one after another, each closed before the next
starts (``--order``).  ``--budget-s`` bounds the whole: a run that
would end past it is not started (each row says how many ran).

Per side: ``steps_per_s`` (a request alone, from its third to its last
progress output where there are eight or more: on a GPU the host runs
ahead of the device until the launch queue fills, so the first two
outputs come early) and ``steps_per_s_c4`` (the same of the call of
four), ``images_per_s_c1`` /
``_c4`` (a video model: ``video_s_per_s_c1`` / ``_c4``, seconds of video
made a second), each the median over the runs with the lowest run's as
``*_min``; ``speedup_steps`` (and ``_c4``) over ``off``'s medians;
``psnr_db_min`` and ``max_pixel_diff``: the worst of its five outputs of
the first run against ``off``'s of the same seed (raw frames: videos are
written as ``.npy``, not MP4, so no encoder is needed and none is in the
figures); ``repeats_equal`` (every later run gave the same pixels);
``batched_c4`` (each call of four ran as one pipeline call); ``off``'s
``pixel_std`` (of its request alone's pixels: random weights can decode
to a nearly flat picture, where any PSNR is high);
``start_s`` (loading, as the engine loads) and ``warm_s``.  At the top:
the card (``torch.cuda.get_device_name``), ``peak_gpu_gib``, the shape,
and ``target_met_by``: the cache sides with ``speedup_steps`` >= 1.7 and
``psnr_db_min`` >= 30 dB (issue 43's target).  A side that fails is a row
with ``error``; the rest still run.

Does not own measuring one side (``diffusion_runs.py``), the cache table
on the tiny built-in pipelines (``diffusion_cache.py``), the engine, or
the models' numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgspec

from omnix.bench.diffusion_runs import SEEDS_FOUR, Side, raw_videos
from omnix.bench.loop import run_on_loop
from omnix.bench.report import progress
from omnix.models.diffusion_real import PUBLISHED, Published, Sizes, published_folder
from omnix.pipelines.config import DiffusersArgs
from omnix.pipelines.diffusion_cache import (
    CFG_BATCH_FAMILIES,
    CompileMode,
    cache_problems,
    family_problem,
    parse_cache_spec,
)
from omnix.usage import UsageError, count

#: The caches measured by default at the published sizes.  first_block at
#: 0.32: on random weights at Wan 1.3B's widths the first block's residual
#: moves by 0.27-0.35 a step (measured on CPU over 20 UniPC steps), so its
#: default 0.05 would compute every step and 0.32 skips about half (0.30:
#: a third; 0.34: two thirds).  The others at diffusers' defaults.
DEFAULT_REAL_CACHES = (
    "first_block,threshold=0.32",
    "taylorseer",
    "pyramid_attention_broadcast",
)
#: issue 43's target: this many times off's steps/s at this PSNR or better
TARGET_SPEEDUP = 1.7
TARGET_PSNR_DB = 30.0
FPS = 16

#: (width, height, frames) by model and sizes: Wan at 480p (17 frames, 1 s
#: at 16 fps, keeps the whole command within minutes), Flux at 512x512.
_SHAPES: dict[tuple[str, str], tuple[int, int, int]] = {
    ("wan2.1-t2v-1.3b", "real"): (832, 480, 17),
    ("wan2.1-t2v-1.3b", "tiny"): (32, 32, 5),
    ("flux.1-dev", "real"): (512, 512, 0),
    ("flux.1-dev", "tiny"): (64, 64, 0),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "the table at a published size (--device cuda or --sizes; docs/bench.md, "
        "'Diffusion at a published size on a GPU')"
    )
    g.add_argument(
        "--device",
        default="cpu",
        help="cpu (default): the tiny built-in pipelines' benches; cuda: the table at a "
        "published size on the GPU",
    )
    g.add_argument(
        "--sizes",
        choices=("tiny", "real"),
        default=None,
        help="the published model's sizes (real: needs a GPU) or the same classes at test sizes",
    )
    g.add_argument(
        "--model", choices=PUBLISHED, default=PUBLISHED[0], help=f"default {PUBLISHED[0]}"
    )
    g.add_argument("--runs", type=count, default=3, help="measured runs per side (default 3)")
    g.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default=None,
        help="weights and engine dtype (default bfloat16 on CUDA, float32 on a CPU)",
    )
    g.add_argument("--width", type=count, default=None, help="default 832 (Wan), 512 (Flux)")
    g.add_argument("--height", type=count, default=None, help="default 480 (Wan), 512 (Flux)")
    g.add_argument("--frames", type=count, default=None, help="a video's frames (default 17)")
    g.add_argument(
        "--compile",
        action="append",
        default=None,
        metavar="MODE[+CACHE]|off",
        help="a compiled side: blocks or model, with a cache spec after + (repeat; default "
        "blocks on CUDA, none on a CPU; off: none)",
    )
    g.add_argument(
        "--order",
        choices=("auto", "together", "one-by-one"),
        default="auto",
        help="load the sides together and take turns run by run, or each alone in turn "
        "(default auto: together where their weights fit in half the free device memory)",
    )
    g.add_argument(
        "--budget-s",
        type=count,
        default=480,
        help="start no run that would end past this many seconds (default 480)",
    )
    g.add_argument(
        "--build-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "omnix-diffusion-published",
        help="where the model folder is built once and reused",
    )


def wanted(args: argparse.Namespace) -> bool:
    """Whether the command line asks for this table."""
    return args.sizes is not None or args.device != "cpu"


def _met(row: dict[str, Any]) -> bool:
    """Issue 43's target: the speed-up at the fidelity (null PSNR: equal)."""
    if "psnr_db_min" not in row or (row.get("speedup_steps") or 0) < TARGET_SPEEDUP:
        return False
    psnr = row["psnr_db_min"]
    return psnr is None or psnr >= TARGET_PSNR_DB


def _sides(
    args: argparse.Namespace,
    folder: Path,
    pipeline: str,
    dtype: str,
    shape: tuple[int, int, int, int],
) -> tuple[list[Side], dict[str, str]]:
    """The table's sides, and the specs skipped with why."""
    from omnix.events.types import StageParams

    width, height, frames, steps = shape
    video = frames > 0
    cuda = args.device.startswith("cuda")
    base = DiffusersArgs(
        model=str(folder),
        dtype=dtype,
        device=args.device,
        default_steps=steps,
        default_size=max(width, height),
        output_modality="video" if video else "image",
        max_batch=len(SEEDS_FOUR),
        default_frames=frames if video else 17,
        default_fps=FPS,
    )
    params = StageParams(
        num_inference_steps=steps,
        width=width,
        height=height,
        num_frames=frames if video else None,
    )
    sides = [Side("off", base, params)]
    skipped: dict[str, str] = {}
    for spec in args.cache or DEFAULT_REAL_CACHES:
        try:
            stage, cache = parse_cache_spec(spec)
        except ValueError as bad:
            raise UsageError(str(bad)) from None
        if stage is not None or cache is None:
            raise UsageError(f"--cache {spec!r}: give KIND[,OPT=VALUE...] (no stage, not none)")
        refused = family_problem(cache, pipeline)
        if refused is not None:
            skipped[spec] = refused
            continue
        sides.append(Side(spec, msgspec.structs.replace(base, cache=cache), params))
    # Wan guides with two forwards a step by default; FLUX.1-dev (guidance
    # distilled) only under true CFG, which these requests do not ask for.
    if video and pipeline in CFG_BATCH_FAMILIES:
        sides.append(Side("cfg_batch=off", msgspec.structs.replace(base, cfg_batch=False), params))
    compiles = args.compile if args.compile is not None else (["blocks"] if cuda else [])
    for spec in compiles:
        if spec == "off":
            continue
        mode, _, cache_spec = spec.partition("+")
        if mode not in ("blocks", "model"):
            raise UsageError(f"--compile {spec!r}: give blocks or model, then +CACHE if cached")
        try:
            cache = parse_cache_spec(cache_spec)[1] if cache_spec else None
        except ValueError as bad:
            raise UsageError(f"--compile {spec!r}: {bad}") from None
        compile_mode: CompileMode = "blocks" if mode == "blocks" else "model"
        problems = cache_problems(cache, compile_mode)
        refused = family_problem(cache, pipeline) if cache is not None else None
        label = f"compile={spec}"
        why = problems[0] if problems else refused
        if why is not None:
            skipped[label] = why
            continue
        compiled = msgspec.structs.replace(base, cache=cache, compile=compile_mode)
        sides.append(Side(label, compiled, params))
    return sides, skipped


def _fits_together(folder: Path, n: int, device: str) -> bool:
    """Whether ``n`` copies of the folder's weights fit in half the device's
    free memory (always on a CPU: the tiny sizes)."""
    if not device.startswith("cuda"):
        return True
    import torch

    weights = sum(p.stat().st_size for p in folder.rglob("*.safetensors"))
    free, _ = torch.cuda.mem_get_info()
    return n * weights <= free / 2


async def _measure(
    side: Side, reference: Side | None, deadline: float, t0: float, run: int
) -> bool:
    """One run of ``side``, unless it would end past ``deadline``; False
    when not run or failed (its error kept)."""
    if side.runs and time.perf_counter() + side.runs[-1].c1_s + side.runs[-1].c4_s > deadline:
        return False
    try:
        row = await side.run(reference)
    except Exception as exc:  # a side's failure is its row's; the others go on
        side.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        progress(f"{side.label}: run {run + 1} failed: {side.error}", t0)
        return False
    figures = ", ".join(f"{k} {v:.2f}" for k, v in asdict(row).items() if v is not None)
    progress(f"{side.label}: run {run + 1}: {figures}", t0)
    return True


async def _ready(side: Side, t0: float) -> bool:
    """Start and warm ``side``; False (its error kept) when either fails."""
    try:
        await side.start()
        progress(f"{side.label}: started in {side.start_s:.1f} s; warming up", t0)
        await side.warm(four=side.args.compile != "off")
        progress(f"{side.label}: warm in {side.warm_s:.1f} s", t0)
        return True
    except Exception as exc:
        side.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        progress(f"{side.label}: failed to start: {side.error}", t0)
        await _close(side)
        return False


async def _close(side: Side) -> None:
    import gc

    with contextlib.suppress(Exception):
        await side.close()
    gc.collect()
    if side.args.device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


async def _run_together(sides: list[Side], runs: int, deadline: float, t0: float) -> None:
    live = [s for s in sides if await _ready(s, t0)]
    reference = sides[0] if sides[0] in live else None
    try:
        for r in range(runs):
            for side in list(live):
                ref = None if side is sides[0] else reference
                if not await _measure(side, ref, deadline, t0, r):
                    live.remove(side)
    finally:
        for side in sides:
            await _close(side)


async def _run_one_by_one(sides: list[Side], runs: int, deadline: float, t0: float) -> None:
    reference: Side | None = None
    for i, side in enumerate(sides):
        # An equal share of what is left, so the last sides get their runs too.
        share = time.perf_counter() + (deadline - time.perf_counter()) / (len(sides) - i)
        if await _ready(side, t0):
            for r in range(runs):
                if not await _measure(side, reference, share, t0, r):
                    break
            if i == 0 and side.runs:
                reference = side
        await _close(side)


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    import diffusers
    import torch

    t0 = time.perf_counter()
    deadline = t0 + args.budget_s
    sizes: Sizes = args.sizes or ("real" if args.device.startswith("cuda") else "tiny")
    name: Published = args.model
    width, height, frames = _SHAPES[(name, sizes)]
    width, height = args.width or width, args.height or height
    if frames:
        frames = args.frames or frames
    steps = args.steps or (20 if sizes == "real" else 8)
    cuda = args.device.startswith("cuda")
    if not cuda:
        torch.set_num_threads(1)  # as a stage worker on a CPU
    progress(f"{name} ({sizes} sizes) on {args.device}: building or reusing its folder", t0)
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    folder, info = await asyncio.to_thread(
        published_folder, name, sizes, args.build_dir, args.device, dtype
    )
    if cuda:  # the build's blocks back to the device before the sides load
        import gc

        gc.collect()
        torch.cuda.empty_cache()
    progress(f"{folder}: {info['parameters']:,} transformer parameters", t0)
    sides, skipped = _sides(args, folder, info["pipeline"], dtype, (width, height, frames, steps))
    together = args.order == "together" or (
        args.order == "auto" and _fits_together(folder, len(sides), args.device)
    )
    progress(
        f"{len(sides)} sides ({', '.join(s.label for s in sides)}), "
        f"{'loaded together' if together else 'one after another'}; skipped: "
        f"{', '.join(skipped) or 'none'}",
        t0,
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with raw_videos():
        if together:
            await _run_together(sides, args.runs, deadline, t0)
        else:
            await _run_one_by_one(sides, args.runs, deadline, t0)
    per, unit = (frames / FPS, "video_s_per_s") if frames else (1.0, "images_per_s")
    rows: dict[str, Any] = {}
    for side in sides:
        rows[side.label] = side.row(per, unit, None if side is sides[0] else sides[0])
    for spec, why in skipped.items():
        rows[spec] = {"skipped": why}
    met = [side.label for side in sides if side.args.cache is not None and _met(rows[side.label])]
    res: dict[str, Any] = {
        "model": name,
        "sizes": sizes,
        "card": torch.cuda.get_device_name() if cuda else "cpu",
        "device": args.device,
        "dtype": sides[0].args.dtype,
        "parameters": info["parameters"],
        "width": width,
        "height": height,
        **({"frames": frames, "fps": FPS} if frames else {}),
        "steps": steps,
        "runs": args.runs,
        "order": "together" if together else "one after another",
        "rows": rows,
        "target_met_by": met,
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "errors": sum(1 for row in rows.values() if "error" in row),
        "elapsed_s": round(time.perf_counter() - t0, 1),
    }
    if cuda:
        res["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    else:
        res["load_avg_1m"] = round(os.getloadavg()[0], 2)
    return res


def run(args: argparse.Namespace) -> int:
    sizes = args.sizes or ("real" if args.device.startswith("cuda") else "tiny")
    if sizes == "real" and not args.device.startswith("cuda"):
        raise UsageError("--sizes real builds billions of parameters: give --device cuda")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device {args.device}: torch sees no CUDA GPU here")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    res = run_on_loop(_bench(args))
    if not getattr(args, "json", False):
        print(f"{res['model']} on {res['card']}, {res['steps']} steps:")
        for label, row in res["rows"].items():
            print(f"  {label}: {row}")
    print(json.dumps(res))
    if res["errors"]:
        print(f"sides that failed: {res['errors']} (their rows say why)", file=sys.stderr)
        return 1
    return 0
