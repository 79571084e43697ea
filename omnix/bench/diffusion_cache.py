"""``omnix bench diffusion``'s cache table: each step cache against none.

Owns one measurement per (pipeline, cache): the pipeline's diffusion
stage on its real ``DiffusersEngine`` in this process (no HTTP, no
worker: the figures are the denoiser's and the engine's batching), the
cache set as a ``--cache`` spec would set it, and

* ``steps_per_s``: denoising steps a second of one request alone, from
  its first to its last progress output (the text encoder before and the
  VAE after are outside it);
* ``images_per_s_c1`` / ``_c4`` (a video pipeline: ``video_s_per_s_c1`` /
  ``_c4``, seconds of video made a second): requests one at a time, and
  four clients closed-loop (equal shapes: the engine batches them);
* ``psnr_db_min`` / ``max_pixel_diff``: the worst over the c=1 requests
  of each output against the uncached output of the same seed and
  prompt (decoded PNGs; a video's MP4 frames, so the H.264 encode of both
  is in the figure).

Torch runs one thread, as a stage worker does.  Does not own the HTTP
measurement (``diffusion.py``) nor applying a cache (the engine's).
"""

from __future__ import annotations

import asyncio
import io
import math
import time
from typing import Any

import msgspec
import numpy as np

from omnix.pipelines.config import DiffusersArgs, PipelineConfig
from omnix.pipelines.diffusion_cache import parse_cache_spec

#: The caches measured by default: each kind at a setting that skips work
#: on the tiny random-weight models (their first-block residuals move by
#: 0.3-0.45 a step, so first_block's default 0.05 would skip nothing).
DEFAULT_CACHES = (
    "first_block,threshold=0.6",
    "taylorseer,cache_interval=2,disable_cache_before_step=2",
    "pyramid_attention_broadcast",
)


def _stage_args(cfg: PipelineConfig) -> DiffusersArgs:
    for st in cfg.stages:
        if isinstance(st.engine, DiffusersArgs):
            return st.engine
    raise ValueError(f"pipeline {cfg.name!r} has no diffusion stage")


def _pixels(data: bytes, video: bool) -> np.ndarray:
    if video:
        from omnix.engines.media_files import mp4_frames

        return mp4_frames(data).astype(np.int64)
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.int64)


def _fidelity(got: np.ndarray, want: np.ndarray) -> tuple[float, int]:
    mse = float(((got - want) ** 2).mean())
    return (math.inf if mse == 0 else 10 * math.log10(255**2 / mse)), int(np.abs(got - want).max())


async def _measure(
    args: DiffusersArgs, n: int, steps: int, reference: dict[int, np.ndarray] | None
) -> tuple[dict[str, Any], dict[int, np.ndarray]]:
    from omnix.engines.diffusers_engine import DiffusersEngine
    from omnix.events.types import StageParams
    from omnix.transport.work import GenerateRequest, InputPiece

    video = args.output_modality == "video"
    engine = DiffusersEngine(args)
    await engine.start()
    rates: list[float] = []
    outputs: dict[int, np.ndarray] = {}

    async def one(seed: int, timed: bool) -> bytes:
        async def feed():
            yield InputPiece(text=f"a red fox, take {seed % 7}")

        req = GenerateRequest(f"c-{seed}", "x", StageParams(num_inference_steps=steps), seed=seed)
        stamps: list[float] = []
        data = b""
        async for out in engine.generate(req, feed()):
            if out.is_progress:
                stamps.append(time.perf_counter())
            elif out.data:
                data = out.data
        if timed and len(stamps) > 1:
            rates.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
        return data

    try:
        await one(10**6, False)  # warm up
        t0 = time.perf_counter()
        for i in range(n):
            outputs[i] = _pixels(await one(i, True), video)
        c1 = n / (time.perf_counter() - t0)
        todo = iter(range(n))

        async def client() -> None:
            for i in todo:
                await one(1000 + i, False)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(4)))
        c4 = n / (time.perf_counter() - t0)
    finally:
        await engine.close()
    per = args.default_frames / args.default_fps if video else 1.0
    unit = "video_s_per_s" if video else "images_per_s"
    row: dict[str, Any] = {
        "steps_per_s": round(sorted(rates)[len(rates) // 2], 1) if rates else None,
        f"{unit}_c1": round(c1 * per, 3),
        f"{unit}_c4": round(c4 * per, 3),
    }
    if reference is not None:
        worst = [_fidelity(outputs[i], reference[i]) for i in range(n)]
        psnr = min(p for p, _ in worst)
        row["psnr_db_min"] = None if psnr == math.inf else round(psnr, 1)
        row["max_pixel_diff"] = max(d for _, d in worst)
    return row, outputs


async def cache_table(
    cfg: PipelineConfig, specs: tuple[str, ...], n: int, steps: int
) -> dict[str, Any]:
    """``{"off": row, spec: row, ...}`` for ``cfg``'s diffusion stage.
    ``psnr_db_min`` is null where every output equals the uncached one."""
    import torch

    torch.set_num_threads(1)
    base = msgspec.structs.replace(_stage_args(cfg), cache=None, max_batch=4, device="cpu")
    off, reference = await _measure(base, n, steps, None)
    table: dict[str, Any] = {"off": off}
    for spec in specs:
        _, cache = parse_cache_spec(spec)
        row, _ = await _measure(msgspec.structs.replace(base, cache=cache), n, steps, reference)
        row["speedup_steps"] = (
            round(row["steps_per_s"] / off["steps_per_s"], 2)
            if row["steps_per_s"] and off["steps_per_s"]
            else None
        )
        table[spec] = row
    return table
