"""Flux's true classifier-free guidance batched into one forward on the tiny
Flux model (``cfg_batch``, on by default for FluxPipeline): with
``true_cfg_scale > 1`` and a negative prompt the transformer runs once a
step on twice the rows instead of twice, the image is the one the two
forwards make (within a rounding step of 255), batched requests pair too,
and a call without true CFG is one plain forward a step.

Tolerance: the images before PNG encoding at most 1 of 255 apart (a batch
of 2 runs oneDNN kernels other than a batch of 1's; PNG is lossless, so
the decoded images are what the pipeline made)."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
import pytest_asyncio
from PIL import Image

from omnix.engines.diffusers_engine import DiffusersEngine
from omnix.events.types import StageParams
from omnix.pipelines.config import DiffusersArgs
from omnix.transport.work import EngineOutput, GenerateRequest, InputPiece
from tests.engines.forwards import Forwards, within_a_rounding_step

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]

STEPS = 3
TRUE_CFG = dict(num_inference_steps=STEPS, negative_prompt="blurry", true_cfg_scale=4.0)


async def _feed(piece: InputPiece):
    yield piece


async def _run(engine, rid: str, prompt: str, seed: int, **params) -> list[EngineOutput]:
    req = GenerateRequest(rid, "image", StageParams(**params), seed=seed)
    return [o async for o in engine.generate(req, _feed(InputPiece(text=prompt)))]


def _pixels(out: list[EngineOutput]) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(out[-1].data)).convert("RGB")).astype(np.int64)


async def _engine(cfg_batch: bool | None) -> DiffusersEngine:
    engine = DiffusersEngine(
        DiffusersArgs(model="image", device="cpu", max_batch=4, cfg_batch=cfg_batch)
    )
    await engine.start()
    return engine


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def pair(tiny_models):
    """Engines with the guidance batched (the default) and not."""
    on, off = await _engine(None), await _engine(False)
    yield on, off
    await asyncio.gather(on.close(), off.close())


async def test_true_cfg_runs_once_a_step_on_twice_the_rows_and_makes_the_same_image(pair) -> None:
    on, off = pair
    assert on._denoiser.settings()["cfg_batch"] == "on"
    assert off._denoiser.settings()["cfg_batch"] == "off"
    seen_on, seen_off = Forwards(on), Forwards(off)
    try:
        a = await _run(on, "f-on", "a red fox", 5, **TRUE_CFG)
        b = await _run(off, "f-off", "a red fox", 5, **TRUE_CFG)
        assert seen_on.take() == [2] * STEPS
        assert seen_off.take() == [1, 1] * STEPS
    finally:
        seen_on.remove()
        seen_off.remove()
    within_a_rounding_step(_pixels(a), _pixels(b))
    # the negative prompt is honoured, not dropped on the way
    plain = await _run(off, "f-plain", "a red fox", 5, num_inference_steps=STEPS)
    assert not np.array_equal(_pixels(plain), _pixels(b))
    assert type(on.pipe.transformer).__name__ == "FluxTransformer2DModel"


async def test_without_true_cfg_a_step_is_one_plain_forward(pair) -> None:
    on, _ = pair
    seen = Forwards(on)
    try:
        await _run(on, "f-one", "a red fox", 5, num_inference_steps=STEPS)
        assert seen.take() == [1] * STEPS
    finally:
        seen.remove()


async def test_batched_requests_pair_as_twice_their_rows(pair) -> None:
    on, off = pair
    prompts = [("a red fox", "blurry", 1), ("a blue whale", "dark", 2)]

    async def both(engine, tag):
        return await asyncio.gather(
            *(
                _run(
                    engine,
                    f"{tag}-{i}",
                    p,
                    seed,
                    num_inference_steps=STEPS,
                    negative_prompt=neg,
                    true_cfg_scale=3.0,
                )
                for i, (p, neg, seed) in enumerate(prompts)
            )
        )

    seen = Forwards(on)
    try:
        calls = len(on.batcher.calls)
        got = await both(on, "fb-on")
        assert list(on.batcher.calls)[calls:] == [2]
        # two requests of one shape share a call: 4 rows a step
        assert seen.take() == [4] * STEPS
    finally:
        seen.remove()
    want = await both(off, "fb-off")
    for g, w in zip(got, want, strict=True):
        within_a_rounding_step(_pixels(g), _pixels(w))
