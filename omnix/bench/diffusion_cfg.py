"""``omnix bench diffusion``'s CFG batching table: guidance in one forward against two.

Owns one measurement of a pipeline's diffusion stage (default
``tiny-video``: Wan, guidance 5.0 by default, so two transformer calls a
step; ``tiny-image``: Flux, its requests sent with true CFG, ``TRUE_CFG``) on two real ``DiffusersEngine`` s in this process, one with
``cfg_batch`` off and one on, loaded together and run by turns (request
by request, then four by four), so a drift in the host's speed falls on
both:

* ``steps_per_s_c1`` / ``steps_per_s_c4``: denoising steps a second of a
  request alone and of a call of four (median; from its first to its
  last progress output);
* ``video_s_per_s_c1`` / ``_c4``: seconds of video made a second
  (``images_per_s_c1`` / ``_c4`` for an image pipeline);
* ``speedup_steps_c1`` / ``_c4`` (on): on's steps/s over off's;
* ``psnr_db_min`` / ``max_pixel_diff`` (on): the worst, over every video
  (alone and four at a time), of on's decoded MP4 frames against off's
  for the same seed and prompt (an image's PNG); ``identical_videos`` of
  ``videos_compared``: how many decode to equal frames.  (The H.264 encode
  is in the figure: where float rounding tips a value by 1 of 255 before
  it, the encoder can move its decoded frames by several.)

Torch runs one thread, as a stage worker does.  Does not own pairing the
guidance (``omnix.engines.diffusers_cfg``) nor the cache table
(``diffusion_cache.py``).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np

from omnix.bench.diffusion_cache import EngineSide, fidelity, run_sides, stage_args
from omnix.engines.diffusers_model import describe_model
from omnix.pipelines.config import PipelineConfig

#: What a Flux request of the table sends: true CFG against a negative prompt.
TRUE_CFG: dict[str, Any] = {"negative_prompt": "blurry, low quality", "true_cfg_scale": 4.0}


async def cfg_table(cfg: PipelineConfig, n: int, steps: int) -> dict[str, Any]:
    """``{"pipeline", "off": row, "on": row}`` for ``cfg``'s diffusion stage."""
    import torch

    torch.set_num_threads(1)
    base = msgspec.structs.replace(stage_args(cfg), max_batch=4, device="cpu")
    model = describe_model(base)
    # Flux guides with two forwards only under true CFG, which a request asks for.
    params = TRUE_CFG if model is not None and model.pipeline == "FluxPipeline" else None
    sides = {
        "off": EngineSide(msgspec.structs.replace(base, cfg_batch=False), params),
        "on": EngineSide(msgspec.structs.replace(base, cfg_batch=True), params),
    }
    await run_sides(list(sides.values()), n, steps)
    off, on = sides["off"], sides["on"]
    rows = {name: _rates(side.row(n, None)) for name, side in sides.items()}
    for c in ("c1", "c4"):
        a, b = rows["on"][f"steps_per_s_{c}"], rows["off"][f"steps_per_s_{c}"]
        rows["on"][f"speedup_steps_{c}"] = round(a / b, 2) if a and b else None
    pairs = [(on.outputs[k], off.outputs[k]) for k in sorted(off.outputs)]
    pairs += [(on.outputs_c4[k], off.outputs_c4[k]) for k in sorted(off.outputs_c4)]
    worst = [fidelity(a, b) for a, b in pairs]
    psnr = min(p for p, _ in worst)
    rows["on"]["psnr_db_min"] = None if psnr == math.inf else round(psnr, 1)
    rows["on"]["max_pixel_diff"] = max(d for _, d in worst)
    rows["on"]["identical_videos"] = sum(np.array_equal(a, b) for a, b in pairs)
    rows["on"]["videos_compared"] = len(pairs)
    return {"pipeline": cfg.name, **rows}


def _rates(row: dict[str, Any]) -> dict[str, Any]:
    """The cache table's row under this table's names (``steps_per_s_c1``)."""
    return {
        "steps_per_s_c1": row["steps_per_s"],
        **{k: v for k, v in row.items() if k != "steps_per_s"},
    }
