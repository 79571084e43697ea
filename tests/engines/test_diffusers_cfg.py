"""Classifier-free guidance batched into one forward on the tiny Wan 2.2
video model (``cfg_batch``, on by default for Wan): the transformer runs
once a step on twice the rows instead of twice, the video is the one the
two forwards make, image-to-video and batched requests pair too, a step
cache composes, an abort puts the transformer back, a call the pairing
does not recognise is computed as it comes, and ``cfg_batch = true`` on a
family omnix does not batch is refused at start.

Tolerance against the unbatched guidance of the same seed: the frames
before the H.264 encode at most 1 of 255 apart.  Not bit-equal on this
CPU: oneDNN runs the patch embedding's Conv3d on a batch of 2 with
another kernel than on a batch of 1 (6e-7 apart in its output), which
leaves the last latents ~4e-6 apart, enough to tip a rare value's
rounding to uint8 by one (measured: 0-2 of 27,648 values differ).  The
MP4s are compared only where the frames are equal: the encoder turns a
1-of-255 difference into up to ~11 in its decoded frames."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
import pytest_asyncio

import omnix.engines.diffusers_jobs as diffusers_jobs
from omnix.engines.diffusers_cfg import WAN_SHARED_ROWS, Guidance, PairedDenoiser
from omnix.engines.diffusers_engine import DiffusersEngine
from omnix.engines.media_files import mp4_frames
from omnix.events.types import BlobRef, ChatMessage, MediaPart, StageParams
from omnix.pipelines.config import DiffusersArgs
from omnix.pipelines.diffusion_cache import FirstBlockCache, PyramidAttentionBroadcast, StepCache
from omnix.transport.work import EngineOutput, GenerateRequest, InputPiece
from tests.engines.forwards import MAX_PIXEL_DIFF, Forwards, within_a_rounding_step

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]

STEPS = 4
PARAMS = dict(num_inference_steps=STEPS, num_frames=9, fps=8)


async def _feed(*pieces: InputPiece):
    for p in pieces:
        yield p


async def _run(engine, rid: str, piece: InputPiece, seed: int, **params) -> list[EngineOutput]:
    req = GenerateRequest(rid, "video", StageParams(**params), seed=seed)
    return [o async for o in engine.generate(req, _feed(piece))]


async def _engine(cfg_batch: bool | None, cache: StepCache | None = None) -> DiffusersEngine:
    engine = DiffusersEngine(
        DiffusersArgs(
            model="video",
            device="cpu",
            output_modality="video",
            default_size=32,
            max_batch=4,
            cache=cache,
            cfg_batch=cfg_batch,
        )
    )
    await engine.start()
    return engine


@pytest.fixture
def frames(monkeypatch) -> Iterator[list[np.ndarray]]:
    """Each video's frames as the engine hands them to its MP4 encoder
    (spied on, still encoding), in the order the videos were made."""
    seen: list[np.ndarray] = []
    encode = diffusers_jobs.encode_mp4

    def spy(video, fps):
        seen.append(np.asarray(video).astype(np.int64))
        return encode(video, fps)

    monkeypatch.setattr(diffusers_jobs, "encode_mp4", spy)
    yield seen


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def pair(tiny_models):
    """Engines with the guidance batched (the default) and not."""
    on, off = await _engine(None), await _engine(False)
    yield on, off
    await asyncio.gather(on.close(), off.close())


async def test_the_guidance_runs_once_a_step_on_twice_the_rows_and_makes_the_same_video(
    pair, frames
) -> None:
    on, off = pair
    assert on._denoiser.settings()["cfg_batch"] == "on"
    assert off._denoiser.settings()["cfg_batch"] == "off"
    counts = [Forwards(on), Forwards(off)]
    try:
        cat = InputPiece(text="a cat walks")
        batched = await _run(on, "g-on", cat, seed=4, **PARAMS)
        plain = await _run(off, "g-off", cat, seed=4, **PARAMS)
        assert counts[0].take() == [2] * STEPS
        assert counts[1].take() == [1] * (2 * STEPS)
    finally:
        for c in counts:
            c.remove()
    for outs in (batched, plain):
        assert [(o.step, o.total) for o in outs if o.is_progress] == [
            (i, STEPS) for i in range(1, STEPS + 1)
        ]
        assert outs[-1].finish_reason == "stop"
    a, b = frames
    within_a_rounding_step(a, b)
    if np.array_equal(a, b):
        assert batched[-1].data == plain[-1].data
    assert type(on.pipe.transformer).__name__ == "WanTransformer3DModel"  # put back


async def test_no_guidance_is_one_plain_forward_a_step(pair) -> None:
    on, _ = pair
    count = Forwards(on)
    try:
        await _run(on, "g-1", InputPiece(text="x"), seed=1, guidance_scale=1.0, **PARAMS)
        assert count.take() == [1] * STEPS
    finally:
        count.remove()


async def test_image_to_video_pairs_its_guidance_too(pair, frames) -> None:
    first = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    part = MediaPart(kind="image", blob=BlobRef("0" * 32, 0))
    piece = InputPiece(messages=(ChatMessage("user", "it moves", media=(part,)),), media=(first,))
    on, off = pair
    count = Forwards(on)
    try:
        await _run(on, "i-on", piece, seed=2, **PARAMS)
        assert count.take() == [2] * STEPS
    finally:
        count.remove()
    await _run(off, "i-off", piece, seed=2, **PARAMS)
    within_a_rounding_step(*frames)


async def test_batched_requests_run_as_twice_their_rows(pair, frames) -> None:
    on, off = pair
    prompts = ["a red cube", "a blue lake", "a green tree"]
    count = Forwards(on)
    results = {}
    try:
        for name, engine in (("on", on), ("off", off)):
            calls = len(engine.batcher.calls)
            results[name] = await asyncio.gather(
                *(
                    _run(engine, f"b-{name}-{i}", InputPiece(text=p), seed=20 + i, **PARAMS)
                    for i, p in enumerate(prompts)
                )
            )
            assert list(engine.batcher.calls)[calls:] == [3]
        assert count.take() == [6] * STEPS
    finally:
        count.remove()
    for outs in (*results["on"], *results["off"]):
        assert [o.step for o in outs if o.is_progress] == list(range(1, STEPS + 1))
    # the frames in call order: on's three videos, then off's
    for a, b in zip(frames[:3], frames[3:], strict=True):
        within_a_rounding_step(a, b)


async def test_first_block_cache_composes_and_still_skips(pair, frames) -> None:
    """A threshold no step reaches: each half reuses its own first step's
    residuals, batched or not, so the two agree as closely as uncached;
    and they differ from the uncached video (the cache acted)."""
    cache = FirstBlockCache(threshold=1e9)
    on, off = await _engine(True, cache), await _engine(False, cache)
    count = Forwards(on)
    try:
        cat = InputPiece(text="a cat walks")
        await _run(on, "f-on", cat, seed=4, **PARAMS)
        assert count.take() == [2] * STEPS
        await _run(off, "f-off", cat, seed=4, **PARAMS)
        await _run(pair[1], "f-plain", cat, seed=4, **PARAMS)
    finally:
        count.remove()
        await asyncio.gather(on.close(), off.close())
    cached_on, cached_off, uncached = frames
    within_a_rounding_step(cached_on, cached_off)
    assert int(np.abs(cached_on - uncached).max()) > MAX_PIXEL_DIFF


async def test_pyramid_attention_broadcast_runs_on_the_paired_forward(pair) -> None:
    """PAB's skip counter counts forwards: paired, both halves reuse a
    step's attention every other step (docs/engines.md says how that
    differs from the two forwards'); the call completes, once a step."""
    engine = await _engine(
        None, PyramidAttentionBroadcast(spatial_attention_timestep_skip_range=(0, 1000))
    )
    count = Forwards(engine)
    try:
        outs = await _run(engine, "p-on", InputPiece(text="a cat walks"), seed=4, **PARAMS)
        assert count.take() == [2] * STEPS
        assert mp4_frames(outs[-1].data).shape == (9, 32, 32, 3)
    finally:
        count.remove()
        await engine.close()


async def test_an_abort_puts_the_transformer_back(pair) -> None:
    on, _ = pair
    req = GenerateRequest("a-cut", "video", StageParams(num_inference_steps=30, num_frames=5))
    async for out in on.generate(req, _feed(InputPiece(text="long"))):
        if out.step >= 2:
            await on.abort("a-cut")
    outs = await _run(on, "a-next", InputPiece(text="next"), seed=3, **PARAMS)
    assert outs[-1].finish_reason == "stop"
    assert any(h[0] == "a-cut" and h[2] == "aborted" for h in on.history)
    # (the aborted call ends in the pipeline thread after its generate has
    # returned; the next call runs after it, and would leave a stand-in
    # behind had the aborted one left its own)
    assert type(on.pipe.transformer).__name__ == "WanTransformer3DModel"


async def test_a_call_the_pairing_does_not_recognise_is_computed_as_it_comes(pair) -> None:
    import torch

    transformer = pair[0].pipe.transformer
    g = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 48, 3, 2, 2, generator=g)
    timestep = torch.full((1, 3), 500.0)
    positive, negative = torch.randn(2, 1, 512, 32, generator=g).unbind(0)
    positive, negative = positive.contiguous(), negative.contiguous()

    def call(module, hidden, embeds):
        with module.cache_context("uncond" if embeds is negative else "cond"):
            return module(
                hidden_states=hidden,
                timestep=timestep,
                encoder_hidden_states=embeds,
                attention_kwargs=None,
                return_dict=False,
            )[0]

    with torch.no_grad():
        guidance = Guidance({"encoder_hidden_states": (positive, negative)}, WAN_SHARED_ROWS)
        stand_in = PairedDenoiser(transformer, guidance)
        call(stand_in, latents, positive)
        other = latents + 1  # not the latents the pair was computed on
        got = call(stand_in, other, negative)
        assert (stand_in.paired, stand_in.answered, stand_in.alone) == (1, 0, 1)
        torch.testing.assert_close(got, call(transformer, other, negative), rtol=0, atol=0)
        call(stand_in, latents, positive)
        answered = call(stand_in, latents, negative)
        assert (stand_in.paired, stand_in.answered, stand_in.alone) == (2, 1, 1)
        torch.testing.assert_close(
            answered, call(transformer, latents, negative), rtol=0, atol=1e-5
        )


async def test_cfg_batch_on_a_family_omnix_does_not_batch_is_refused_when_applied() -> None:
    from omnix.engines.diffusers_cache import Denoiser

    with pytest.raises(ValueError) as refused:
        Denoiser(None, "off", cfg_batch=True).apply(object(), "StableDiffusion3Pipeline")
    assert str(refused.value) == (
        "engine.cfg_batch: omnix batches the two guidance forwards of FluxPipeline, "
        "WanPipeline only, not StableDiffusion3Pipeline's; remove cfg_batch (or set it false)"
    )
