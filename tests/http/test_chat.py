"""Chat completions over real scripted workers: whole and streamed, text and
audio, batches, per-stage parameters, the official ``openai`` client, and
every response byte-identical to ``render_response`` over the log."""

from __future__ import annotations

import base64
import io
import json

import av
import msgspec
import numpy as np
import openai
import pytest
import soundfile as sf

from omnix.events.types import Admitted, Chunk, StageParams
from omnix.http.render import render_response

from .conftest import parse_sse

pytestmark = pytest.mark.asyncio(loop_scope="session")

USER = [{"role": "user", "content": "hi"}]
THINKER_TEXT = "t0 t1 t2 t3 t4 t5 "  # the scripted thinker's six chunks
CONTAINERS = {"wav": "wav", "mp3": "mp3", "flac": "flac", "opus": "ogg", "aac": "aac"}


def admitted(server, rid: str) -> Admitted:
    return next(e for e in server.omni.log.events_for(rid) if isinstance(e, Admitted))


def assert_replays(server, rid_header: str, status: int, body: bytes) -> None:
    """The client's bytes are what rendering the log gives."""
    events = [e for rid in rid_header.split(",") for e in server.omni.log.events_for(rid)]
    again = render_response(events, server.omni.blobs)
    assert again.head.status == status
    assert again.body == body


async def test_whole_chat_completion(omni_server, http):
    async with http.post(
        omni_server.url + "/v1/chat/completions", json={"model": "http-omni", "messages": USER}
    ) as r:
        assert r.status == 200
        rid = r.headers["X-Request-Id"]
        raw = await r.read()
    body = json.loads(raw)
    ev = admitted(omni_server, rid)
    assert body["id"] == f"chatcmpl-{rid}"
    assert body["object"] == "chat.completion"
    assert body["created"] == ev.ts_ns // 10**9
    assert body["model"] == "http-omni"
    assert body["request_ids"] == [rid]
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": THINKER_TEXT},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ]
    assert body["usage"] == {"prompt_tokens": 1, "completion_tokens": 6, "total_tokens": 7}
    # The server chose a seed and the log recorded it with the options.
    assert ev.spec.api == "chat.completions" and ev.spec.outputs == ("text",)
    assert ev.spec.response is not None and ev.spec.response.stream is False
    assert omni_server.omni.state(rid).status == "finished"
    assert_replays(omni_server, rid, 200, raw)


async def test_parameters_reach_the_stages_and_the_seed_is_recorded(omni_server, http):
    req = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ],
        "temperature": 0.5,
        "top_p": 0.9,
        "max_completion_tokens": 4,
        "stop": "END",
        "seed": 1234,
        "modalities": ["text", "audio"],
        "audio": {"format": "wav", "voice": "alloy"},
        "sampling_params_list": [{"temperature": 0.1}, None, {"temperature": 0.7}],
    }
    async with http.post(omni_server.url + "/v1/chat/completions", json=req) as r:
        assert r.status == 200, await r.text()
        rid = r.headers["X-Request-Id"]
        body = await r.json()
    spec = admitted(omni_server, rid).spec
    assert spec.seed == 1234
    assert [(m.role, m.content) for m in spec.messages] == [
        ("system", "be brief"),
        ("user", "a\nb"),
    ]
    # sampling_params_list is the more specific: it wins over temperature.
    assert spec.stage_params["thinker"] == StageParams(
        temperature=0.1, top_p=0.9, max_tokens=4, stop=("END",)
    )
    assert spec.stage_params["talker"] == StageParams(voice="alloy")
    assert spec.stage_params["code2wav"] == StageParams(voice="alloy", temperature=0.7)
    # max_tokens=4 stops the scripted thinker after four chunks.
    assert body["choices"][0]["message"]["content"] == "t0 t1 t2 t3 "
    assert body["choices"][0]["finish_reason"] == "length"


async def test_a_speed_no_stage_honours_is_400_on_chat_too(omni_server, http):
    """As on /v1/audio/speech: a speed in sampling_params_list would be
    recorded and ignored, so it is refused, naming the stage."""
    before = len(omni_server.omni.log)
    req = {
        "messages": [{"role": "user", "content": "hi"}],
        "modalities": ["text", "audio"],
        "sampling_params_list": {"code2wav": {"speed": 1.5}},
    }
    async with http.post(omni_server.url + "/v1/chat/completions", json=req) as r:
        assert r.status == 400, await r.text()
        err = (await r.json())["error"]
    assert (err["param"], err["code"]) == ("speed", "unsupported_parameter")
    assert "'code2wav' (scripted)" in err["message"]
    assert len(omni_server.omni.log) == before


async def test_sampling_params_by_stage_name(omni_server, http):
    req = {"messages": USER, "sampling_params_list": {"thinker": {"max_tokens": 2}}}
    async with http.post(omni_server.url + "/v1/chat/completions", json=req) as r:
        body = await r.json()
    assert body["choices"][0]["message"]["content"] == "t0 t1 "


async def test_seed_is_chosen_when_the_client_gives_none(omni_server, http):
    seeds = set()
    for _ in range(3):
        async with http.post(
            omni_server.url + "/v1/chat/completions", json={"messages": USER}
        ) as r:
            seeds.add(admitted(omni_server, r.headers["X-Request-Id"]).spec.seed)
    assert len(seeds) == 3


async def test_text_and_audio_whole(omni_server, http):
    req = {
        "messages": USER,
        "modalities": ["text", "audio"],
        "audio": {"format": "wav", "voice": "x"},
    }
    async with http.post(omni_server.url + "/v1/chat/completions", json=req) as r:
        assert r.status == 200
        rid = r.headers["X-Request-Id"]
        raw = await r.read()
    msg = json.loads(raw)["choices"][0]["message"]
    assert msg["content"] == THINKER_TEXT
    audio = msg["audio"]
    assert audio["id"] == f"audio-{rid}"
    assert audio["transcript"] == THINKER_TEXT
    assert audio["expires_at"] > json.loads(raw)["created"]
    pcm, rate = sf.read(io.BytesIO(base64.b64decode(audio["data"])), dtype="float32")
    chunks = [
        e
        for e in omni_server.omni.log.events_for(rid)
        if isinstance(e, Chunk) and e.modality == "audio"
    ]
    assert rate == 24000 and len(pcm) == sum(c.blob.shape[0] for c in chunks) > 0
    assert_replays(omni_server, rid, 200, raw)


async def test_streamed_text(omni_server, http):
    req = {"messages": USER, "stream": True}
    async with http.post(omni_server.url + "/v1/chat/completions", json=req) as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "text/event-stream"
        rid = r.headers["X-Request-Id"]
        raw = await r.read()
    frames = parse_sse(raw)
    assert frames[-1] == {"data": "[DONE]"}
    chunks = [json.loads(f["data"]) for f in frames[:-1]]
    assert all(
        c["id"] == f"chatcmpl-{rid}" and c["object"] == "chat.completion.chunk" for c in chunks
    )
    assert all("usage" not in c for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == THINKER_TEXT
    assert chunks[-1]["choices"][0] == {
        "index": 0,
        "delta": {},
        "finish_reason": "stop",
        "logprobs": None,
    }
    assert_replays(omni_server, rid, 200, raw)


async def test_streamed_usage_and_audio(omni_server, http):
    req = {
        "messages": USER,
        "stream": True,
        "stream_options": {"include_usage": True},
        "modalities": ["text", "audio"],
        "audio": {"format": "pcm16", "voice": "x"},
    }
    async with http.post(omni_server.url + "/v1/chat/completions", json=req) as r:
        rid = r.headers["X-Request-Id"]
        raw = await r.read()
    chunks = [json.loads(f["data"]) for f in parse_sse(raw)[:-1]]
    assert all("usage" in c for c in chunks)
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 1, "completion_tokens": 6, "total_tokens": 7}
    assert all(c["usage"] is None for c in chunks[:-1])
    audio = [
        c["choices"][0]["delta"]["audio"]
        for c in chunks[:-1]
        if "audio" in c["choices"][0]["delta"]
    ]
    assert len(audio) >= 2 and all(a["id"] == f"audio-{rid}" for a in audio)
    pcm = np.frombuffer(b"".join(base64.b64decode(a["data"]) for a in audio), dtype="<i2")
    blobs = [
        e.blob
        for e in omni_server.omni.log.events_for(rid)
        if isinstance(e, Chunk) and e.modality == "audio"
    ]
    expected = np.concatenate([omni_server.omni.blobs.get_array(b) for b in blobs])
    assert np.array_equal(pcm, (np.clip(expected, -1, 1) * 32767).astype("<i2"))
    assert audio[-1]["transcript"] == THINKER_TEXT
    assert_replays(omni_server, rid, 200, raw)


@pytest.mark.parametrize("fmt", ["wav", "mp3", "flac", "opus", "aac"])
async def test_streamed_audio_in_every_format_decodes(omni_server, http, fmt):
    req = {
        "messages": USER,
        "stream": True,
        "modalities": ["text", "audio"],
        "audio": {"format": fmt},
    }
    async with http.post(omni_server.url + "/v1/chat/completions", json=req) as r:
        rid = r.headers["X-Request-Id"]
        raw = await r.read()
    chunks = [json.loads(f["data"]) for f in parse_sse(raw)[:-1]]
    data = b"".join(
        base64.b64decode(c["choices"][0]["delta"]["audio"]["data"])
        for c in chunks
        if "audio" in c["choices"][0]["delta"]
    )
    # The container named: FFmpeg's probe cannot tell the scripted engine's
    # constant-valued audio from noise.
    with av.open(io.BytesIO(data), format=CONTAINERS[fmt]) as container:
        samples = sum(f.samples for f in container.decode(audio=0))
    assert samples > 0
    assert_replays(omni_server, rid, 200, raw)


async def test_batched_conversations_get_one_choice_each(omni_server, http):
    convs = [USER, [{"role": "user", "content": "second"}], [{"role": "user", "content": "third"}]]
    async with http.post(
        omni_server.url + "/v1/chat/completions", json={"messages": convs, "seed": 7}
    ) as r:
        assert r.status == 200
        header = r.headers["X-Request-Id"]
        raw = await r.read()
    body = json.loads(raw)
    rids = header.split(",")
    assert body["request_ids"] == rids and len(rids) == 3
    group = rids[0].rsplit("-", 1)[0]
    assert body["id"] == f"chatcmpl-{group}"
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] == THINKER_TEXT for c in body["choices"])
    assert body["usage"]["completion_tokens"] == 18
    specs = [admitted(omni_server, rid).spec for rid in rids]
    assert [s.seed for s in specs] == [7, 8, 9]
    assert [s.messages[-1].content for s in specs] == ["hi", "second", "third"]
    assert_replays(omni_server, header, 200, raw)


async def test_openai_client_whole_and_streamed(omni_server):
    client = openai.AsyncOpenAI(base_url=omni_server.url + "/v1", api_key="unused", max_retries=0)
    try:
        resp = await client.chat.completions.create(model="http-omni", messages=USER, seed=3)
        assert resp.choices[0].message.content == THINKER_TEXT
        assert resp.usage is not None and resp.usage.completion_tokens == 6
        stream = await client.chat.completions.create(
            model="http-omni", messages=USER, stream=True, stream_options={"include_usage": True}
        )
        text, usage = [], None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        assert "".join(text) == THINKER_TEXT
        assert usage is not None and usage.total_tokens == 7
        resp = await client.chat.completions.create(
            model="http-omni",
            messages=USER,
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "flac"},
        )
        audio = resp.choices[0].message.audio
        assert audio is not None and audio.transcript == THINKER_TEXT
        pcm, rate = sf.read(io.BytesIO(base64.b64decode(audio.data)))
        assert rate == 24000 and len(pcm) > 0
        models = await client.models.list()
        assert [m.id for m in models.data] == ["http-omni"]
    finally:
        await client.close()


async def test_request_state_and_events_are_reachable_from_the_response(omni_server, http):
    async with http.post(omni_server.url + "/v1/chat/completions", json={"messages": USER}) as r:
        rid = r.headers["X-Request-Id"]
    async with http.get(f"{omni_server.url}/v1/requests/{rid}") as r:
        state = await r.json()
    assert state["request_id"] == rid and state["status"] == "finished"
    assert [s["name"] for s in state["stages"]] == ["thinker"]
    async with http.get(f"{omni_server.url}/v1/requests/{rid}/events") as r:
        frames = parse_sse(await r.read())
    from omnix.events.types import Event

    events = [msgspec.json.decode(f["data"], type=Event) for f in frames]
    assert events == omni_server.omni.log.events_for(rid)
