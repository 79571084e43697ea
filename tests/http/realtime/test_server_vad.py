"""Server VAD (``turn_detection: server_vad``, a session's default) with a
real VAD, Silero's: the server finds where speech starts and stops in the
appended audio, commits the turn and answers it (and, with input
transcription on, transcribes it); speech that starts while a response
plays interrupts it through the log.  The speech is a recorded
sentence (``conftest.speech``), surrounded by silence."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from omnix.events.options import API_TRANSCRIPTION
from omnix.events.types import Admitted, Cancelled

from .conftest import client_for, next_event, silence, speech, stream

pytest.importorskip("silero_vad", reason="server VAD needs the silero-vad package")

pytestmark = pytest.mark.asyncio(loop_scope="session")

COMPLETED = "conversation.item.input_audio_transcription.completed"


def tone(seconds: float) -> bytes:
    t = np.arange(int(24000 * seconds)) / 24000
    return (np.sin(2 * np.pi * 440 * t) * 6000).astype("<i2").tobytes()


async def test_server_vad_commits_the_turn_and_answers_it(rt_server):
    said = speech()
    said_ms = len(said) // 48
    async with client_for(rt_server).realtime.connect(model="rt-omni") as conn:
        created = await next_event(conn, "session.created")
        assert created.session.audio.input.turn_detection.type == "server_vad"
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": {"type": "server_vad"}}},
            }
        )
        await next_event(conn, "session.updated")
        await stream(conn, silence(0.5) + said + silence(1.0))
        started = await next_event(conn, "input_audio_buffer.speech_started")
        stopped = await next_event(conn, "input_audio_buffer.speech_stopped")
        committed = await next_event(conn, "input_audio_buffer.committed")
        response = await next_event(conn, "response.created")
        done = await next_event(conn, "response.done")
    # Speech is found where it is (windows of 32 ms), reported with the
    # default 300 ms of padding before it.
    assert abs(started.audio_start_ms - (500 - 300)) <= 96, started
    assert abs(stopped.audio_end_ms - (500 + said_ms)) <= 160, stopped
    assert started.item_id == stopped.item_id == committed.item_id
    assert done.response.status == "completed" and done.response.id == response.response.id
    adm = rt_server.omni.log.events_for(done.response.id)[0]
    assert isinstance(adm, Admitted)
    (part,) = adm.spec.messages[-1].media
    heard_ms = rt_server.omni.blobs.get_array(part.blob).size / 16
    assert abs(heard_ms - (stopped.audio_end_ms - started.audio_start_ms)) <= 2


async def test_silence_and_a_tone_are_no_speech(rt_server):
    async with client_for(rt_server).realtime.connect(model="rt-omni") as conn:
        await next_event(conn, "session.created")
        await stream(conn, silence(0.6) + tone(0.8) + silence(0.6))
        # Nothing was heard: the buffer kept only the padding before speech.
        await conn.input_audio_buffer.commit()
        ev = await conn.recv()
        assert ev.type == "input_audio_buffer.committed", ev
        item = await next_event(conn, "conversation.item.added")
        await conn.conversation.item.retrieve(item_id=item.item.id)
        got = await next_event(conn, "conversation.item.retrieved")
    import base64

    assert len(base64.b64decode(got.item.content[0].audio)) == 48 * 300


async def test_speech_over_a_response_interrupts_it(rt_slow):
    server = rt_slow
    said = speech()
    async with client_for(server).realtime.connect(model="rt-slow") as conn:
        await next_event(conn, "session.created")
        await stream(conn, silence(0.3) + said + silence(0.8))
        first = (await next_event(conn, "response.created")).response.id
        await next_event(conn, "response.output_audio.delta")
        # The user speaks over the answer.
        await stream(conn, said[: 48 * 600])
        await next_event(conn, "input_audio_buffer.speech_started")
        done = await next_event(conn, "response.done")
        assert done.response.id == first and done.response.status == "cancelled"
        assert done.response.status_details.reason == "turn_detected"
        # Their turn ends: it is committed and answered, after the first ended.
        await stream(conn, said[48 * 600 :] + silence(0.8))
        await next_event(conn, "input_audio_buffer.committed")
        second = (await next_event(conn, "response.created")).response.id
        assert second != first
        await conn.response.cancel()
        await next_event(conn, "response.done")
    events = server.omni.log.events_for(first)
    assert isinstance(events[-1], Cancelled) and events[-1].reason == "interrupted"


async def test_a_turn_server_vad_commits_is_transcribed(rt_server):
    async with client_for(rt_server).realtime.connect(model="rt-omni") as conn:
        await next_event(conn, "session.created")
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": {"type": "server_vad"}, "transcription": {}}},
            }
        )
        await next_event(conn, "session.updated")
        await stream(conn, silence(0.5) + speech() + silence(1.0))
        committed = await next_event(conn, "input_audio_buffer.committed")
        seen: list[Any] = []
        while not {"response.done", COMPLETED} <= {e.type for e in seen}:
            seen.append(await conn.recv())
            assert seen[-1].type != "error", seen[-1]
    completed = next(e for e in seen if e.type == COMPLETED)
    done = next(e for e in seen if e.type == "response.done")
    assert completed.item_id == committed.item_id and completed.transcript
    # The transcription heard the clip the response heard.
    log = rt_server.omni.log
    (tx,) = [
        e
        for e in log.read(0, log.next_pos)
        if isinstance(e, Admitted)
        and e.spec.api == API_TRANSCRIPTION
        and getattr(e.spec.response, "item", "") == committed.item_id
    ]
    answered = log.events_for(done.response.id)[0]
    assert isinstance(answered, Admitted)
    assert tx.spec.messages[0].media == answered.spec.messages[-1].media
