"""A diffusion stage's step cache (diffusers' own hooks) on the tiny Flux
and Wan pipelines: each kind's output stays close to the uncached one of
the same seed, with its progress events; an aborted cached call leaves
nothing behind for the next; batched and edited requests run cached; a
cached video completes.

Tolerance against the uncached output of the same seed: PSNR >= 30 dB and
no channel of any pixel more than 16 of 255 away (the tiny random-weight
models measure 52-66 dB and 1-4 of 255: docs/engines.md, "Step
caching").  That the cache acted is pinned by the output differing from
the uncached one at all."""

from __future__ import annotations

import asyncio
import io
import math

import numpy as np
import pytest
from PIL import Image

from omnix.engines.diffusers_engine import DiffusersEngine
from omnix.engines.media_files import mp4_frames
from omnix.events.types import BlobRef, ChatMessage, MediaPart, StageParams
from omnix.pipelines.config import DiffusersArgs
from omnix.pipelines.diffusion_cache import (
    FirstBlockCache,
    PyramidAttentionBroadcast,
    StepCache,
    TaylorSeerCache,
)
from omnix.transport.work import EngineOutput, GenerateRequest, InputPiece

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]

MIN_PSNR_DB = 30.0
MAX_PIXEL_DIFF = 16

#: one setting of each kind that skips work on the tiny models in 8 steps
CACHES: dict[str, StepCache] = {
    "first_block": FirstBlockCache(threshold=0.6),
    "taylorseer": TaylorSeerCache(cache_interval=2, disable_cache_before_step=2),
    "pyramid_attention_broadcast": PyramidAttentionBroadcast(
        spatial_attention_timestep_skip_range=(0, 1000)
    ),
}


async def _feed(*pieces: InputPiece):
    for p in pieces:
        yield p


async def _run(engine, rid: str, piece: InputPiece, seed: int = 0, **params) -> list[EngineOutput]:
    req = GenerateRequest(rid, "image", StageParams(**params), seed=seed)
    return [o async for o in engine.generate(req, _feed(piece))]


def _rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.int64)


def _close(cached: np.ndarray, plain: np.ndarray) -> tuple[float, int]:
    mse = float(((cached - plain) ** 2).mean())
    psnr = math.inf if mse == 0 else 10 * math.log10(255**2 / mse)
    return psnr, int(np.abs(cached - plain).max())


def _assert_close_not_equal(cached: np.ndarray, plain: np.ndarray) -> None:
    psnr, worst = _close(cached, plain)
    assert psnr != math.inf, "the cache skipped nothing"
    assert psnr >= MIN_PSNR_DB and worst <= MAX_PIXEL_DIFF, (psnr, worst)


async def _engine(cache: StepCache, **kw) -> DiffusersEngine:
    engine = DiffusersEngine(DiffusersArgs(model="image", device="cpu", cache=cache, **kw))
    info = await engine.start()
    assert info.settings["cache"] == type(cache).__struct_config__.tag
    return engine


@pytest.mark.parametrize("kind", sorted(CACHES))
async def test_each_kind_stays_close_to_the_uncached_image_with_its_progress(
    image_engine, tiny_models, kind
) -> None:
    engine = await _engine(CACHES[kind])
    try:
        piece = InputPiece(text="a red fox")
        cached = await _run(engine, f"c-{kind}", piece, seed=5, num_inference_steps=8)
        plain = await _run(image_engine, f"p-{kind}", piece, seed=5, num_inference_steps=8)
        assert [(o.step, o.total) for o in cached if o.is_progress] == [(i, 8) for i in range(1, 9)]
        assert cached[-1].finish_reason == "stop"
        _assert_close_not_equal(_rgb(cached[-1].data), _rgb(plain[-1].data))
    finally:
        await engine.close()


@pytest.mark.parametrize("kind", sorted(CACHES))
async def test_an_aborted_cached_call_leaves_no_state_for_the_next(tiny_models, kind) -> None:
    engine = await _engine(CACHES[kind])
    try:
        piece = InputPiece(text="a quiet harbour")
        first = await _run(engine, "r-1", piece, seed=7, num_inference_steps=8)
        req = GenerateRequest("r-cut", "image", StageParams(num_inference_steps=30), seed=9)
        async for out in engine.generate(req, _feed(InputPiece(text="something else"))):
            if out.step >= 4:
                await engine.abort("r-cut")
        assert any(h[0] == "r-cut" and h[2] == "aborted" for h in engine.history)
        again = await _run(engine, "r-2", piece, seed=7, num_inference_steps=8)
        assert again[-1].data == first[-1].data
    finally:
        await engine.close()


async def test_cached_requests_batch_and_each_stays_close(image_engine, tiny_models) -> None:
    engine = await _engine(CACHES["first_block"], max_batch=4)
    try:
        prompts = ["a red cube", "a blue lake", "a green tree"]
        calls = len(engine.batcher.calls)
        together = await asyncio.gather(
            *(
                _run(engine, f"b-{i}", InputPiece(text=p), seed=20 + i, num_inference_steps=8)
                for i, p in enumerate(prompts)
            )
        )
        assert list(engine.batcher.calls)[calls:] == [3]
        for i, (p, outs) in enumerate(zip(prompts, together, strict=True)):
            assert [o.step for o in outs if o.is_progress] == list(range(1, 9))
            plain = await _run(image_engine, f"bp-{i}", InputPiece(text=p), seed=20 + i)
            psnr, worst = _close(_rgb(outs[-1].data), _rgb(plain[-1].data))
            assert psnr >= MIN_PSNR_DB and worst <= MAX_PIXEL_DIFF, (psnr, worst)
    finally:
        await engine.close()


async def test_an_edit_runs_cached_on_the_shared_transformer(image_engine, tiny_models) -> None:
    engine = await _engine(CACHES["first_block"])
    try:
        rng = np.random.default_rng(0)
        picture = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
        part = MediaPart(kind="image", blob=BlobRef(digest="0" * 32, nbytes=0))
        piece = InputPiece(
            messages=(ChatMessage("user", "make it blue", media=(part,)),), media=(picture,)
        )
        cached = await _run(engine, "e-c", piece, seed=3, num_inference_steps=8, strength=1.0)
        plain = await _run(image_engine, "e-p", piece, seed=3, num_inference_steps=8, strength=1.0)
        assert [o.step for o in cached if o.is_progress] == list(range(1, 9))
        _assert_close_not_equal(_rgb(cached[-1].data), _rgb(plain[-1].data))
    finally:
        await engine.close()


async def test_a_cached_video_completes_close_to_the_uncached_one(video_engine) -> None:
    engine = DiffusersEngine(
        DiffusersArgs(
            model="video",
            device="cpu",
            output_modality="video",
            default_size=32,
            cache=CACHES["first_block"],
        )
    )
    await engine.start()
    try:
        piece = InputPiece(text="a cat walks")
        params = dict(num_inference_steps=6, num_frames=9, fps=8)
        req = GenerateRequest("v-c", "video", StageParams(**params), seed=4)
        cached = [o async for o in engine.generate(req, _feed(piece))]
        req = GenerateRequest("v-p", "video", StageParams(**params), seed=4)
        plain = [o async for o in video_engine.generate(req, _feed(piece))]
        assert [o.step for o in cached if o.is_progress] == list(range(1, 7))
        a = mp4_frames(cached[-1].data).astype(np.int64)
        b = mp4_frames(plain[-1].data).astype(np.int64)
        assert a.shape == b.shape == (9, 32, 32, 3)
        psnr, _ = _close(a, b)
        assert psnr >= MIN_PSNR_DB  # an H.264 encode of each: the max differs by codec steps
    finally:
        await engine.close()
