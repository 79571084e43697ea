"""``/v1/audio/speech/stream`` on ``tiny-tts`` with real engines (the
talker on vLLM, the codec decoder): each sentence a vLLM sub-request of
the utterance's running request, spoken while the next is still being
written; and a client written for vLLM-Omni, two utterances on one
connection, unchanged."""

from __future__ import annotations

import pytest
import websockets

from omnix.events.types import Admitted, Chunk, InputAppended

from .conftest import real_engine_marks
from .test_speech_stream import read_until, send, url

PIPELINE = "tiny-tts"
pytestmark = real_engine_marks()

# The talker greedy: sampled, a random-weight talker now and then ends a
# sentence at its first token, and that sentence has no audio to start.
GREEDY = {"seed": 3, "sampling_params_list": {"talker": {"temperature": 0.0}}}


async def test_sentences_in_speech_out(server):
    async with websockets.connect(url(server)) as ws:
        await send(ws, "session.config", voice="default", **GREEDY)
        await send(ws, "input.text", text="Good morning. The weather")
        first = await read_until(ws, "audio.start")
        await send(ws, "input.text", text=" is fine today.")
        await send(ws, "session.close")
        rest = await read_until(ws, "session.done")
    messages = first + rest
    starts = [m for m in messages if isinstance(m, dict) and m["type"] == "audio.start"]
    assert [m["sentence_text"] for m in starts] == ["Good morning.", "The weather is fine today."]
    assert sum(len(m) for m in messages if isinstance(m, bytes)) > 2400
    assert messages[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 2}
    rid = next(
        e.request_id
        for e in server.omni.log.read(0, server.omni.log.next_pos)
        if isinstance(e, Admitted) and e.spec.input_streams
    )
    events = server.omni.log.events_for(rid)
    assert [e.text for e in events if isinstance(e, InputAppended)] == [
        "The weather is fine today.",
        "",
    ]
    talker = [e for e in events if isinstance(e, Chunk) and e.stage == "talker"]
    assert {c.piece for c in talker} >= {0, 1}  # each sentence spoken by its own piece


async def test_a_vllm_omni_client_runs_unchanged(server):
    # A client written for vLLM-Omni's route: one connection, a sticky
    # config, two utterances each ended by input.done and answered by
    # session.done (the socket staying open), then session.close.
    heard: list[tuple[int, int, bytes]] = []
    async with websockets.connect(url(server)) as ws:
        await send(
            ws,
            "session.config",
            voice="default",
            response_format="pcm",
            stream_audio=True,
            **GREEDY,
        )
        for utterance, text in enumerate(["Good evening. It is late.", "Sleep well."]):
            await send(ws, "input.text", text=text)
            await send(ws, "input.done")
            pcm = bytearray()
            for m in await read_until(ws, "session.done"):
                if isinstance(m, bytes):
                    pcm += m
                elif m["type"] == "audio.start":
                    assert m["utterance_index"] == utterance and m["format"] == "pcm"
                elif m["type"] == "session.done":
                    heard.append((m["utterance_index"], m["total_sentences"], bytes(pcm)))
        await send(ws, "session.close")
        with pytest.raises(websockets.ConnectionClosedOK):
            await ws.recv()
    assert [(u, n) for u, n, _ in heard] == [(0, 2), (1, 1)]
    assert all(pcm for _, _, pcm in heard)  # each utterance was heard
