"""Speech on ``tiny-tts`` (vLLM talker -> torch codec decoder) in every
response format, whole and streamed, decoded with soundfile, PyAV and numpy."""

from __future__ import annotations

import base64
import io
import json

import av
import numpy as np
import openai
import pytest
import soundfile as sf

from .conftest import parse_sse, real_engine_marks

PIPELINE = "tiny-tts"
pytestmark = real_engine_marks()

CONTAINERS = {"mp3": "mp3", "opus": "ogg", "aac": "aac"}


def seconds(fmt: str, data: bytes) -> float:
    if fmt == "pcm":
        return len(np.frombuffer(data, dtype="<i2")) / 24000
    if fmt in ("wav", "flac"):
        pcm, rate = sf.read(io.BytesIO(data))
        assert rate == 24000 and np.isfinite(pcm).all()
        return len(pcm) / rate
    with av.open(io.BytesIO(data), format=CONTAINERS[fmt]) as c:
        stream = c.streams.audio[0]
        samples = sum(f.samples for f in c.decode(audio=0))
        return samples / stream.rate


GREEDY = {"seed": 3, "sampling_params_list": {"talker": {"temperature": 0.0}}}


async def test_speech_in_every_format(server):
    client = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120
    )
    lengths = {}
    try:
        for fmt in ("wav", "pcm", "flac", "mp3", "opus", "aac"):
            resp = await client.audio.speech.create(
                model="tiny-tts",
                voice="alloy",
                input="Hello there.",
                response_format=fmt,
                extra_body=GREEDY,
            )
            lengths[fmt] = seconds(fmt, resp.content)
    finally:
        await client.close()
    # Greedy and seeded: every format encodes the same audio (lossy codecs
    # pad to whole frames).
    assert lengths["wav"] > 0.05
    for fmt, s in lengths.items():
        assert abs(s - lengths["wav"]) < 0.2, (fmt, lengths)


@pytest.mark.parametrize("fmt", ["pcm", "wav", "mp3", "opus"])
async def test_speech_streamed_as_audio(server, http, fmt):
    # Seeded and greedy, as above: a random-weight talker may otherwise emit
    # its end-of-audio code within a few frames.
    req = {"input": "Hello there.", "response_format": fmt, "stream_format": "audio", **GREEDY}
    async with http.post(server.url + "/v1/audio/speech", json=req) as r:
        assert r.status == 200
        data = await r.read()
    assert seconds(fmt, data) > 0.05


async def test_speech_streamed_as_sse(server, http):
    req = {"input": "Hello there.", "response_format": "pcm", "stream_format": "sse", **GREEDY}
    async with http.post(server.url + "/v1/audio/speech", json=req) as r:
        events = [json.loads(f["data"]) for f in parse_sse(await r.read())]
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] > 0
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert len(pcm) // 2 > 1200


# -- issue #18: stream, speed, instructions -------------------------------------------------

from omnix.http.render import render_response  # noqa: E402


async def test_speech_stream_true_with_the_openai_client(server):
    client = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120
    )
    try:
        async with client.audio.speech.with_streaming_response.create(
            model="tiny-tts",
            voice="alloy",
            input="Hello there.",
            response_format="pcm",
            extra_body={"stream": True, **GREEDY},
        ) as streamed:
            assert streamed.headers["content-type"] == "text/event-stream"
            rid = streamed.headers["x-request-id"]
            raw = b"".join([piece async for piece in streamed.iter_bytes()])
        whole = await client.audio.speech.create(
            model="tiny-tts",
            voice="alloy",
            input="Hello there.",
            response_format="pcm",
            extra_body=GREEDY,
        )
    finally:
        await client.close()
    events = [json.loads(f["data"]) for f in parse_sse(raw)]
    assert events[-1]["type"] == "speech.audio.done"
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert len(pcm) // 2 > 1200 and pcm == whole.content  # seeded and greedy: the same audio
    again = render_response(server.omni.log.events_for(rid), server.omni.blobs)
    assert again.body == raw


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"speed": 1.5}, "speed"), ({"instructions": "speak softly"}, "instructions")],
)
async def test_speech_parameters_no_stage_honours(server, http, extra, param):
    before = len(server.omni.log)
    async with http.post(server.url + "/v1/audio/speech", json={"input": "hi", **extra}) as r:
        assert r.status == 400
        err = (await r.json())["error"]
    assert err["param"] == param and err["code"] == "unsupported_parameter"
    assert "'talker' (vllm)" in err["message"] and "'code2wav' (codec)" in err["message"]
    assert len(server.omni.log) == before
