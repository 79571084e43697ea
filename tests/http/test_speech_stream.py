"""``/v1/audio/speech/stream`` with a raw ``websockets`` client: text in
as a language model writes it, speech out sentence by sentence (vLLM-Omni's
messages), each later sentence an ``input_appended`` piece of the one
running request; bad input answered with an ``error`` message, the socket
left open."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import websockets

from omnix.events.types import Admitted, Cancelled, InputAppended, Routed
from omnix.http.app import HttpServer

from .conftest import _serve

pytestmark = pytest.mark.asyncio(loop_scope="session")

TTS = """
name = "stream-tts"
[[stages]]
name = "talker"
engine = { kind = "scripted", chunks_per_piece = 4, delay_ms = 5, output_modality = "codec" }
[[stages]]
name = "code2wav"
engine = { kind = "scripted", chunks_per_piece = 1, delay_ms = 1, output_modality = "audio" }
[[edges]]
source = "talker"
target = "code2wav"
forward = "chunk"
every = 2
[outputs]
audio = "code2wav"
"""


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def tts_server() -> AsyncIterator[HttpServer]:
    async for s in _serve(TTS):
        yield s


def url(server: HttpServer) -> str:
    return server.url.replace("http", "ws") + "/v1/audio/speech/stream"


def send(ws: Any, type_: str, **fields: Any) -> Any:
    return ws.send(json.dumps({"type": type_, **fields}))


async def read_until(ws: Any, type_: str) -> list[Any]:
    """Messages (text ones decoded) up to the first of ``type_``."""
    out: list[Any] = []
    while True:
        m = await asyncio.wait_for(ws.recv(), 30)
        out.append(json.loads(m) if isinstance(m, str) else m)
        if isinstance(out[-1], dict) and out[-1]["type"] == type_:
            return out


def request_of(server: HttpServer) -> str:
    return list(server.omni.log.state.requests)[-1]


async def test_sentences_are_spoken_as_they_complete(tts_server):
    async with websockets.connect(url(tts_server)) as ws:
        await send(ws, "session.config", voice="default", response_format="pcm")
        await send(ws, "input.text", text="Hello wor")
        await send(ws, "input.text", text="ld. How are")
        # The first sentence is spoken while the rest is still being written.
        first = await read_until(ws, "audio.start")
        await send(ws, "input.text", text=" you? I am")
        await send(ws, "input.text", text=" fine")
        await send(ws, "input.done")
        await send(ws, "session.close")
        rest = await read_until(ws, "session.done")
    messages = first + rest
    texts = [m for m in messages if isinstance(m, dict)]
    starts = [m for m in texts if m["type"] == "audio.start"]
    assert [(m["sentence_index"], m["sentence_text"]) for m in starts] == [
        (0, "Hello world."),
        (1, "How are you?"),
        (2, "I am fine"),
    ]
    assert all(m["format"] == "pcm" and m["sample_rate"] == 24000 for m in starts)
    assert texts[-1] == {"type": "session.done", "total_sentences": 3}
    # Each sentence: start, its audio as binary messages, done with their bytes.
    for i in range(3):
        a = messages.index(starts[i])
        done = next(m for m in messages[a:] if isinstance(m, dict) and m["type"] == "audio.done")
        audio = [m for m in messages[a + 1 : messages.index(done)] if isinstance(m, bytes)]
        assert audio and done["sentence_index"] == i and not done["error"]
        assert done["total_bytes"] == sum(len(b) for b in audio)
    # One request; each later sentence went into it as an input piece.
    rid = request_of(tts_server)
    events = tts_server.omni.log.events_for(rid)
    adm = events[0]
    assert isinstance(adm, Admitted) and adm.spec.input_streams
    assert adm.spec.prompt == "Hello world."
    appended = [e for e in events if isinstance(e, InputAppended)]
    assert [(e.text, e.last) for e in appended] == [
        ("How are you?", False),
        ("I am fine", False),
        ("", True),
    ]
    pieces = [e for e in events if isinstance(e, Routed) and e.stage == "talker"]
    assert [e.sources for e in pieces] == [(adm.pos,)] + [(e.pos,) for e in appended]
    assert [e.last for e in pieces] == [False, False, False, True]


async def test_bad_messages_are_answered_and_the_socket_stays(tts_server):
    async with websockets.connect(url(tts_server)) as ws:
        for bad, code in [
            ("{nope", "invalid_json"),
            (json.dumps({"type": "input.text", "text": "x."}), "config_required"),
            (json.dumps({"type": "session.config", "speed": "fast"}), "invalid_value"),
            (json.dumps({"type": "session.config", "colour": 1}), "unknown_field"),
        ]:
            await ws.send(bad)
            err = json.loads(await ws.recv())
            assert err["type"] == "error" and err["code"] == code, err
        await send(ws, "session.config", response_format="mp3")
        await send(ws, "input.text", text="Hi there. ")
        err = json.loads(await ws.recv())
        assert err["type"] == "error" and err["code"] == "unsupported_value"
        await send(ws, "session.config")
        err = json.loads(await ws.recv())
        assert err["code"] == "invalid_event"  # config comes once
        await send(ws, "what.ever")
        err = json.loads(await ws.recv())
        assert err["code"] == "invalid_event_type"


async def test_a_client_that_goes_cancels_the_speech(tts_server):
    async with websockets.connect(url(tts_server)) as ws:
        await send(ws, "session.config")
        await send(ws, "input.text", text="One sentence. ")
        await read_until(ws, "audio.start")
        rid = request_of(tts_server)
    for _ in range(100):
        rs = tts_server.omni.state(rid)
        if rs is not None and rs.terminal:
            break
        await asyncio.sleep(0.05)
    events = tts_server.omni.log.events_for(rid)
    assert isinstance(events[-1], Cancelled) and events[-1].reason == "disconnect"


async def test_no_text_at_all_is_a_session_with_no_sentence(tts_server):
    async with websockets.connect(url(tts_server)) as ws:
        await send(ws, "session.config")
        await send(ws, "session.close")
        assert json.loads(await ws.recv()) == {"type": "session.done", "total_sentences": 0}
