"""``/v1/videos`` on ``tiny-video`` (a real diffusers Wan 2.2 pipeline)
through the official ``openai`` client: a job created and polled to its
end (``create_and_poll`` unchanged), its MP4 decoded with PyAV (frames,
size), the thumbnail, the list, the shape mapped onto what the model takes
and reported, image to video from an ``input_reference``, progress that
moves with the denoising steps, delete (cancelling a job in flight), bad
forms refused before admission, and a job's answer replayed from the log."""

from __future__ import annotations

import asyncio
import io
import warnings

import aiohttp
import numpy as np
import openai
import pytest
from PIL import Image

from omnix.engines.media_files import mp4_frames
from omnix.events.types import Admitted, Progress, Released
from omnix.http.render import render_response

from .conftest import real_engine_marks

PIPELINE = "tiny-video"
pytestmark = [
    *real_engine_marks(),
    # every method of openai's videos client is deprecated (the Sora API's end)
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def _client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300
    )


def _png(w: int, h: int, seed: int = 0) -> bytes:
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


async def test_create_and_poll_then_download_the_mp4(server):
    client = _client(server)
    try:
        raw = await client.videos.with_raw_response.create(
            model="tiny-video", prompt="a cat walks", seconds="4", size="64x32",
            extra_body={"fps": 4, "num_inference_steps": 3, "seed": 7},
        )  # fmt: skip
        assert raw.headers["openai-poll-after-ms"] == "250"
        job = raw.parse()
        assert job.status == "queued" and job.progress == 0
        # 4 s at 4 fps: 16 frames, mapped onto 4k + 1 frames
        assert (job.seconds, job.size) == ("4.25", "64x32")
        extra = job.model_extra or {}
        assert (extra["num_frames"], extra["fps"], extra["asked"]) == (17, 4, "seconds=4")
        done = await client.videos.poll(job.id)
        assert done.status == "completed" and done.progress == 100 and done.completed_at
        got = await client.videos.download_content(job.id)
        frames = mp4_frames(got.content)
        assert frames.shape == (17, 32, 64, 3)
        thumb = await client.videos.download_content(job.id, variant="thumbnail")
        assert Image.open(io.BytesIO(thumb.content)).size == (64, 32)
        listed = await client.videos.list()
        assert job.id in [v.id for v in listed.data]
        # POST's answer is a function of the log: a replay renders its bytes
        events = server.omni.log.events_for(job.id)
        assert render_response(events, server.omni.blobs).body == raw.content
        steps = [(e.step, e.total) for e in events if isinstance(e, Progress)]
        assert steps == [(1, 3), (2, 3), (3, 3)]
        polled = await client.videos.create_and_poll(
            prompt="a dog", extra_body={"num_inference_steps": 2}
        )
        assert polled.status == "completed" and polled.size == "32x32"
        assert polled.seconds == "1.062"  # 17 frames at 16 fps, the stage's defaults
    finally:
        await client.close()


async def test_image_to_video_from_an_input_reference(server):
    client = _client(server)
    try:
        job = await client.videos.create_and_poll(
            prompt="it moves",
            input_reference=("first.png", _png(32, 32, seed=2), "image/png"),
            extra_body={"num_inference_steps": 2, "num_frames": 5},
        )
        assert job.status == "completed"
        (adm,) = [e for e in server.omni.log.events_for(job.id) if isinstance(e, Admitted)]
        (part,) = adm.spec.messages[0].media
        assert part.kind == "image" and part.blob.shape == (32, 32, 3)
        got = await client.videos.download_content(job.id)
        assert mp4_frames(got.content).shape == (5, 32, 32, 3)
    finally:
        await client.close()


async def test_progress_moves_and_delete_cancels_a_job_in_flight(server):
    client = _client(server)
    try:
        job = await client.videos.create(
            prompt="a long one", extra_body={"num_inference_steps": 400}
        )
        seen = set()
        async with asyncio.timeout(120):
            while True:
                now = await client.videos.retrieve(job.id)
                seen.add((now.status, now.progress))
                if now.status == "in_progress" and now.progress >= 2:
                    break
                await asyncio.sleep(0.05)
        assert ("queued", 0) in seen or any(s == "in_progress" for s, _ in seen)
        gone = await client.videos.delete(job.id)
        assert gone.deleted and gone.id == job.id
        with pytest.raises(openai.NotFoundError):
            await client.videos.retrieve(job.id)
        assert server.omni.request_status(job.id) == "released"
        rel = [
            e
            for e in server.omni.log.read(0)
            if isinstance(e, Released) and job.id in e.request_ids
        ]
        assert [e.reason for e in rel] == ["deleted"]
    finally:
        await client.close()


async def _post(server, http, **fields: str) -> tuple[int, dict]:
    form = aiohttp.FormData(default_to_multipart=True)
    for k, v in fields.items():
        form.add_field(k, v)
    async with http.post(server.url + "/v1/videos", data=form) as r:
        return r.status, await r.json()


BAD = [
    ("too big", {"size": "4096x4096"}, "size", "multiples of 32 from 32 to 1024"),
    ("too long", {"num_frames": "400"}, "num_frames", "at most 125 frames"),
    ("size and width", {"size": "64x64", "width": "32"}, "size", "disagree"),
    ("seconds", {"seconds": "-1"}, "seconds", "form field"),
    ("unknown", {"voice": "x"}, "voice", "Unknown form field"),
    ("true cfg", {"true_cfg_scale": "2"}, "true_cfg_scale", "no true classifier-free"),
    ("model", {"model": "sora-2"}, "model", "sora-2"),
]


@pytest.mark.parametrize(("name", "fields", "param", "says"), BAD, ids=[b[0] for b in BAD])
async def test_a_bad_job_is_refused_before_admission(server, http, name, fields, param, says):
    before = len(server.omni.log)
    status, body = await _post(server, http, prompt="x", **fields)
    assert status in (400, 404), body
    err = body["error"]
    assert err["param"] == param and says in err["message"], err
    assert len(server.omni.log) == before


async def test_a_job_is_not_content_until_completed(server, http):
    _, body = await _post(server, http, prompt="x", num_inference_steps="300")
    vid = body["id"]
    async with http.get(f"{server.url}/v1/videos/{vid}/content") as r:
        assert r.status == 409 and (await r.json())["error"]["code"] == "video_not_ready"
    async with http.get(f"{server.url}/v1/videos/{vid}/content?variant=spritesheet") as r:
        assert r.status == 400
    async with http.delete(f"{server.url}/v1/videos/{vid}") as r:
        assert r.status == 200
    async with http.get(f"{server.url}/v1/videos/nope") as r:
        assert r.status == 404 and (await r.json())["error"]["code"] == "video_not_found"


async def test_openai_videos_client_warns_deprecation():
    # The filter above is about this warning, not a blanket one.
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="x").videos.create  # noqa: B018
    assert not got or all(issubclass(w.category, DeprecationWarning) for w in got)
