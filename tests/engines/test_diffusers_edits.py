"""The diffusers engine's image edits, partial images and batching on the
tiny Flux model: image-to-image, inpaint (the client's pixels outside the
mask kept exactly), Kontext's reference-image edit, previews at chosen
steps, equal-shape requests in one call (each request's image equal to
the one it gets alone, within float rounding), an aborted member dropped
at its next step while the others finish."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
from PIL import Image

from omnix.engines.diffusers_jobs import preview_steps
from omnix.events.types import BlobRef, ChatMessage, MediaPart, StageParams
from omnix.transport.work import EngineOutput, GenerateRequest, InputPiece

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]

_REF = BlobRef(digest="0" * 32, nbytes=0)


async def _feed(*pieces: InputPiece):
    for p in pieces:
        yield p


def _picture(w: int = 64, h: int = 64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def _edit_piece(prompt: str, image: np.ndarray, mask: np.ndarray | None = None) -> InputPiece:
    parts = [MediaPart(kind="image", blob=_REF)]
    arrays = [image]
    if mask is not None:
        parts.append(MediaPart(kind="mask", blob=_REF))
        arrays.append(mask)
    return InputPiece(
        messages=(ChatMessage("user", prompt, media=tuple(parts)),), media=tuple(arrays)
    )


async def _run(engine, rid: str, piece: InputPiece, seed: int = 0, **params) -> list[EngineOutput]:
    req = GenerateRequest(rid, "image", StageParams(**params), seed=seed)
    return [o async for o in engine.generate(req, _feed(piece))]


def _rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


async def test_image_to_image_follows_strength(image_engine) -> None:
    src = _picture()
    outs = await _run(
        image_engine,
        "e-i2i",
        _edit_piece("a red cube", src),
        seed=2,
        num_inference_steps=8,
        strength=0.5,
    )
    progress = [(o.step, o.total) for o in outs if o.is_progress]
    # strength 0.5 of 8 steps: the last 4 of the schedule run.
    assert progress == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert outs[-1].media_type == "image/png" and _rgb(outs[-1].data).shape == (64, 64, 3)
    again = await _run(
        image_engine,
        "e-i2i-2",
        _edit_piece("a red cube", src),
        seed=2,
        num_inference_steps=8,
        strength=0.5,
    )
    assert again[-1].data == outs[-1].data
    other = await _run(
        image_engine,
        "e-i2i-3",
        _edit_piece("a red cube", _picture(seed=9)),
        seed=2,
        num_inference_steps=8,
        strength=0.5,
    )
    assert other[-1].data != outs[-1].data  # the input image matters


async def test_inpaint_keeps_the_pixels_outside_the_mask(image_engine) -> None:
    src = _picture(48, 40, seed=3)  # not a multiple of the model's 8: run at 48x40
    mask = np.zeros((40, 48), np.uint8)
    mask[8:24, 16:40] = 255  # repaint this box
    outs = await _run(
        image_engine,
        "e-inpaint",
        _edit_piece("a cat", src, mask),
        seed=5,
        num_inference_steps=4,
        strength=1.0,
    )
    out = _rgb(outs[-1].data)
    assert out.shape == src.shape
    keep = mask == 0
    assert np.array_equal(out[keep], src[keep])  # exactly the client's pixels
    assert not np.array_equal(out[~keep], src[~keep])  # the box was repainted


async def test_an_odd_size_is_run_at_the_model_size_and_given_back_as_sent(image_engine) -> None:
    src = _picture(50, 37, seed=4)
    mask = np.zeros((37, 50), np.uint8)
    mask[:10, :10] = 255
    outs = await _run(
        image_engine, "e-odd", _edit_piece("x", src, mask), num_inference_steps=2, strength=1.0
    )
    out = _rgb(outs[-1].data)
    assert out.shape == (37, 50, 3)
    assert np.array_equal(out[mask == 0], src[mask == 0])


async def test_reference_edit_is_kontext(batch_engine) -> None:
    src = _picture(48, 64, seed=6)
    outs = await _run(
        batch_engine, "e-ref", _edit_piece("make it blue", src), seed=1, num_inference_steps=3
    )
    assert [(o.step, o.total) for o in outs if o.is_progress] == [(1, 3), (2, 3), (3, 3)]
    assert _rgb(outs[-1].data).shape == (64, 48, 3)
    assert any(h == ("e-ref", 3, "done") for h in batch_engine.history)
    assert "reference" in batch_engine._siblings
    assert type(batch_engine._siblings["reference"]).__name__ == "FluxKontextPipeline"
    with pytest.raises(ValueError, match="strength is not honoured"):
        await _run(batch_engine, "e-ref-s", _edit_piece("x", src), strength=0.5)


async def test_preview_steps_spread_over_the_schedule() -> None:
    assert preview_steps(0, 8) == frozenset()
    assert preview_steps(1, 8) == {4}
    assert preview_steps(3, 8) == {2, 4, 6}
    assert preview_steps(3, 2) == {1}
    assert preview_steps(2, 1) == frozenset()


async def test_partial_images_at_the_chosen_steps(image_engine) -> None:
    outs = await _run(
        image_engine,
        "e-partial",
        InputPiece(text="a lake"),
        seed=1,
        num_inference_steps=6,
        partial_images=2,
        output_format="jpeg",
    )
    previews = [(o.step, o.media_type) for o in outs if o.is_progress and o.preview]
    assert previews == [(2, "image/jpeg"), (4, "image/jpeg")]
    for o in outs:
        if o.preview:
            assert Image.open(io.BytesIO(o.preview)).size == (64, 64)
    assert outs[-1].media_type == "image/jpeg"
    plain = await _run(
        image_engine,
        "e-plain",
        InputPiece(text="a lake"),
        seed=1,
        num_inference_steps=6,
        output_format="jpeg",
    )
    assert plain[-1].data == outs[-1].data  # previews do not change the image
    assert not any(o.preview for o in plain)


async def test_equal_shapes_share_one_call(batch_engine) -> None:
    prompts = ["a red cube", "a blue lake", "a green tree", "a cat"]

    async def one(i: int, p: str) -> bytes:
        outs = await _run(
            batch_engine, f"b-{i}", InputPiece(text=p), seed=10 + i, num_inference_steps=3
        )
        assert [o.step for o in outs if o.is_progress] == [1, 2, 3]
        return outs[-1].data

    calls = len(batch_engine.batcher.calls)
    together = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    assert list(batch_engine.batcher.calls)[calls:] == [4]
    alone = [await one(i, p) for i, p in enumerate(prompts)]
    for a, b in zip(together, alone, strict=True):
        diff = np.abs(_rgb(a).astype(int) - _rgb(b).astype(int))
        assert diff.max() <= 2  # a batched matmul rounds a little differently
    # Another size does not join a call of this one.
    calls = len(batch_engine.batcher.calls)
    await asyncio.gather(
        one(0, "x"),
        _run(batch_engine, "b-wide", InputPiece(text="y"), num_inference_steps=3, width=96),
    )
    assert sorted(list(batch_engine.batcher.calls)[calls:]) == [1, 1]


async def test_an_aborted_member_stops_the_others_go_on(batch_engine) -> None:
    async def run(rid: str, abort_at: int = 0) -> list[EngineOutput]:
        req = GenerateRequest(rid, "image", StageParams(num_inference_steps=40), seed=1)
        got = []
        async for out in batch_engine.generate(req, _feed(InputPiece(text=rid))):
            got.append(out)
            if abort_at and out.step >= abort_at:
                await batch_engine.abort(rid)
        return got

    calls = len(batch_engine.batcher.calls)
    kept, cut = await asyncio.gather(run("b-keep"), run("b-cut", abort_at=3))
    assert list(batch_engine.batcher.calls)[calls:] == [2]
    assert kept[-1].finish_reason == "stop" and kept[-1].data
    assert not any(o.data for o in cut)
    _, steps, outcome = next(h for h in batch_engine.history if h[0] == "b-cut")
    assert outcome == "aborted" and 3 <= steps <= 5  # within a step of the abort
    assert ("b-keep", 40, "done") in batch_engine.history
