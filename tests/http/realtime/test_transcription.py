"""Input audio transcription on ``/v1/realtime``, through the official
``openai`` realtime client over a real socket: ``audio.input.transcription``
turns it on; each committed turn is transcribed by a request of its own in
the log, planned as ``POST /v1/audio/transcriptions`` plans the same clip,
its ``conversation.item.input_audio_transcription.delta`` events then
``.completed`` (or ``.failed``) rendered from the log; the item holds the
transcript; the response runs beside it; bad settings are ``error``
events; a client that goes cancels it through the log; the session's
trace holds it, and a server restarted on its log keeps the transcript."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from omnix.events.options import API_TRANSCRIPTION, RealtimeOptions, TranscriptionOptions
from omnix.events.types import Admitted, Cancelled, is_terminal
from omnix.http.app import HttpServer
from omnix.http.options import HttpOptions
from omnix.http.realtime.record import fold_session
from omnix.pipelines.validate import parse_pipeline
from omnix.replay.client import client_bytes
from omnix.replay.drive import drive
from omnix.testing.pipelines import scripted_omni_toml
from omnix.testing.served import ServeProcess
from omnix.testing.serving import serve_scripted
from omnix.trace import export_from_dir, read_trace

from ..conftest import _serve, use_processes
from .conftest import FAST, b64, client_for, manual, next_event, pcm16

pytestmark = pytest.mark.asyncio(loop_scope="session")

DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"
FAILED = "conversation.item.input_audio_transcription.failed"
PARAM = "session.audio.input.transcription"

#: The thinker fails at its sixth output: a response of at most 3 tokens
#: ends before it, a transcription does not.
FAILING = scripted_omni_toml(
    "rt-failing",
    thinker='engine = { kind = "scripted", chunks_per_piece = 8, delay_ms = 2, fail_at = 5 }\n'
    "media = { audio = true }",
)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def rt_failing() -> AsyncIterator[HttpServer]:
    async for s in _serve(FAILING):
        yield s


def wav(pcm: bytes) -> bytes:
    """pcm16 mono 24 kHz as a WAV file."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(pcm)
    return buf.getvalue()


async def commit(conn: Any, pcm: bytes) -> str:
    """Commit ``pcm`` as a turn; the item's id, once its events came."""
    await conn.input_audio_buffer.append(audio=b64(pcm))
    await conn.input_audio_buffer.commit()
    item = (await next_event(conn, "input_audio_buffer.committed")).item_id
    await next_event(conn, "conversation.item.done")
    return item


async def read_until(conn: Any, *types: str) -> list[Any]:
    """Events until one of each of ``types`` came (an error fails)."""
    seen: list[Any] = []
    while not all(any(e.type == t for e in seen) for t in types):
        ev = await asyncio.wait_for(conn.recv(), 30)
        assert ev.type != "error", ev
        seen.append(ev)
    return seen


def admitted_transcriptions(server: Any, session: str) -> list[Admitted]:
    log = server.omni.log
    return [
        ev
        for ev in log.read(0, log.next_pos)
        if isinstance(ev, Admitted)
        and ev.spec.api == API_TRANSCRIPTION
        and isinstance(ev.spec.response, RealtimeOptions)
        and ev.spec.response.session == session
    ]


async def test_a_committed_turn_is_transcribed_as_post_transcriptions_would(rt_server):
    tx = {"model": "rt-omni", "language": "en", "prompt": "Hello"}
    async with client_for(rt_server).realtime.connect(model="rt-omni") as conn:
        sid = (await next_event(conn, "session.created")).session.id
        await conn.session.update(
            session={
                "type": "realtime",
                "audio": {"input": {"turn_detection": None, "transcription": tx}},
            }
        )
        shown = (await next_event(conn, "session.updated")).session.audio.input.transcription
        assert (shown.model, shown.language, shown.prompt) == ("rt-omni", "en", "Hello")
        pcm = pcm16(0.5)
        item = await commit(conn, pcm)
        events = await read_until(conn, COMPLETED)
        deltas = [e for e in events if e.type == DELTA]
        done = events[-1]
        await conn.conversation.item.retrieve(item_id=item)
        retrieved = await next_event(conn, "conversation.item.retrieved")
    assert [e.type for e in events] == [DELTA] * len(deltas) + [COMPLETED]
    assert deltas and all(e.item_id == item and e.content_index == 0 for e in deltas)
    assert done.item_id == item and done.content_index == 0
    assert done.transcript == "".join(e.delta for e in deltas)
    assert done.transcript.startswith("t0 t1 ")
    assert done.usage.type == "tokens" and done.usage.output_tokens == len(deltas)
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens
    assert retrieved.item.content[0].transcript == done.transcript
    # One request in the log, of the session, about the item ...
    (adm,) = admitted_transcriptions(rt_server, sid)
    opts = adm.spec.response
    assert isinstance(opts, RealtimeOptions) and opts.item == item and not opts.conversation
    # ... planned as POST /v1/audio/transcriptions plans the same clip and form.
    client = client_for(rt_server)
    posted = await client.audio.transcriptions.create(
        model="rt-omni", file=("turn.wav", wav(pcm)), language="en", prompt="Hello", temperature=0
    )
    assert posted.text == done.transcript
    log = rt_server.omni.log
    post = next(
        ev
        for ev in reversed(list(log.read(0, log.next_pos)))
        if isinstance(ev, Admitted) and isinstance(ev.spec.response, TranscriptionOptions)
    )
    ours, theirs = adm.spec, post.spec
    assert ours.api == theirs.api == API_TRANSCRIPTION
    assert ours.messages == theirs.messages  # the clip's samples (digest) and the instruction
    assert ours.outputs == theirs.outputs and ours.stage_params == theirs.stage_params
    assert ours.stage_params["thinker"].temperature == 0.0


async def test_the_response_runs_beside_the_transcription(rt_server):
    async with client_for(rt_server).realtime.connect(model="rt-omni") as conn:
        await next_event(conn, "session.created")
        await manual(conn, audio={"input": {"turn_detection": None, "transcription": {}}})
        item = await commit(conn, pcm16(0.4))
        await conn.response.create()
        events = await read_until(conn, "response.done", COMPLETED)
    done = next(e for e in events if e.type == "response.done")
    completed = next(e for e in events if e.type == COMPLETED)
    assert done.response.status == "completed" and completed.item_id == item
    # The model heard the audio; the transcript is the client's.
    assert done.response.output[0].content[0].transcript
    assert completed.transcript


@pytest.mark.parametrize(
    ("transcription", "param", "code"),
    [
        ({"model": "whisper-1"}, f"{PARAM}.model", "model_not_found"),
        ({"language": "klingon"}, f"{PARAM}.language", "invalid_value"),
        ({"prompt": "x" * 1001}, f"{PARAM}.prompt", "invalid_value"),
        ({"keywords": ["omnix"]}, f"{PARAM}.keywords", "unsupported_value"),
        ({"delay": "low"}, f"{PARAM}.delay", "unsupported_value"),
        ({"model": "rt-omni", "temperature": 0}, None, "unknown_field"),
    ],
)
async def test_bad_transcription_settings_are_error_events(rt_server, transcription, param, code):
    async with client_for(rt_server).realtime.connect(model="rt-omni") as conn:
        await next_event(conn, "session.created")
        await conn.session.update(
            session={"type": "realtime", "audio": {"input": {"transcription": transcription}}}
        )
        err = await next_event(conn, "error")
        assert err.error.code == code, err
        if param is not None:
            assert err.error.param == param
        else:
            assert "temperature" in err.error.message
        # The session goes on as it was: transcription still off.
        await conn.session.update(session={"type": "realtime", "instructions": "next"})
        updated = await next_event(conn, "session.updated")
        assert updated.session.audio.input.transcription is None


async def test_include_logprobs_is_an_error_event(rt_server):
    async with client_for(rt_server).realtime.connect(model="rt-omni") as conn:
        await next_event(conn, "session.created")
        await conn.session.update(
            session={"type": "realtime", "include": ["item.input_audio_transcription.logprobs"]}
        )
        err = await next_event(conn, "error")
        assert err.error.param == "session.include"


async def test_a_pipeline_that_cannot_transcribe_refuses_it(slow_server):
    async with client_for(slow_server).realtime.connect(model="http-slow") as conn:
        await next_event(conn, "session.created")
        await conn.session.update(
            session={"type": "realtime", "audio": {"input": {"transcription": {}}}}
        )
        err = await next_event(conn, "error")
        assert err.error.param == PARAM and err.error.code == "unsupported_input"
        assert "audio input" in err.error.message
        await conn.session.update(session={"type": "realtime", "instructions": "still here"})
        assert (await next_event(conn, "session.updated")).session.instructions == "still here"


async def test_a_failed_transcription_ends_neither_the_response_nor_the_session(rt_failing):
    async with client_for(rt_failing).realtime.connect(model="rt-failing") as conn:
        await next_event(conn, "session.created")
        await manual(
            conn,
            output_modalities=["text"],
            audio={"input": {"turn_detection": None, "transcription": {"model": "rt-failing"}}},
        )
        item = await commit(conn, pcm16(0.3))
        await conn.response.create(response={"max_output_tokens": 3})
        events = await read_until(conn, "response.done", FAILED)
        failed = next(e for e in events if e.type == FAILED)
        done = next(e for e in events if e.type == "response.done")
        assert failed.item_id == item and failed.content_index == 0
        assert failed.error.code == "stage_error" and failed.error.message
        assert done.response.status == "incomplete"
        # The session goes on; the item has no transcript.
        await conn.conversation.item.retrieve(item_id=item)
        got = await next_event(conn, "conversation.item.retrieved")
        assert got.item.content[0].transcript is None


async def test_a_client_that_goes_cancels_its_transcription(rt_slow):
    server = rt_slow
    async with client_for(server).realtime.connect(model="rt-slow") as conn:
        sid = (await next_event(conn, "session.created")).session.id
        await manual(conn, audio={"input": {"turn_detection": None, "transcription": {}}})
        await commit(conn, pcm16(0.3))
        await next_event(conn, DELTA)
    (adm,) = admitted_transcriptions(server, sid)
    rid = adm.request_id
    for _ in range(200):
        rs = server.omni.state(rid)
        if rs is not None and rs.terminal:
            break
        await asyncio.sleep(0.05)
    events = server.omni.log.events_for(rid)
    assert sum(1 for e in events if is_terminal(e)) == 1
    assert isinstance(events[-1], Cancelled) and events[-1].reason == "disconnect"


async def test_the_session_trace_holds_its_transcriptions(tmp_path: Path):
    log_dir = tmp_path / "log"
    async with serve_scripted(
        parse_pipeline(FAST),
        HttpOptions(),
        processes=use_processes(),
        omni_options={"log_dir": log_dir},
    ) as server:
        async with client_for(server).realtime.connect(model="rt-omni") as conn:
            sid = (await next_event(conn, "session.created")).session.id
            await manual(conn, audio={"input": {"turn_detection": None, "transcription": {}}})
            item = await commit(conn, pcm16(0.4))
            await conn.response.create()
            events = await read_until(conn, "response.done", COMPLETED)
        log = server.omni.log
        folded = fold_session(list(log.read(0, log.next_pos)), sid, server.omni.blobs)
    completed = next(e for e in events if e.type == COMPLETED)
    assert folded.conversation.find(item).item.content[0].transcript == completed.transcript
    assert folded.settings is not None and folded.settings.transcription is not None
    assert not folded.transcribing
    trace = read_trace(export_from_dir(log_dir, None, session=sid))
    (tx,) = [
        e.request_id
        for e in trace.events
        if isinstance(e, Admitted) and e.spec.api == API_TRANSCRIPTION
    ]
    assert drive(trace).ok
    # Its server events render again from the trace, as the client had them.
    lines = [json.loads(x) for x in client_bytes(trace, tx).splitlines()]
    had = [e.model_dump(exclude_none=True) for e in events if e.type in (DELTA, COMPLETED)]
    assert lines == had


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(not use_processes(), reason="needs the process runtime")
async def test_a_transcript_outlives_a_restart(tmp_path: Path):
    cfg, log_dir, port = tmp_path / "p.toml", tmp_path / "log", _free_port()
    cfg.write_text(FAST)
    args = ("--pipeline", str(cfg), "--log-dir", str(log_dir), "--port", str(port))
    first = await ServeProcess.start(*args)
    second: ServeProcess | None = None
    try:
        await first.ready()
        async with client_for(first).realtime.connect(model="rt-omni") as conn:
            sid = (await next_event(conn, "session.created")).session.id
            await manual(conn, audio={"input": {"turn_detection": None, "transcription": {}}})
            item = await commit(conn, pcm16(0.4))
            transcript = (await next_event(conn, COMPLETED)).transcript
        await first.kill9()
        second = await ServeProcess.start(*args)
        await second.ready()
        client = client_for(second)
        async with client.realtime.connect(
            model="rt-omni", extra_query={"session_id": sid}
        ) as conn:
            created = await next_event(conn, "session.created")
            await conn.conversation.item.retrieve(item_id=item)
            got = await next_event(conn, "conversation.item.retrieved")
    finally:
        await first.close()
        if second is not None:
            await second.close()
    assert created.session.id == sid
    assert created.session.audio.input.transcription.model == "rt-omni"
    assert got.item.content[0].transcript == transcript


#: A transcription long enough to kill the server in the middle of.
LONG = scripted_omni_toml(
    "rt-long",
    thinker='engine = { kind = "scripted", chunks_per_piece = 120, delay_ms = 25 }\n'
    "media = { audio = true }",
)


@pytest.mark.skipif(not use_processes(), reason="needs the process runtime")
async def test_a_transcription_in_flight_goes_on_after_kill_9(tmp_path: Path):
    cfg, log_dir, port = tmp_path / "p.toml", tmp_path / "log", _free_port()
    cfg.write_text(LONG)
    args = ("--pipeline", str(cfg), "--log-dir", str(log_dir), "--port", str(port))
    first = await ServeProcess.start(*args)
    second: ServeProcess | None = None
    seen: list[Any] = []
    sid = ""

    def reconnecting(ev: Any) -> Any:
        return {"extra_query": {"session_id": sid, "last_event_id": seen[-1].event_id}}

    try:
        await first.ready()
        client = client_for(first)
        async with client.realtime.connect(model="rt-long", on_reconnecting=reconnecting) as conn:
            sid = (await next_event(conn, "session.created")).session.id
            await manual(conn, audio={"input": {"turn_detection": None, "transcription": {}}})
            await commit(conn, pcm16(0.3))
            async for ev in conn:
                assert ev.type != "error", ev
                seen.append(ev)
                if sum(e.type == DELTA for e in seen) == 20 and second is None:
                    await first.kill9()
                    second = await ServeProcess.start(*args)
                    await second.ready()
                if ev.type == COMPLETED:
                    break
    finally:
        await first.close()
        if second is not None:
            await second.close()
    assert second is not None and [e.type for e in seen].count("session.created") == 1
    deltas = [e.delta for e in seen if e.type == DELTA]
    # Every piece once, in order: continued after what the client had.
    assert "".join(deltas) == seen[-1].transcript == "".join(f"t{n} " for n in range(120))
