"""The diffusers engine on the tiny Wan 2.2 video model (loaded without
``accelerate``): an MP4 of 4k+1 frames at the asked size and rate, text to
video and image to video (Wan's image-to-video pipeline over the same
components), seeds reproduce, equal shapes batch, an abort stops it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omnix.engines.diffusers_model import describe_model
from omnix.engines.media_files import mp4_frames, mp4_thumbnail
from omnix.events.types import BlobRef, ChatMessage, MediaPart, StageParams
from omnix.pipelines.config import DiffusersArgs
from omnix.transport.work import EngineOutput, GenerateRequest, InputPiece

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]


async def _feed(*pieces: InputPiece):
    for p in pieces:
        yield p


async def _run(engine, rid: str, piece: InputPiece, seed: int = 0, **params) -> list[EngineOutput]:
    req = GenerateRequest(rid, "video", StageParams(**params), seed=seed)
    return [o async for o in engine.generate(req, _feed(piece))]


async def test_the_model_says_what_it_takes(tiny_models) -> None:
    model = describe_model(DiffusersArgs(model="video", output_modality="video"))
    assert model is not None and model.makes == "video"
    assert (model.pipeline, model.size_multiple, model.frame_step) == ("WanPipeline", 32, 4)
    assert (model.max_frames, model.max_side) == (125, 1024)
    assert model.image_to_video == "WanImageToVideoPipeline"


#: a text-to-video request and its parameters: 9 frames of 64x32 at 8 fps
CAT = InputPiece(text="a cat walks")
CAT_PARAMS = dict(num_inference_steps=3, num_frames=9, fps=8, width=64, height=32)


async def test_text_to_video_is_an_mp4_of_the_asked_frames(video_engine) -> None:
    outs = await _run(video_engine, "v-t2v", CAT, seed=3, **CAT_PARAMS)
    assert [(o.step, o.total) for o in outs if o.is_progress] == [(1, 3), (2, 3), (3, 3)]
    last = outs[-1]
    assert (last.modality, last.media_type, last.finish_reason) == ("video", "video/mp4", "stop")
    frames = mp4_frames(last.data)
    assert frames.shape == (9, 32, 64, 3)
    import io

    import av

    with av.open(io.BytesIO(last.data)) as c:
        stream = c.streams.video[0]
        assert stream.average_rate == 8 and stream.codec_context.name == "h264"
    assert mp4_thumbnail(last.data)[:8] == b"\x89PNG\r\n\x1a\n"
    again = await _run(video_engine, "v-t2v-2", CAT, seed=3, **CAT_PARAMS)
    assert again[-1].data == last.data
    with pytest.raises(ValueError, match="4k \\+ 1"):
        await _run(video_engine, "v-bad", InputPiece(text="x"), num_frames=8)


async def test_image_to_video_starts_from_the_image(video_engine) -> None:
    first = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    piece = InputPiece(
        messages=(
            ChatMessage(
                "user", "it moves", media=(MediaPart(kind="image", blob=BlobRef("0" * 32, 0)),)
            ),
        ),
        media=(first,),
    )
    outs = await _run(video_engine, "v-i2v", piece, seed=1, num_inference_steps=2, num_frames=5)
    assert mp4_frames(outs[-1].data).shape == (5, 32, 32, 3)
    assert type(video_engine._siblings["image_to_video"]).__name__ == "WanImageToVideoPipeline"
    plain = await _run(
        video_engine,
        "v-t2v-3",
        InputPiece(text="it moves"),
        seed=1,
        num_inference_steps=2,
        num_frames=5,
    )
    assert plain[-1].data != outs[-1].data


async def test_equal_videos_share_a_call_and_an_abort_stops_one(video_engine) -> None:
    calls = len(video_engine.batcher.calls)

    async def run(rid: str, abort_at: int = 0) -> list[EngineOutput]:
        req = GenerateRequest(rid, "video", StageParams(num_inference_steps=30, num_frames=5))
        got = []
        async for out in video_engine.generate(req, _feed(InputPiece(text=rid))):
            got.append(out)
            if abort_at and out.step >= abort_at:
                await video_engine.abort(rid)
        return got

    kept, cut = await asyncio.gather(run("v-keep"), run("v-cut", abort_at=2))
    assert list(video_engine.batcher.calls)[calls:] == [2]
    assert kept[-1].media_type == "video/mp4" and not any(o.data for o in cut)
    _, steps, outcome = next(h for h in video_engine.history if h[0] == "v-cut")
    assert outcome == "aborted" and 2 <= steps <= 4
