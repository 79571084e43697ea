"""The diffusers engine on the tiny Flux pipeline: a decodable 64x64 PNG,
progress per step, seeds reproduce, abort stops before the next step."""

from __future__ import annotations

import asyncio
import io

import pytest
from PIL import Image

from omnix.events.types import ChatMessage, StageParams
from omnix.transport.work import EngineOutput, GenerateRequest, InputPiece

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]


async def _feed(*pieces: InputPiece):
    for p in pieces:
        yield p


async def _run(
    engine, rid: str, *pieces: InputPiece, seed: int = 0, **params
) -> list[EngineOutput]:
    req = GenerateRequest(rid, "image", StageParams(**params), seed=seed)
    return [o async for o in engine.generate(req, _feed(*pieces))]


async def test_png_and_progress(image_engine) -> None:
    outs = await _run(
        image_engine, "i-png", InputPiece(text="a red circle"), seed=1, num_inference_steps=5
    )
    progress = [o for o in outs if o.is_progress]
    assert [(o.step, o.total) for o in progress] == [(i, 5) for i in range(1, 6)]
    assert outs[-1] is not progress[-1]
    img = outs[-1]
    assert (img.modality, img.media_type, img.finish_reason) == ("image", "image/png", "stop")
    assert img.data[:8] == b"\x89PNG\r\n\x1a\n"
    pil = Image.open(io.BytesIO(img.data))
    pil.load()
    assert pil.size == (64, 64) and pil.mode == "RGB"
    assert len(outs) == 6


async def test_seed_size_and_prompt(image_engine) -> None:
    a = await _run(
        image_engine, "i-a", InputPiece(text="a blue lake"), seed=3, num_inference_steps=2
    )
    b = await _run(
        image_engine,
        "i-b",
        InputPiece(text="a blue ", modality="text"),
        InputPiece(text="lake"),
        seed=3,
        num_inference_steps=2,
    )
    c = await _run(
        image_engine, "i-c", InputPiece(text="a blue lake"), seed=4, num_inference_steps=2
    )
    d = await _run(
        image_engine, "i-d", InputPiece(text="a green forest"), seed=3, num_inference_steps=2
    )
    # Streamed text pieces join into one prompt; same seed, same bytes.
    assert a[-1].data == b[-1].data
    assert a[-1].data != c[-1].data  # the seed matters
    assert a[-1].data != d[-1].data  # so does the prompt (text-conditioned)
    # StageParams.seed wins over the request's; width/height apply.
    req = GenerateRequest("i-e", "image", StageParams(seed=3, num_inference_steps=2), seed=99)
    e = [o async for o in image_engine.generate(req, _feed(InputPiece(text="a blue lake")))]
    assert e[-1].data == a[-1].data
    wide = await _run(
        image_engine,
        "i-wide",
        InputPiece(messages=(ChatMessage("user", "a wide view"),)),
        num_inference_steps=1,
        width=96,
        height=64,
    )
    assert Image.open(io.BytesIO(wide[-1].data)).size == (96, 64)


class _StepCounter:
    """Stands in for the engine's pipeline and counts, from the pipeline
    thread, the steps it has finished: the event loop that reads progress
    may lag that thread by several steps on a loaded machine."""

    def __init__(self, pipe) -> None:
        self.pipe = pipe
        self.finished = 0

    def __getattr__(self, name):
        return getattr(self.pipe, name)

    def __call__(self, **kwargs):
        on_step_end = kwargs["callback_on_step_end"]

        def counted(pipe, i, t, tensors):
            self.finished = i + 1
            return on_step_end(pipe, i, t, tensors)

        return self.pipe(**{**kwargs, "callback_on_step_end": counted})


async def test_abort_stops_before_the_next_step(image_engine) -> None:
    req = GenerateRequest("i-abort", "image", StageParams(num_inference_steps=500), seed=1)
    counter = image_engine.pipe = _StepCounter(image_engine.pipe)
    seen, after, finished_at_abort = 0, 0, -1
    try:
        async for out in image_engine.generate(req, _feed(InputPiece(text="a long render"))):
            if seen >= 2:
                after += 1
                continue
            seen = out.step
            if seen >= 2:
                finished_at_abort = counter.finished
                await image_engine.abort("i-abort")
        assert after == 0  # nothing is yielded after abort
        # The pipeline thread stops at the end of the step in flight.
        async with asyncio.timeout(10):
            while not any(rid == "i-abort" for rid, _, _ in image_engine.history):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    finally:
        image_engine.pipe = counter.pipe
    _, steps, outcome = next(h for h in image_engine.history if h[0] == "i-abort")
    assert outcome == "aborted" and finished_at_abort <= steps <= finished_at_abort + 1
    # The engine serves the next request normally.
    outs = await _run(image_engine, "i-after", InputPiece(text="ok"), num_inference_steps=1)
    assert outs[-1].media_type == "image/png"
