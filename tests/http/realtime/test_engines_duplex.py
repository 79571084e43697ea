"""``/v1/realtime?duplex=1`` on a real ``omnix serve`` of the tiny Moshi,
driven by a client speaking vLLM-Omni's duplex messages
(``duplex_wire.Probe``): 80 ms frames of 24 kHz audio in, the model's
audio and text out as one continuous response, frame for frame what the
``moshi_duplex`` engine gives that audio undisturbed (greedy); every frame
an event in the log each way, and a trace of the session renders what the
client was sent; bad input answered by one ``error`` naming
it, the session going on; a client sending ahead of the model told to
slow down; a client that reads slower than the model speaks told, then
dropped, and back with ``session.resume`` it gets every frame it had not
read, once."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
import websockets

from omnix.events.types import Chunk, InputAppended, Routed
from omnix.replay.client import client_bytes
from omnix.testing.served import ServeProcess
from omnix.trace import read_trace

from .duplex_wire import FRAME, Probe, frame_event, log_events, pcm16, speech, undisturbed

pytestmark = [
    pytest.mark.engines,
    pytest.mark.timeout(600),
    pytest.mark.asyncio(loop_scope="module"),
]

MODEL = "moshi"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    from omnix.models.moshi import write_folder

    out = tmp_path_factory.mktemp("moshi") / "moshi"
    write_folder(out, seed=0)
    return out


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(folder, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("duplex-log")
    s = await ServeProcess.start(str(folder), "--log-dir", str(log_dir))
    try:
        await s.ready(timeout=240)
        yield s
    finally:
        await s.stop()


async def test_a_vllm_omni_client_hears_the_engines_undisturbed_frames_and_the_log_holds_each(
    served, folder
) -> None:
    n = 25
    pcm = speech(n)
    async with Probe(served.url, MODEL) as c:
        created = await c.open()
        sid = created["session"]["id"]
        caps = created["session"]["capabilities"]
        assert caps["implementation_level"] == "model_native_duplex"
        assert caps["chunk_period_ms"] == 80 and caps["supports_barge_in"] is False
        assert created["resume_token"] and created["session"]["input_audio_format"] == "pcm_f32le"
        await c.wait("session.updated")
        await c.send({"type": "session.heartbeat"})
        assert (await c.wait("session.heartbeat_ack"))["session_id"] == sid
        assert await c.stream(pcm) == n
        await c.wait("response.output_audio.delta", n)
        rid = c.of("response.created")[0]["response_id"]
        await c.send({"type": "playback.ack", "response_id": rid, "played_ms": 800})
        ack = (await c.wait("playback.acknowledged"))["event"]
        assert ack["played_ms"] == 800 and ack["playback"]["sent_ms"] == n * 80
        await c.send({"type": "session.close"})
        closed = await c.wait("session.closed")
    assert closed["reason"] == "client_close" and closed["session_id"] == sid
    assert not c.of("error")

    # One continuous response: opened once, a frame of 24 kHz 16-bit PCM and
    # its text per user frame, closed when the input ended and was answered.
    deltas = c.of("response.output_audio.delta")
    texts = c.of("response.output_audio_transcript.delta")
    assert len(deltas) == len(texts) == n
    assert {d["response_id"] for d in deltas + texts} == {rid}
    assert {(d["format"], d["sample_rate_hz"]) for d in deltas} == {("pcm16", 24000)}
    done = c.of("response.done")[0]["response"]
    assert done["status"] == "completed" and done["status_details"]["reason"] == "stream_drained"
    types = c.types()
    assert types.index("response.created") < types.index("response.output_audio.delta")
    assert types[-3:] == ["response.done", "rate_limits.updated", "session.closed"]
    seqs = [e["server_event_seq"] for e in c.events if "server_event_seq" in e]
    assert seqs == sorted(set(seqs))

    want = await undisturbed(str(folder), pcm)
    assert len(want) == n
    got = np.frombuffer(b"".join(c.audio()), dtype="<i2").reshape(n, FRAME)
    expect = np.stack([pcm16(o.array) for o in want])
    assert np.abs(got.astype(int) - expect).max() <= 1  # 16-bit PCM of the same floats
    assert "".join(t["delta"] for t in texts) == "".join(o.text for o in want)

    # The log: every user frame one event in (its audio a blob), every model
    # frame one out, with the engine's text token and codes.
    events = await log_events(served.url, sid)
    ins = [e for e in events if type(e) is InputAppended]
    chunks = [e for e in events if type(e) is Chunk]
    assert [e.blob.shape for e in ins if e.blob is not None] == [(FRAME,)] * n
    assert ins[-1].last and ins[-1].blob is None
    assert [c_.token_ids for c_ in chunks] == [o.token_ids for o in want]
    assert sum(type(e) is Routed for e in events) == n + 2  # the admission, n frames, the end

    # A trace of the session replays what the client was sent from the log.
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{served.url}/v1/requests/{sid}/trace") as r:
            assert r.status == 200
            trace = read_trace(await r.read())
    replayed = [json.loads(line) for line in client_bytes(trace, sid).splitlines()]
    assert replayed == [e for e in c.events if "server_event_seq" in e]


async def test_two_sessions_at_once_each_hear_what_their_audio_alone_gives(served, folder) -> None:
    n = 12
    voices = [speech(n), np.ascontiguousarray(speech(2 * n)[n * FRAME :])]

    async def session(pcm: np.ndarray) -> tuple[str, Probe]:
        async with Probe(served.url, MODEL) as c:
            sid = (await c.open())["session"]["id"]
            await c.stream(pcm)
            await c.send({"type": "session.close"})
            await c.wait("session.closed")
        return sid, c

    (sid_a, a), (sid_b, b) = await asyncio.gather(*(session(v) for v in voices))
    assert sid_a != sid_b
    assert a.of("response.created")[0]["response_id"] != b.of("response.created")[0]["response_id"]
    for c, pcm in ((a, voices[0]), (b, voices[1])):
        want = await undisturbed(str(folder), pcm)
        got = np.frombuffer(b"".join(c.audio()), dtype="<i2").reshape(n, FRAME)
        assert np.abs(got.astype(int) - np.stack([pcm16(o.array) for o in want])).max() <= 1


async def test_bad_input_is_one_error_naming_it_and_the_session_goes_on(served) -> None:
    async with Probe(served.url, MODEL) as c:
        # The handshake: a rate or format the model does not take, a persona
        # the checkpoint lacks: an error each, and no session yet.
        bad_rate = await c.send(
            {"type": "session.update", "session": {"model": MODEL, "sample_rate_hz": 16000}}
        )
        await c.send({"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}})
        await c.send({"type": "session.update", "session": {"voice": "NATF2.pt"}})
        await c.send({"type": "session.update", "session": {"instructions": "You are a pirate."}})
        await c.wait("error", 4)
        errors = [e["error"] for e in c.of("error")]
        assert [e["param"] for e in errors] == [
            "session.sample_rate_hz",
            "session.input_audio_format",
            "session.voice",
            "session.instructions",
        ]
        assert errors[0]["event_id"] == bad_rate and "24000" in errors[0]["message"]
        assert "NATF2.pt" in errors[2]["message"]
        assert not c.of("session.created")

        await c.open()
        # In the session: each bad event one error, nothing else changes.
        frame = speech(1)
        await c.send({"type": "input_audio_buffer.append", "audio": "%%%"})
        await c.send(
            {
                "type": "input_audio_buffer.append",
                "audio": "AAAA",
                "format": "pcm_f32le",
                "sample_rate_hz": 16000,
            }
        )
        await c.send({"type": "input.text.append", "text": "hello"})
        await c.send({"type": "barge_in"})
        await c.send({"type": "response.create"})
        await c.send({"type": "no.such.event"})
        await c.send({"type": "session.update", "session": {"output_audio_format": "pcm_f32le"}})
        # Three seconds at once: more than the model may be behind.
        await c.stream(speech(38), paced=False)
        await c.wait("error", 12)
        await asyncio.sleep(0.5)  # (the burst's last errors)
        codes = [e["error"]["code"] for e in c.of("error")[4:]]
        assert codes[:7] == [
            "bad_audio",
            "unsupported_audio_format",
            "native_text_append_unsupported",
            "barge_in_unsupported",
            "response_already_active",
            "unknown_event",
            "session_update_unsupported",
        ]
        assert "input_backpressure" in codes[7:]
        backpressure = next(
            e["error"] for e in c.of("error") if e["error"]["code"] == "input_backpressure"
        )
        assert backpressure["type"] == "rate_limit_error"

        # ... and the session went on: what it took is answered, then more.
        took = 38 - codes.count("input_backpressure")
        assert 0 < took < 38
        await c.wait("response.output_audio.delta", took)
        await c.stream(np.concatenate([frame] * 3))
        await c.send({"type": "session.close"})
        assert (await c.wait("session.closed"))["reason"] == "client_close"
    assert len(c.of("response.output_audio.delta")) == took + 3
    assert c.of("response.done")[0]["response"]["status"] == "completed"


async def test_a_session_id_not_this_servers_is_an_error_and_the_socket_goes_on(served) -> None:
    async with Probe(served.url, MODEL) as c:
        eid = await c.send(
            {"type": "session.resume", "session_id": "duplex-0123", "resume_token": "x"}
        )
        err = (await c.wait("error"))["error"]
        assert err["code"] == "session_resume_expired" and err["param"] == "session_id"
        assert "duplex-0123" in err["message"] and err["event_id"] == eid
        await c.open()
        await c.send({"type": "session.close"})
        assert (await c.wait("session.closed"))["reason"] == "client_close"


async def test_a_client_that_falls_behind_is_told_then_dropped_and_resumes_where_it_was(
    served,
) -> None:
    # A client that sends in real time and reads at less than the rate the
    # model speaks (an audio and a text event each frame: 16 events a
    # second, 8 frames where the model gives 12.5).
    frames = 400
    pcm = speech(frames)
    async with Probe(served.url, MODEL, read_every=1 / 16, rcvbuf=4096) as c:
        created = await c.open()
        sent = 0
        with contextlib.suppress(websockets.ConnectionClosed, OSError):
            for k in range(frames):
                if c.closed is not None:
                    break
                await c.send(frame_event(pcm[k * FRAME : (k + 1) * FRAME], k))
                sent += 1
                await asyncio.sleep(0.08)
        await c.finish(timeout=60)
    assert sent < frames, "the server never dropped the client that fell behind"
    assert c.closed is not None  # by the server: 1008, or cut when it could not say so
    assert (c.closed.rcvd.code if c.closed.rcvd else 1006) in (1008, 1006)
    warning = next(e["error"] for e in c.of("error") if e["error"]["code"] == "output_backpressure")
    assert warning["type"] == "rate_limit_error" and "behind" in warning["message"]
    await served.seen(r"duplex session \S+: its client is \d+ ms behind; dropped", timeout=5)
    sid = created["session"]["id"]
    had = [d["metadata"]["frame"] for d in c.of("response.output_audio.delta")]
    assert had == list(range(len(had)))

    # Back on a new socket with the last seq it had: every frame it missed,
    # then the rest as the model answers it, never one twice.
    async with Probe(served.url, MODEL) as back:
        back.last_seq = c.last_seq
        await back.send(
            {
                "type": "session.resume",
                "session_id": sid,
                "resume_token": created["resume_token"],
                "last_received_server_event_seq": c.last_seq,
            }
        )
        assert (await back.wait("session.resumed"))["session_id"] == sid
        await back.send({"type": "session.close"})
        assert (await back.wait("session.closed", timeout=120))["reason"] == "client_close"
    got = had + [d["metadata"]["frame"] for d in back.of("response.output_audio.delta")]
    heard = sum(
        1
        for e in await log_events(served.url, sid)
        if type(e) is InputAppended and e.blob is not None
    )
    assert len(had) < heard <= sent
    assert got == list(range(heard))


async def test_the_openai_realtime_client_talks_to_it_unchanged(served) -> None:
    """A bare connection is duplex: the session starts as the socket opens
    and runs from its first audio; OpenAI's GA spelling and 16-bit PCM."""
    import base64

    import openai

    client = openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
    n = 12
    pcm = pcm16(speech(n)).astype("<i2").tobytes()
    async with client.realtime.connect(model=MODEL) as conn:
        created = await conn.recv()
        assert created.type == "session.created"
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["audio"],
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 24000},
                        "turn_detection": None,
                    }
                },
            }
        )
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm).decode())
        deltas = []
        while len(deltas) < n:
            ev = await conn.recv()
            assert ev.type != "error", ev
            if ev.type == "response.output_audio.delta":
                deltas.append(base64.b64decode(ev.delta))
    assert [len(d) for d in deltas] == [2 * FRAME] * n
