"""``/v1/audio/speech/stream`` on ``omnix serve PATH`` of the tiny Qwen3-TTS
CustomVoice folder: text written sentence by sentence is spoken as it
comes (the first sentence's audio starts before the rest is written), in
the reference's streaming-text mode, so the utterance's audio equals
omnix's in-process greedy audio of the joined text in that mode (held to
qwen-tts by tests/engines/test_qwen3_tts.py); each sentence's audio is
told apart; the Qwen3-TTS fields are checked as ``POST /v1/audio/speech``
checks them; a Base checkpoint clones the clip its config names."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import websockets

from omnix.testing.served import ServeProcess

from .test_speech_stream import read_until, send
from .tts_serving import (
    MAX_TOKENS,
    START_S,
    assert_heard,
    clip_samples,
    data_url,
    expected_clone,
    expected_pcm,
    reference_wav,
)

pytestmark = [
    pytest.mark.engines,
    pytest.mark.timeout(600),
    pytest.mark.asyncio(loop_scope="module"),
]

FIRST = "Hello there, it is a lovely morning in the old city."
REST = ("How are you today?", "I am fine, thank you.")
GREEDY = {"talker": {"temperature": 0.0, "max_tokens": MAX_TOKENS}}


async def _serving(folder: str) -> AsyncIterator[ServeProcess]:
    """``omnix serve FOLDER``, ready, stopped after."""
    served = await ServeProcess.start(folder)
    try:
        await served.ready(timeout=START_S)
        yield served
    finally:
        await served.stop()


@pytest.fixture(scope="module")
async def served(tiny_models):
    async for s in _serving(tiny_models.qwen3_tts_custom_voice):
        yield s


def _url(served: ServeProcess) -> str:
    return served.url.replace("http", "ws") + "/v1/audio/speech/stream"


async def test_sentences_written_as_they_come_are_spoken_as_the_joined_text(
    served, tiny_models
) -> None:
    async with websockets.connect(_url(served), max_size=None) as ws:
        await send(
            ws, "session.config", voice="vivian", language="English", sampling_params_list=GREEDY
        )
        await send(ws, "input.text", text=f"{FIRST} How are")
        first = await read_until(ws, "audio.start")  # before the rest is written
        await send(ws, "input.text", text=" you today? I am fine, thank you.")
        await send(ws, "input.done")
        rest = await read_until(ws, "session.done")
    messages = first + rest
    pcm = b"".join(m for m in messages if isinstance(m, bytes))
    want = expected_pcm(
        tiny_models.qwen3_tts_custom_voice,
        text=" ".join((FIRST, *REST)),
        speaker="vivian",
        language="English",
        non_streaming=False,
    )
    assert_heard(pcm, want)
    starts = [m for m in messages if isinstance(m, dict) and m["type"] == "audio.start"]
    said = [m["sentence_text"] for m in starts]
    assert said[0] == FIRST and said == sorted(said, key=(FIRST, *REST).index)
    assert len(said) >= 2  # a later sentence's audio is told apart from the first's
    assert messages[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 3}


async def test_the_qwen3_tts_fields_are_checked_as_the_speech_route_checks_them(
    served,
) -> None:
    async with websockets.connect(_url(served)) as ws:
        # Checked at session.config, before any text.
        await send(ws, "session.config", voice="vivian", language="Klingon")
        (error,) = [m for m in await read_until(ws, "error") if isinstance(m, dict)]
        assert "Unknown language 'Klingon'" in error["message"], error
        await send(ws, "session.config", voice="vivian", ref_text="what I said")
        (error,) = [m for m in await read_until(ws, "error") if isinstance(m, dict)]
        assert "ref_text" in error["message"] and "Base" in error["message"], error


@pytest.fixture(scope="module")
async def served_base(tiny_models):
    async for s in _serving(tiny_models.qwen3_tts_base):
        yield s


async def test_a_base_checkpoint_clones_the_configs_clip_for_the_whole_utterance(
    served_base, tiny_models
) -> None:
    # Base waits for the whole text (a voice cloned in context puts it in
    # the prefill), then speaks it in the reference's streaming-text mode.
    wav, said = reference_wav(), "A short clip to clone."
    async with websockets.connect(_url(served_base), max_size=None) as ws:
        await send(
            ws,
            "session.config",
            ref_audio=data_url(wav),
            ref_text=said,
            sampling_params_list=GREEDY,
        )
        await send(ws, "input.text", text=f"{FIRST} {REST[0]}")
        await send(ws, "input.done")
        messages = await read_until(ws, "session.done")
    pcm = b"".join(m for m in messages if isinstance(m, bytes))
    want = expected_clone(
        tiny_models.qwen3_tts_base,
        clip_samples(wav),
        said,
        text=f"{FIRST} {REST[0]}",
        non_streaming=False,
    )
    assert_heard(pcm, want)
