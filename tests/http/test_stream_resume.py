"""A client whose connection drops gets the rest of its response.

Every SSE event of a streamed response carries ``id:`` (a log position;
chat streams when asked for with ``stream_options.resumable``);
``GET /v1/requests/{id}/stream`` with ``Last-Event-ID`` sends what follows
that event, in the response's own format, live to the request's end.  The
bytes a client received before the drop, followed by the resumed stream's,
are the bytes of an undisturbed run: checked at every SSE event boundary
(and in the middle of events: the client keeps what precedes the last
complete event and resends its id), for chat text, chat text + audio on the
scripted omni shape, and speech SSE; live, while the request still runs;
and across a SIGKILL of ``omnix serve --log-dir`` and a restart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest
import pytest_asyncio

from omnix.events.types import TERMINAL_TYPES, Event, StageStarted
from omnix.http.app import HttpServer
from omnix.http.render import render_response
from omnix.testing.pipelines import scripted_omni_toml

from .conftest import _serve, use_processes
from .test_restart import omnix_serve

pytestmark = pytest.mark.asyncio(loop_scope="session")

USER = [{"role": "user", "content": "hi"}]
#: Chat streams carry ids (are resumable) when the client asks for it.
RESUMABLE = {"resumable": True}

# A request streams for ~1.5 s: long enough to drop and resume while it runs.
TEXT = """
name = "resume-text"
[[stages]]
name = "thinker"
engine = { kind = "scripted", chunks_per_piece = 60, delay_ms = 25 }
[outputs]
text = "thinker"
"""

OMNI = scripted_omni_toml(
    "resume-omni",
    thinker='engine = { kind = "scripted", chunks_per_piece = 8, delay_ms = 20 }',
    talker='engine = { kind = "scripted", chunks_per_piece = 3, delay_ms = 5, output_modality = "codec" }',
)

#: Long enough that no test here sees a dropped request cancelled by it.
GRACE_S = 60.0


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def text_server() -> AsyncIterator[HttpServer]:
    async for s in _serve(TEXT, resume_grace_s=GRACE_S):
        yield s


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def omni_server() -> AsyncIterator[HttpServer]:
    async for s in _serve(OMNI, resume_grace_s=GRACE_S):
        yield s


@pytest_asyncio.fixture(loop_scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


# -- SSE as bytes ----------------------------------------------------------------


def frames(body: bytes) -> list[bytes]:
    """The SSE events of ``body``, each with its closing blank line."""
    parts = body.split(b"\n\n")
    assert parts[-1] == b"", "a stream ends with a whole event"
    return [p + b"\n\n" for p in parts[:-1]]


def event_id(frame: bytes) -> str | None:
    for line in frame.split(b"\n"):
        if line.startswith(b"id: "):
            return line[4:].decode()
    return None


def cuts(body: bytes) -> list[tuple[int, str | None]]:
    """(byte offset, the id a client resends) at every event boundary but
    the end: what a client holds when its connection drops there."""
    out: list[tuple[int, str | None]] = [(0, None)]
    at, last = 0, None
    for f in frames(body)[:-1]:
        at += len(f)
        last = event_id(f) or last
        out.append((at, last))
    return out


def id_order(i: str) -> tuple[int, int]:
    pos, _, sub = i.partition(".")
    return int(pos), int(sub or 0)


def check_ids(body: bytes) -> None:
    """Every event but ``[DONE]`` has an id, and ids increase."""
    ids = []
    for f in frames(body):
        i = event_id(f)
        if f.endswith(b"data: [DONE]\n\n"):
            assert i is None, f
        else:
            assert i is not None, f
            ids.append(id_order(i))
    assert ids == sorted(set(ids)) and ids


# -- requests ----------------------------------------------------------------------


async def post_stream(http, server: HttpServer, path: str, body: dict) -> tuple[str, bytes]:
    """An undisturbed streamed response: (request id, its bytes)."""
    async with http.post(server.url + path, json=body) as r:
        assert r.status == 200, await r.text()
        return r.headers["X-Request-Id"], await r.read()


def resume(http, base: str, rid: str, last: str | None, *, query: bool = False):
    """GET /v1/requests/{rid}/stream after ``last`` (header, or query)."""
    url = f"{base}/v1/requests/{rid}/stream"
    headers = {}
    if last is not None and query:
        url += f"?last_event_id={last}"
    elif last is not None:
        headers["Last-Event-ID"] = last
    return http.get(url, headers=headers)


async def rest_after(http, base: str, rid: str, last: str | None, **kw) -> bytes:
    async with resume(http, base, rid, last, **kw) as r:
        assert r.status == 200, await r.text()
        return await r.read()


async def until_ended(server: HttpServer, rid: str) -> list[Event]:
    async with asyncio.timeout(30):
        events = [ev async for ev in server.omni.events(rid)]
    assert isinstance(events[-1], TERMINAL_TYPES)
    return events


def client_state(held: bytes) -> tuple[bytes, str | None]:
    """What a client that received ``held`` keeps (its complete events)
    and the Last-Event-ID it resends (None: it has no event with an id)."""
    kept = held[: held.rfind(b"\n\n") + 2] if b"\n\n" in held else b""
    ids = [i for f in frames(kept) for i in [event_id(f)] if i is not None] if kept else []
    return kept, ids[-1] if ids else None


async def every_cut_resumes_exactly(http, base: str, rid: str, body: bytes) -> None:
    """At every event boundary, and in the middle of every event, the
    bytes the client keeps + the resumed stream == ``body``."""
    check_ids(body)
    boundaries = [at for at, _ in cuts(body)] + [len(body)]
    for i, at in enumerate(boundaries[:-1]):
        mid = (at + boundaries[i + 1]) // 2
        for held in (body[:at], body[:mid]):
            kept, last = client_state(held)
            rest = await rest_after(http, base, rid, last, query=i % 2 == 1)
            assert kept + rest == body, f"drop at byte {len(held)} (resumed after id {last})"


# -- the tests ---------------------------------------------------------------------


async def test_chat_text_resumes_at_every_event_boundary(text_server, http):
    req = {
        "messages": USER,
        "stream": True,
        "seed": 7,
        "stream_options": {"include_usage": True, "resumable": True},
    }
    rid, body = await post_stream(http, text_server, "/v1/chat/completions", req)
    await every_cut_resumes_exactly(http, text_server.url, rid, body)
    # No Last-Event-ID: the whole response from the start.
    assert await rest_after(http, text_server.url, rid, None) == body


@pytest.mark.parametrize("fmt", ["pcm16", "wav"])
async def test_chat_text_and_audio_resumes_at_every_event_boundary(omni_server, http, fmt):
    req = {
        "messages": USER,
        "stream": True,
        "seed": 3,
        "modalities": ["text", "audio"],
        "audio": {"format": fmt, "voice": "default"},
        "stream_options": {"include_usage": True, "resumable": True},
    }
    rid, body = await post_stream(http, omni_server, "/v1/chat/completions", req)
    assert b'"audio"' in body
    await every_cut_resumes_exactly(http, omni_server.url, rid, body)


async def test_speech_sse_resumes_at_every_event_boundary(omni_server, http):
    req = {
        "input": "hello there",
        "voice": "alloy",
        "response_format": "wav",
        "stream_format": "sse",
        "seed": 2,
    }
    rid, body = await post_stream(http, omni_server, "/v1/audio/speech", req)
    assert b"speech.audio.done" in body
    await every_cut_resumes_exactly(http, omni_server.url, rid, body)


async def test_a_dropped_client_resumes_live_while_the_request_runs(text_server, http):
    """Drop a live stream (at an event boundary, and mid-event), reconnect
    at once: the request kept running, and the client gets exactly the
    bytes an undisturbed client got."""
    url = text_server.url + "/v1/chat/completions"
    for n_events, extra in ((4, 0), (9, 7)):
        req = {"messages": USER, "stream": True, "seed": 11, "stream_options": RESUMABLE}
        async with http.post(url, json=req) as r:
            rid = r.headers["X-Request-Id"]
            got = b""
            while got.count(b"\n\n") < n_events or len(got) - got.rfind(b"\n\n") - 2 < extra:
                got += await r.content.read(1)
            r.close()  # the connection drops
        kept, last = client_state(got)
        assert text_server.omni.state(rid).terminal is False  # still running
        rest = await rest_after(http, text_server.url, rid, last)
        events = await until_ended(text_server, rid)
        assert text_server.omni.state(rid).status == "finished"
        undisturbed = render_response(events, text_server.omni.blobs).body
        assert kept + rest == undisturbed
        # A second reconnect from the start gets the same whole response.
        assert await rest_after(http, text_server.url, rid, None) == undisturbed


async def test_a_dropped_client_that_never_comes_back_cancels_after_the_grace(text_server, http):
    readers = text_server.state.readers
    readers.grace_s = 0.2
    try:
        async with http.post(
            text_server.url + "/v1/chat/completions", json={"messages": USER, "stream": True}
        ) as r:
            rid = r.headers["X-Request-Id"]
            await r.content.readuntil(b"\n\n")
            r.close()
        events = await until_ended(text_server, rid)
    finally:
        readers.grace_s = GRACE_S
    assert text_server.omni.state(rid).status == "cancelled"
    assert events[-1].reason == "disconnect"


async def test_the_openai_client_still_streams(text_server):
    client = openai.AsyncOpenAI(base_url=text_server.url + "/v1", api_key="unused", max_retries=0)
    try:
        parts = []
        stream = await client.chat.completions.create(
            model="resume-text", messages=USER, stream=True, stream_options={"include_usage": True}
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                assert chunk.usage.completion_tokens > 0
        assert "".join(parts)
    finally:
        await client.close()


async def test_requests_that_cannot_be_resumed_are_refused_clearly(text_server, omni_server, http):
    base = text_server.url
    async with http.get(f"{base}/v1/requests/no-such-request/stream") as r:
        assert r.status == 404
        assert (await r.json())["error"]["code"] == "request_not_found"
    # A whole (not streamed) response.
    async with http.post(
        base + "/v1/chat/completions", json={"messages": USER, "max_tokens": 4}
    ) as r:
        rid = r.headers["X-Request-Id"]
    async with resume(http, text_server.url, rid, None) as r:
        assert r.status == 409
        err = (await r.json())["error"]
        assert err["code"] == "not_streamed" and rid in err["message"]
    # A batch: each conversation is its own request, never streamed.
    batch = {"messages": [USER, USER], "max_tokens": 4}
    async with http.post(base + "/v1/chat/completions", json=batch) as r:
        members = r.headers["X-Request-Id"].split(",")
        group = (await r.json())["id"].removeprefix("chatcmpl-")
    for member in members:
        async with resume(http, text_server.url, member, "1") as r:
            assert r.status == 409
            err = (await r.json())["error"]
            assert err["code"] == "not_streamed" and "batch" in err["message"]
    async with resume(http, text_server.url, group, None) as r:
        assert r.status == 404  # the batch's id names no request
    # Ids that are not a position of the response.
    rid, body = await post_stream(
        http,
        text_server,
        "/v1/chat/completions",
        {"messages": USER, "stream": True, "max_tokens": 4, "stream_options": RESUMABLE},
    )
    started = next(ev for ev in await until_ended(text_server, rid) if isinstance(ev, StageStarted))
    # Not an id at all: 400; not an id of this response: 409.
    for bad, status in (
        ("soon", 400),
        ("-1", 400),
        (str(started.pos), 409),
        (f"{event_id(frames(body)[0])}.5", 409),
        ("99999999", 409),
    ):
        async with resume(http, text_server.url, rid, bad) as r:
            assert r.status == status, bad
            err = (await r.json())["error"]
            assert err["param"] == "Last-Event-ID" and repr(bad) in err["message"]
    # Raw audio has no event ids: it is sent again whole, never resumed.
    req = {"input": "hi", "voice": "alloy", "response_format": "pcm", "stream_format": "audio"}
    rid, body = await post_stream(http, omni_server, "/v1/audio/speech", req)
    assert await rest_after(http, omni_server.url, rid, None) == body
    async with resume(http, omni_server.url, rid, "3") as r:
        assert r.status == 409
        assert "raw audio" in (await r.json())["error"]["message"]


# -- across a restart ------------------------------------------------------------------

restart_only = pytest.mark.skipif(not use_processes(), reason="needs the process runtime")


@restart_only
async def test_streams_resume_across_a_server_restart(tmp_path: Path) -> None:
    """A request that ended before ``kill -9`` is re-streamed by the
    restarted server from any of its ids.  A request in flight at the kill
    is continued by the restarted server (migration), and the client that
    resumes it gets the rest: its bytes are exactly what the log renders
    to, and its answer that of an undisturbed request."""
    cfg, log_dir = tmp_path / "p.toml", tmp_path / "log"
    cfg.write_text(TEXT)
    body = {"messages": USER, "stream": True, "seed": 5, "stream_options": RESUMABLE}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        async with omnix_serve(cfg, log_dir) as first:
            async with http.post(first.url + "/v1/chat/completions", json=body) as r:
                done_rid, done_body = r.headers["X-Request-Id"], await r.read()
            async with http.post(first.url + "/v1/chat/completions", json=body) as r:
                live_rid = r.headers["X-Request-Id"]
                got = b""
                while got.count(b"\n\n") < 6:
                    got += await r.content.read(1)
                await first.kill9()
        kept = client_state(got)[0]
        async with omnix_serve(cfg, log_dir) as second:
            await every_cut_resumes_exactly(http, second.url, done_rid, done_body)
            rest = await rest_after(http, second.url, live_rid, client_state(got)[1])
            # The whole response as the restarted server's log renders it.
            assert kept + rest == await rest_after(http, second.url, live_rid, None)
            assert rest.endswith(b"data: [DONE]\n\n")
            async with http.get(f"{second.url}/v1/requests/{live_rid}") as r:
                state = json.loads(await r.read())
    # The restarted server continued the request (migration): the client
    # read one uninterrupted answer, the same as the undisturbed request's.
    assert state["status"] == "finished"
    assert content(kept + rest) == content(done_body)


def content(body: bytes) -> str:
    """The answer text of a chat SSE body."""
    out = []
    for f in frames(body):
        data = f.split(b"data: ", 1)[1].strip()
        if data != b"[DONE]":
            out += [c["delta"].get("content") or "" for c in json.loads(data)["choices"]]
    return "".join(out)
