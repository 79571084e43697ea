"""``omnix bench diffusion``'s cache table: each step cache against none.

Owns one measurement per (pipeline, cache): the pipeline's diffusion
stage on its real ``DiffusersEngine`` in this process (no HTTP, no
worker: the figures are the denoiser's and the engine's batching), the
cache set as a ``--cache`` spec would set it, and

* ``steps_per_s``: denoising steps a second of one request alone, from
  its first to its last progress output (the text encoder before and the
  VAE after are outside it); ``steps_per_s_c4``: the same of a call of
  four (each step moves four requests);
* ``images_per_s_c1`` / ``_c4`` (a video pipeline: ``video_s_per_s_c1`` /
  ``_c4``, seconds of video made a second): requests one at a time, and
  four at once (equal shapes: the engine runs them as one call);
* ``skipped``: instead, for a cache the pipeline's family does not run;
* ``psnr_db_min`` / ``max_pixel_diff``: the worst over the c=1 requests
  of each output against the uncached output of the same seed and
  prompt (decoded PNGs; a video's MP4 frames, so the H.264 encode of both
  is in the figure; raw frames where the file is a ``.npy``).

Torch runs one thread, as a stage worker does.  ``EngineSide`` (one
engine and what it measured), ``generate_once`` and ``fidelity`` serve the
CFG batching table and the GPU table too (``diffusion_cfg.py``,
``diffusion_gpu.py``).  Does not own the HTTP measurement
(``diffusion.py``) nor applying a cache (the engine's).
"""

from __future__ import annotations

import asyncio
import io
import math
import time
from typing import Any

import msgspec
import numpy as np

from omnix.engines.diffusers_model import describe_model
from omnix.pipelines.config import DiffusersArgs, PipelineConfig
from omnix.pipelines.diffusion_cache import family_problem, parse_cache_spec

#: The caches measured by default: each kind at a setting that skips work
#: on the tiny random-weight models (their first-block residuals move by
#: 0.3-0.45 a step, so first_block's default 0.05 would skip nothing).
DEFAULT_CACHES = (
    "first_block,threshold=0.6",
    "taylorseer,cache_interval=2,disable_cache_before_step=2",
    "pyramid_attention_broadcast",
)


def stage_args(cfg: PipelineConfig) -> DiffusersArgs:
    for st in cfg.stages:
        if isinstance(st.engine, DiffusersArgs):
            return st.engine
    raise ValueError(f"pipeline {cfg.name!r} has no diffusion stage")


#: The start of a ``.npy`` file: raw frames (``diffusion_gpu.py`` writes
#: its videos so, on a machine without PyAV).
NPY_MAGIC = b"\x93NUMPY"


def pixels(data: bytes, video: bool) -> np.ndarray:
    if data.startswith(NPY_MAGIC):
        return np.load(io.BytesIO(data)).astype(np.int64)
    if video:
        from omnix.engines.media_files import mp4_frames

        return mp4_frames(data).astype(np.int64)
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.int64)


def fidelity(got: np.ndarray, want: np.ndarray) -> tuple[float, int]:
    mse = float(((got - want) ** 2).mean())
    return (math.inf if mse == 0 else 10 * math.log10(255**2 / mse)), int(np.abs(got - want).max())


class EngineSide:
    """One engine of a table (a cache, or none; guidance paired or not) and
    what it measured: steps/s of a request alone (``rates``) and of a call
    of four (``rates_c4``), the outputs alone and four at a time by seed."""

    def __init__(self, args: DiffusersArgs, params: dict[str, Any] | None = None) -> None:
        from omnix.engines.diffusers_engine import DiffusersEngine

        self.args = args
        #: request parameters beside the steps (Flux's true CFG in the CFG table)
        self.params = params or {}
        self.video = args.output_modality == "video"
        self.engine = DiffusersEngine(args)
        self.rates: list[float] = []
        self.rates_c4: list[float] = []
        self.outputs: dict[int, np.ndarray] = {}
        self.outputs_c4: dict[int, np.ndarray] = {}
        self.c1_s = 0.0
        self.c4_s = 0.0

    async def one(self, seed: int, steps: int, rates: list[float] | None = None) -> bytes:
        from omnix.events.types import StageParams

        data, stamps = await generate_once(
            self.engine, seed, StageParams(num_inference_steps=steps, **self.params)
        )
        if rates is not None and len(stamps) > 1:
            rates.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
        return data

    async def alone(self, i: int, steps: int) -> None:
        t0 = time.perf_counter()
        data = await self.one(i, steps, self.rates)
        self.c1_s += time.perf_counter() - t0
        self.outputs[i] = pixels(data, self.video)

    async def four(self, first: int, steps: int) -> None:
        t0 = time.perf_counter()
        got = await asyncio.gather(
            self.one(first, steps, self.rates_c4), *(self.one(first + k, steps) for k in (1, 2, 3))
        )
        self.c4_s += time.perf_counter() - t0
        for k, data in enumerate(got):
            self.outputs_c4[first + k] = pixels(data, self.video)

    def row(self, n: int, reference: EngineSide | None) -> dict[str, Any]:
        a = self.args
        per = a.default_frames / a.default_fps if self.video else 1.0
        unit = "video_s_per_s" if self.video else "images_per_s"
        out: dict[str, Any] = {
            "steps_per_s": _median(self.rates),
            "steps_per_s_c4": _median(self.rates_c4),
            f"{unit}_c1": round(n / self.c1_s * per, 3),
            f"{unit}_c4": round(4 * n / self.c4_s * per, 3),
        }
        if reference is not None:
            worst = [fidelity(self.outputs[i], reference.outputs[i]) for i in range(n)]
            psnr = min(p for p, _ in worst)
            out["psnr_db_min"] = None if psnr == math.inf else round(psnr, 1)
            out["max_pixel_diff"] = max(d for _, d in worst)
        return out


async def generate_once(engine: Any, seed: int, params: Any) -> tuple[bytes, list[float]]:
    """One request of ``seed`` (its prompt one of seven) with ``params`` on
    ``engine``: its file, and the time each progress output arrived."""
    from omnix.transport.work import GenerateRequest, InputPiece

    async def feed():
        yield InputPiece(text=f"a red fox, take {seed % 7}")

    req = GenerateRequest(f"c-{seed}", "x", params, seed=seed)
    stamps: list[float] = []
    data = b""
    async for out in engine.generate(req, feed()):
        if out.is_progress:
            stamps.append(time.perf_counter())
        elif out.data:
            data = out.data
    return data, stamps


async def run_sides(sides: list[EngineSide], n: int, steps: int) -> None:
    """Each side started, warmed, then ``n`` seeds alone and ``n`` groups of
    four, the sides taking turns at each (so the machine's load falls on
    all alike), and closed."""
    for side in sides:
        await side.engine.start()
    try:
        for side in sides:
            await side.one(10**6, steps)  # warm up
        for i in range(n):
            for side in sides:
                await side.alone(i, steps)
        for i in range(n):
            for side in sides:
                await side.four(1000 + 4 * i, steps)
    finally:
        for side in sides:
            await side.engine.close()


def _median(rates: list[float]) -> float | None:
    return round(sorted(rates)[len(rates) // 2], 1) if rates else None


async def cache_table(
    cfg: PipelineConfig, specs: tuple[str, ...], n: int, steps: int
) -> dict[str, Any]:
    """``{"off": row, spec: row, ...}`` for ``cfg``'s diffusion stage: all
    sides loaded together and run by turns, request by request (c=1) and
    four by four (c=4), so a drift in the host's speed falls on each.
    ``psnr_db_min`` is null where every output equals the uncached one."""
    import torch

    torch.set_num_threads(1)
    base = msgspec.structs.replace(stage_args(cfg), cache=None, max_batch=4, device="cpu")
    sides = {"off": EngineSide(base)}
    skipped: dict[str, Any] = {}
    model = describe_model(base)
    for spec in specs:
        _, cache = parse_cache_spec(spec)
        refused = family_problem(cache, model.pipeline) if model is not None else None
        if refused is not None:
            skipped[spec] = {"skipped": refused}
            continue
        sides[spec] = EngineSide(msgspec.structs.replace(base, cache=cache))
    await run_sides(list(sides.values()), n, steps)
    off = sides["off"].row(n, None)
    table: dict[str, Any] = {"off": off}
    for spec in specs:
        if spec in skipped:
            table[spec] = skipped[spec]
            continue
        row = sides[spec].row(n, sides["off"])
        row["speedup_steps"] = (
            round(row["steps_per_s"] / off["steps_per_s"], 2)
            if row["steps_per_s"] and off["steps_per_s"]
            else None
        )
        table[spec] = row
    return table
