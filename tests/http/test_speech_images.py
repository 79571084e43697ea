"""Speech in every format (whole, raw stream, SSE) and image generation, over
real scripted workers; each response byte-identical to rendering its log."""

from __future__ import annotations

import base64
import io
import json

import av
import numpy as np
import openai
import pytest
import soundfile as sf

from omnix.events.types import Admitted, Chunk, StageParams
from omnix.http.render import render_response

from .conftest import parse_sse

pytestmark = pytest.mark.asyncio(loop_scope="session")

CONTAINERS = {"mp3": "mp3", "opus": "ogg", "aac": "aac", "wav": "wav", "flac": "flac"}
MEDIA = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "wav": "audio/wav",
    "flac": "audio/flac",
    "pcm": "audio/pcm",
}


def audio_samples(server, rid: str) -> np.ndarray:
    blobs = [
        e.blob
        for e in server.omni.log.events_for(rid)
        if isinstance(e, Chunk) and e.modality == "audio"
    ]
    return np.concatenate([server.omni.blobs.get_array(b) for b in blobs])


def decoded_length(fmt: str, data: bytes) -> int:
    if fmt == "pcm":
        return len(np.frombuffer(data, dtype="<i2"))
    if fmt in ("wav", "flac"):
        pcm, rate = sf.read(io.BytesIO(data))
        assert rate == 24000
        return len(pcm)
    with av.open(io.BytesIO(data), format=CONTAINERS[fmt]) as c:
        return sum(f.samples for f in c.decode(audio=0))


def assert_replays(server, rid: str, status: int, body: bytes) -> None:
    again = render_response(server.omni.log.events_for(rid), server.omni.blobs)
    assert (again.head.status, again.body) == (status, body)


@pytest.mark.parametrize("fmt", ["wav", "pcm", "flac", "mp3", "opus", "aac"])
@pytest.mark.parametrize("stream_format", [None, "audio"])
async def test_speech_in_every_format(omni_server, http, fmt, stream_format):
    req = {"input": "hello there", "voice": "nova", "response_format": fmt}
    if stream_format:
        req["stream_format"] = stream_format
    async with http.post(omni_server.url + "/v1/audio/speech", json=req) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"] == MEDIA[fmt]
        rid = r.headers["X-Request-Id"]
        if stream_format:
            assert r.headers.get("Transfer-Encoding") == "chunked"
        data = await r.read()
    n = len(audio_samples(omni_server, rid))
    got = decoded_length(fmt, data)
    if fmt in ("wav", "pcm", "flac"):
        assert got == n  # lossless, sample-exact
    else:
        assert got >= n  # codecs pad to whole frames (opus decodes at 48 kHz)
    if fmt == "pcm":
        expected = (np.clip(audio_samples(omni_server, rid), -1, 1) * 32767).astype("<i2")
        assert np.array_equal(np.frombuffer(data, dtype="<i2"), expected)
    spec = next(e for e in omni_server.omni.log.events_for(rid) if isinstance(e, Admitted)).spec
    assert spec.prompt == "hello there" and spec.outputs == ("audio",)
    assert spec.stage_params["code2wav"] == StageParams(voice="nova")
    assert_replays(omni_server, rid, 200, data)


async def test_speech_sse_events(omni_server, http):
    req = {"input": "hi", "response_format": "pcm", "stream_format": "sse"}
    async with http.post(omni_server.url + "/v1/audio/speech", json=req) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        rid = r.headers["X-Request-Id"]
        raw = await r.read()
    events = [json.loads(f["data"]) for f in parse_sse(raw)]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    # usage comes from the pipeline's source stage (the scripted thinker:
    # one input piece, six outputs)
    assert done["usage"] == {"input_tokens": 1, "output_tokens": 6, "total_tokens": 7}
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert len(pcm) // 2 == len(audio_samples(omni_server, rid))
    assert_replays(omni_server, rid, 200, raw)


async def test_speech_with_the_openai_client(omni_server):
    client = openai.AsyncOpenAI(base_url=omni_server.url + "/v1", api_key="unused", max_retries=0)
    try:
        resp = await client.audio.speech.create(
            model="http-omni", voice="alloy", input="hi", response_format="wav"
        )
        pcm, rate = sf.read(io.BytesIO(resp.content))
        assert rate == 24000 and len(pcm) > 0
        async with client.audio.speech.with_streaming_response.create(
            model="http-omni",
            voice="alloy",
            input="hi",
            response_format="pcm",
            stream_format="audio",
        ) as streamed:
            data = b"".join([piece async for piece in streamed.iter_bytes()])
        assert len(data) == len(pcm) * 2
    finally:
        await client.close()


async def test_images(image_server, http):
    req = {
        "prompt": "a red cube",
        "n": 3,
        "size": "32x48",
        "seed": 11,
        "steps": 4,
        "guidance_scale": 2.5,
    }
    async with http.post(image_server.url + "/v1/images/generations", json=req) as r:
        assert r.status == 200
        header = r.headers["X-Request-Id"]
        raw = await r.read()
    body = json.loads(raw)
    rids = header.split(",")
    assert body["request_ids"] == rids and len(rids) == 3
    # The scripted engine's "image" is opaque bytes; a diffusion stage's PNG
    # passes through the same way.
    assert [base64.b64decode(d["b64_json"]) for d in body["data"]] == [b"scripted-image-0"] * 3
    specs = [
        next(e for e in image_server.omni.log.events_for(rid) if isinstance(e, Admitted)).spec
        for rid in rids
    ]
    assert [s.seed for s in specs] == [11, 12, 13]
    assert specs[0].stage_params["image"] == StageParams(
        num_inference_steps=4, guidance_scale=2.5, width=32, height=48
    )
    events = [e for rid in rids for e in image_server.omni.log.events_for(rid)]
    assert render_response(events, image_server.omni.blobs).body == raw


async def test_images_with_the_openai_client(image_server):
    client = openai.AsyncOpenAI(base_url=image_server.url + "/v1", api_key="unused", max_retries=0)
    try:
        resp = await client.images.generate(
            model="http-image", prompt="x", n=2, response_format="b64_json"
        )
        assert len(resp.data) == 2 and resp.data[0].b64_json
    finally:
        await client.close()
