"""``/v1/audio/speech/stream`` with a raw ``websockets`` client: text in
as a language model writes it, speech out sentence by sentence (vLLM-Omni's
messages), each later sentence an ``input_appended`` piece of the
utterance's running request; ``input.done`` ends an utterance with
``session.done`` and the connection stays for the next, as a client
written for vLLM-Omni drives it; bad input answered with an ``error``
message, the socket left open; the WebSocket admission the route shares
with ``/v1/realtime``."""

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
        try:
            m = await asyncio.wait_for(ws.recv(), 30)
        except TimeoutError:
            said = [m for m in out if isinstance(m, dict)]
            raise AssertionError(f"no {type_} in 30 s; the text messages were {said}") from None
        out.append(json.loads(m) if isinstance(m, str) else m)
        if isinstance(out[-1], dict) and out[-1]["type"] == type_:
            return out


def request_of(server: HttpServer) -> str:
    return list(server.omni.log.state.requests)[-1]


def check_sentences(messages: list[Any], utterance: int, texts: list[str]) -> None:
    """One utterance's messages: per sentence its start, its audio as binary
    messages and its done with their bytes; then its session.done."""
    said = [m for m in messages if isinstance(m, dict)]
    starts = [m for m in said if m["type"] == "audio.start"]
    assert [(m["utterance_index"], m["sentence_index"], m["sentence_text"]) for m in starts] == [
        (utterance, i, t) for i, t in enumerate(texts)
    ]
    assert all(
        m["format"] == "pcm" and m["sample_rate"] == 24000 and m["channels"] == 1 for m in starts
    )
    assert said[-1] == {
        "type": "session.done",
        "utterance_index": utterance,
        "total_sentences": len(texts),
    }
    for i in range(len(texts)):
        a = messages.index(starts[i])
        done = next(m for m in messages[a:] if isinstance(m, dict) and m["type"] == "audio.done")
        audio = [m for m in messages[a + 1 : messages.index(done)] if isinstance(m, bytes)]
        assert audio and not done["error"]
        assert (done["utterance_index"], done["sentence_index"]) == (utterance, i)
        assert done["total_bytes"] == sum(len(b) for b in audio)


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
    check_sentences(first + rest, 0, ["Hello world.", "How are you?", "I am fine"])
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


async def test_a_vllm_omni_client_speaks_two_utterances_on_one_connection(tts_server):
    # Exactly what a client written for vLLM-Omni sends: a config, an
    # utterance ended by input.done (answered by session.done, the socket
    # kept), another config between utterances, a second utterance, then
    # session.close, which closes the socket.
    async with websockets.connect(url(tts_server)) as ws:
        await send(ws, "session.config", voice="default", response_format="pcm", stream_audio=True)
        await send(ws, "input.text", text="Hello there. How")
        await send(ws, "input.text", text=" are you?")
        await send(ws, "input.done")
        first = await read_until(ws, "session.done")
        await send(ws, "session.config", voice="default", response_format="pcm", seed=7)
        await send(ws, "input.text", text="Fine, thanks")
        await send(ws, "input.done")
        second = await read_until(ws, "session.done")
        await send(ws, "session.close")
        with pytest.raises(websockets.ConnectionClosedOK):
            await asyncio.wait_for(ws.recv(), 30)
    check_sentences(first, 0, ["Hello there.", "How are you?"])
    check_sentences(second, 1, ["Fine, thanks"])
    # One request per utterance, the second under its own config.
    rids = [r for r in tts_server.omni.log.state.requests][-2:]
    adm = [tts_server.omni.log.events_for(r)[0] for r in rids]
    assert all(isinstance(a, Admitted) and a.spec.input_streams for a in adm)
    assert [a.spec.prompt for a in adm] == ["Hello there.", "Fine, thanks"]  # type: ignore[union-attr]
    assert adm[1].spec.seed == 7  # type: ignore[union-attr]
    for rid in rids:
        assert tts_server.omni.state(rid).status == "finished"  # type: ignore[union-attr]


async def test_an_utterance_may_be_sent_before_the_last_one_is_heard(tts_server):
    # Both utterances are written at once; their messages still come in order.
    async with websockets.connect(url(tts_server)) as ws:
        await send(ws, "session.config")
        for text in ("One. Two.", "Three."):
            await send(ws, "input.text", text=text)
            await send(ws, "input.done")
        first = await read_until(ws, "session.done")
        second = await read_until(ws, "session.done")
        await send(ws, "session.close")
    check_sentences(first, 0, ["One.", "Two."])
    check_sentences(second, 1, ["Three."])


async def test_bad_messages_are_answered_and_the_socket_stays(tts_server):
    async with websockets.connect(url(tts_server)) as ws:
        for bad, code in [
            ("{nope", "invalid_json"),
            (json.dumps({"type": "input.text", "text": "x."}), "config_required"),
            (json.dumps({"type": "session.config", "speed": "fast"}), "invalid_value"),
            (json.dumps({"type": "session.config", "colour": 1}), "unknown_field"),
            (json.dumps({"type": "session.config", "response_format": "mp3"}), "unsupported_value"),
            (
                json.dumps({"type": "session.config", "split_granularity": "clause"}),
                "unsupported_value",
            ),
        ]:
            await ws.send(bad)
            err = json.loads(await ws.recv())
            assert err["type"] == "error" and err["code"] == code, err
        await send(ws, "session.config")
        await send(ws, "input.text", text="Hi there")
        await send(ws, "session.config", voice="default")
        err = json.loads(await ws.recv())
        assert err["code"] == "utterance_in_progress"  # a config waits for input.done
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


async def test_no_text_at_all_is_an_utterance_with_no_sentence(tts_server):
    async with websockets.connect(url(tts_server)) as ws:
        await send(ws, "session.config")
        await send(ws, "input.done")
        done = {"type": "session.done", "utterance_index": 0, "total_sentences": 0}
        assert json.loads(await ws.recv()) == done
    async with websockets.connect(url(tts_server)) as ws:
        await send(ws, "session.config")
        await send(ws, "session.close")  # a connection that never ended one hears it too
        assert json.loads(await ws.recv()) == done
        with pytest.raises(websockets.ConnectionClosedOK):
            await ws.recv()


async def test_the_websocket_admission_is_the_realtime_routes(tts_server, http):
    # Shared with /v1/realtime (omnix.http.core.websocket): no handshake is a
    # 426 saying so; a browser origin the server does not allow is a 403.
    async with http.get(tts_server.url + "/v1/audio/speech/stream") as r:
        assert r.status == 426 and r.headers["Upgrade"] == "websocket"
        assert (await r.json())["error"]["code"] == "websocket_required"
    with pytest.raises(websockets.InvalidStatus) as refused:
        await websockets.connect(url(tts_server), origin="https://evil.example")  # type: ignore[arg-type]
    assert refused.value.response.status_code == 403
