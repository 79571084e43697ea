"""The Realtime API on a pipeline that only speaks: the tiny Qwen3-TTS
CustomVoice folder as ``omnix serve PATH`` derives it (its talker greedy
and bounded to ``FRAMES`` frames: random weights never end an answer),
real engines, the ``openai`` SDK's realtime client.  A response reads the
conversation's last item aloud in the session's voice: its audio is
omnix's in-process greedy audio of that text (held to qwen-tts by
tests/engines/test_qwen3_tts.py), its transcript that text; an assistant
item is read as a user's is; a text-only response, or nothing to read,
is one ``error`` event and the session goes on."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from omnix.http.app import HttpServer
from omnix.pipelines.folder import derive_pipeline
from tests.model_fixtures import session_models

from ..conftest import real_engine_marks, serve_engines, with_talker_sampling
from ..tts_serving import MAX_TOKENS, assert_heard, expected_pcm
from .conftest import client_for, next_event

pytestmark = [*real_engine_marks(), pytest.mark.timeout(600)]

VOICE = "vivian"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tts(tmp_path_factory) -> AsyncIterator[tuple[HttpServer, str]]:
    folder = session_models(tmp_path_factory).qwen3_tts_custom_voice
    greedy = with_talker_sampling(
        derive_pipeline(folder, gpu=False), temperature=0.0, max_tokens=MAX_TOKENS
    )
    async with serve_engines(greedy) as server:
        yield server, folder


async def _item(conn: Any, role: str, text: str) -> None:
    kind = "input_text" if role == "user" else "output_text"
    await conn.conversation.item.create(
        item={"type": "message", "role": role, "content": [{"type": kind, "text": text}]}
    )
    await next_event(conn, "conversation.item.done")


async def _read_aloud(conn: Any) -> tuple[str, bytes, Any]:
    """One response: its transcript's deltas, its audio, its ``response.done``."""
    await conn.response.create()
    transcript, audio = "", bytearray()
    while True:
        ev = await conn.recv()
        assert ev.type != "error", ev
        if ev.type == "response.output_audio_transcript.delta":
            transcript += ev.delta
        elif ev.type == "response.output_audio.delta":
            audio += base64.b64decode(ev.delta)
        elif ev.type == "response.done":
            return transcript, bytes(audio), ev.response


async def test_a_response_reads_the_last_item_aloud_in_the_sessions_voice(tts) -> None:
    server, folder = tts
    text = "Hello there, how are you today?"
    async with client_for(server).realtime.connect(model="") as conn:
        await next_event(conn, "session.created")
        await conn.session.update(
            session={"type": "realtime", "audio": {"output": {"voice": VOICE}}}
        )
        await next_event(conn, "session.updated")
        await _item(conn, "user", text)
        transcript, pcm, done = await _read_aloud(conn)
        assert transcript == text
        assert done.output[0].content[0].transcript == text
        # The talker ran to its bound: the response says so, as for text.
        assert (done.status, done.status_details.reason) == ("incomplete", "max_output_tokens")
        assert_heard(pcm, expected_pcm(folder, text=text, speaker=VOICE))

        await _item(conn, "assistant", "Fine, thank you.")
        transcript, pcm, done = await _read_aloud(conn)
        assert transcript == "Fine, thank you." and len(pcm) == (MAX_TOKENS - 1) * 1920 * 2


async def test_text_out_is_refused_and_the_session_goes_on(tts) -> None:
    server, _ = tts
    async with client_for(server).realtime.connect(model="") as conn:
        await next_event(conn, "session.created")
        await _item(conn, "user", "Hello.")
        await conn.response.create(response={"output_modalities": ["text"]})
        error = await conn.recv()
        assert error.type == "error" and error.error.param == "output_modalities", error
        assert "only speaks" in error.error.message
        _, pcm, done = await _read_aloud(conn)  # the session goes on
        assert pcm and done.status == "incomplete"
