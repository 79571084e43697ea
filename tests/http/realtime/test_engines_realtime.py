"""``/v1/realtime`` on ``tiny-omni`` with real engines (vLLM thinker,
Qwen3-Omni talker and Code2Wav), through the official ``openai`` client:
speech in, speech out with a voice, the same answer as a streamed chat
completion of the same conversation, a barge-in that stops every stage,
and input transcription: a committed turn's transcript is what ``POST
/v1/audio/transcriptions`` answers for the same clip (greedy both)."""

from __future__ import annotations

import base64
import io
import time
import wave
from typing import Any

from omnix.events.options import API_TRANSCRIPTION
from omnix.events.types import Admitted, Cancelled, is_terminal

from ..conftest import real_engine_marks
from .conftest import b64, client_for, next_event, pcm16

PIPELINE = "tiny-omni"
pytestmark = real_engine_marks()


async def _turn(conn: Any, **session: Any) -> None:
    await conn.session.update(
        session={"type": "realtime", "audio": {"input": {"turn_detection": None}}, **session}
    )
    await next_event(conn, "session.updated")
    await conn.input_audio_buffer.append(audio=b64(pcm16(0.8)))
    await conn.input_audio_buffer.commit()
    await next_event(conn, "conversation.item.done")


async def test_speech_in_speech_out(server):
    async with client_for(server).realtime.connect(model="tiny-omni") as conn:
        await next_event(conn, "session.created")
        await conn.session.update(
            session={"type": "realtime", "audio": {"output": {"voice": "nobody"}}}
        )
        err = await next_event(conn, "error")
        assert err.error.code == "invalid_value" and "chelsie" in err.error.message
        await _turn(conn, audio={"input": {"turn_detection": None}, "output": {"voice": "ethan"}})
        await conn.response.create(response={"max_output_tokens": 16})
        events: list[Any] = []
        done = await next_event(conn, "response.done", events)
    assert done.response.status in ("completed", "incomplete")
    transcript = "".join(
        e.delta for e in events if e.type == "response.output_audio_transcript.delta"
    )
    pcm = b"".join(
        base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
    )
    assert transcript and len(pcm) > 2400 * 2
    rid = done.response.id
    adm = server.omni.log.events_for(rid)[0]
    assert isinstance(adm, Admitted)
    assert adm.spec.stage_params["talker"].voice == "ethan"
    (part,) = adm.spec.messages[-1].media
    assert part.kind == "audio" and part.rate == 16000
    assert done.response.output[0].content[0].transcript == transcript


async def test_barge_in_stops_every_stage(server):
    async with client_for(server).realtime.connect(model="tiny-omni") as conn:
        await next_event(conn, "session.created")
        await _turn(conn)
        await conn.response.create(response={"max_output_tokens": 200})
        rid = (await next_event(conn, "response.created")).response.id
        await next_event(conn, "response.output_audio.delta")
        t_cancel = time.monotonic()
        await conn.response.cancel()
        last = t_cancel
        while True:
            ev = await conn.recv()
            if ev.type == "response.output_audio.delta":
                last = time.monotonic()
            if ev.type == "response.done":
                break
    assert ev.response.status == "cancelled"
    assert (last - t_cancel) < 0.5
    events = server.omni.log.events_for(rid)
    assert sum(1 for e in events if is_terminal(e)) == 1 and isinstance(events[-1], Cancelled)
    rs = server.omni.state(rid)
    assert rs is not None and not any(st.status in ("running", "pending") for st in rs.stages)


async def test_a_turn_is_transcribed_as_post_transcriptions_does(server, client):
    pcm = pcm16(0.8)
    tx = {"model": "tiny-omni", "language": "en"}
    async with client_for(server).realtime.connect(model="tiny-omni") as conn:
        await next_event(conn, "session.created")
        await _turn(conn, audio={"input": {"turn_detection": None, "transcription": tx}})
        deltas: list[Any] = []
        done = await next_event(
            conn, "conversation.item.input_audio_transcription.completed", deltas
        )
    assert done.transcript == "".join(
        e.delta for e in deltas if e.type == "conversation.item.input_audio_transcription.delta"
    )
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(pcm)
    posted = await client.audio.transcriptions.create(
        model="tiny-omni", file=("turn.wav", buf.getvalue()), language="en", temperature=0
    )
    assert done.transcript and posted.text == done.transcript
    log = server.omni.log
    ours, theirs = [
        ev.spec
        for ev in log.read(0, log.next_pos)
        if isinstance(ev, Admitted) and ev.spec.api == API_TRANSCRIPTION
    ][-2:]
    assert ours.messages == theirs.messages and ours.stage_params == theirs.stage_params
