"""A realtime session is in the log: its settings and conversation items
are ``SessionChanged`` events beside its responses' requests, so the
session folds back from the log alone, ``omnix trace export --session``
exports it whole and ``omnix replay`` drives it with zero divergence, and
after ``kill -9`` of the server and a restart on its ``--log-dir`` the
``openai`` SDK's client, reconnecting, resumes its session: the
conversation intact and the response it was hearing continued where it
stopped (the request's continuation), not from the start."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from omnix import cli
from omnix.events.types import Admitted, Chunk, Routed, SessionChanged
from omnix.http.options import HttpOptions
from omnix.http.realtime.record import fold_session
from omnix.pipelines.validate import parse_pipeline
from omnix.replay.client import client_bytes
from omnix.replay.drive import drive
from omnix.testing.pipelines import scripted_omni_toml
from omnix.testing.served import ServeProcess
from omnix.testing.serving import serve_scripted
from omnix.trace import export_from_dir, read_trace

from ..conftest import use_processes
from .conftest import FAST, b64, client_for, manual, next_event, pcm16

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _a_conversation(conn: Any) -> list[str]:
    """Audio, an answer, a text item, another answer, a deletion and a
    truncation; the item ids the client saw, in order."""
    await next_event(conn, "session.created")
    await manual(conn, instructions="Be brief.")
    await conn.input_audio_buffer.append(audio=b64(pcm16(0.4)))
    await conn.input_audio_buffer.commit()
    audio_item = (await next_event(conn, "input_audio_buffer.committed")).item_id
    await conn.response.create()
    first = (await next_event(conn, "response.done")).response.output[0].id
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}
    )
    text_item = (await next_event(conn, "conversation.item.added")).item.id
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "y"}]}
    )
    gone = (await next_event(conn, "conversation.item.added")).item.id
    await conn.conversation.item.delete(item_id=gone)
    await next_event(conn, "conversation.item.deleted")
    await conn.response.create()
    second = (await next_event(conn, "response.done")).response.output[0].id
    await conn.conversation.item.truncate(item_id=second, content_index=0, audio_end_ms=5)
    await next_event(conn, "conversation.item.truncated")
    return [audio_item, first, text_item, second]


async def test_the_session_folds_back_from_the_log_and_replays(tmp_path: Path):
    log_dir = tmp_path / "log"
    pipeline = parse_pipeline(FAST)
    async with serve_scripted(
        pipeline, HttpOptions(), processes=use_processes(), omni_options={"log_dir": log_dir}
    ) as server:
        async with client_for(server).realtime.connect(model="rt-omni") as conn:
            sid_task = asyncio.ensure_future(conn.recv())
            created = await sid_task
            sid = created.session.id
            # _a_conversation reads session.created itself: send it back.
            items = await _a_conversation(_Prepend(conn, created))
        log = server.omni.log
        events = list(log.read(0, log.next_pos))
        ops = [e.op for e in events if isinstance(e, SessionChanged) and e.session == sid]
        assert ops == [
            "opened",
            "configured",
            "item_added",
            "item_added",
            "item_added",
            "item_deleted",
            "item_truncated",
        ]
        folded = fold_session(events, sid, server.omni.blobs)
        assert [e.id for e in folded.conversation] == items
        assert folded.settings is not None and folded.settings.instructions == "Be brief."
        assert folded.settings.turns is None and not folded.running
        audio = next(iter(folded.conversation))
        assert audio.media and audio.media[0].rate == 16000
        second = list(folded.conversation)[-1]
        assert second.truncated and second.audio_ms == 5
    data = export_from_dir(log_dir, None, session=sid)
    out = tmp_path / "session.trace"
    assert (
        cli.main(["trace", "export", "--log-dir", str(log_dir), "--session", sid, "-o", str(out)])
        == 0
    )
    assert out.read_bytes() == data  # the command writes what export_from_dir makes
    trace = read_trace(data)
    rids = [e.request_id for e in trace.events if isinstance(e, Admitted)]
    assert len(rids) == 2 and set(trace.request_ids) >= set(rids)
    assert any(isinstance(e, SessionChanged) and e.op == "opened" for e in trace.events)
    assert drive(trace).ok
    # Each response's server events render again from the trace.
    lines = [json.loads(x) for x in client_bytes(trace, rids[0]).splitlines()]
    assert lines[0]["type"] == "response.created" and lines[-1]["type"] == "response.done"
    assert lines[-1]["response"]["status"] == "completed"
    assert any(x["type"] == "response.output_audio.delta" for x in lines)


class _Prepend:
    """A connection whose first ``recv`` gives back an event already read."""

    def __init__(self, conn: Any, first: Any) -> None:
        self._conn = conn
        self._first: Any = first

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def recv(self) -> Any:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await self._conn.recv()


# -- a server killed with SIGKILL and started again ------------------------------

SLOW = scripted_omni_toml(
    "rt-restart",
    thinker='engine = { kind = "scripted", chunks_per_piece = 120, delay_ms = 25 }\n'
    "media = { audio = true }",
    edge_thinker='forward = "chunk"\nevery = 4',
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve(cfg: Path, log_dir: Path, port: int) -> ServeProcess:
    served = await ServeProcess.start(
        "--pipeline", str(cfg), "--log-dir", str(log_dir), "--port", str(port)
    )
    await served.ready()
    return served


@pytest.mark.skipif(not use_processes(), reason="needs the process runtime")
async def test_a_session_resumes_after_kill_9_and_restart(tmp_path: Path):
    cfg, log_dir, port = tmp_path / "p.toml", tmp_path / "log", _free_port()
    cfg.write_text(SLOW)
    first = await _serve(cfg, log_dir, port)
    second: ServeProcess | None = None
    seen: list[Any] = []
    sid = ""

    def reconnecting(ev: Any) -> Any:
        last = seen[-1].event_id if seen else ""
        return {"extra_query": {"session_id": sid, "last_event_id": last}}

    try:
        client = client_for(first)
        async with client.realtime.connect(
            model="rt-restart", on_reconnecting=reconnecting
        ) as conn:
            sid = (await next_event(conn, "session.created")).session.id
            await manual(conn)
            await conn.input_audio_buffer.append(audio=b64(pcm16(0.4)))
            await conn.input_audio_buffer.commit()
            user_item = (await next_event(conn, "input_audio_buffer.committed")).item_id
            await next_event(conn, "conversation.item.done")
            await conn.response.create()
            heard = asyncio.Event()
            reading = asyncio.ensure_future(_read_to_done(conn, seen, heard))
            await asyncio.wait_for(heard.wait(), 30)
            await first.kill9()
            second = await _serve(cfg, log_dir, port)
            done = await asyncio.wait_for(reading, 90)
            # The conversation is intact: answered again, it is the context.
            await conn.response.create(response={"output_modalities": ["text"]})
            again = await next_event(conn, "response.done")
    finally:
        await first.close()
        if second is not None:
            await second.close()
    resumed = [e for e in seen if e.type == "session.created"]
    assert [e.session.id for e in resumed] == [sid]  # the reconnect's session is the same
    deltas = [e.delta for e in seen if e.type == "response.output_audio_transcript.delta"]
    transcript = done.response.output[0].content[0].transcript
    # Every piece once, in order: continued after what the client had.
    assert "".join(deltas) == transcript == "".join(f"t{n} " for n in range(120))
    ids = [e.event_id for e in seen]
    assert len(ids) == len(set(ids))
    assert done.response.status == "completed"
    rid = done.response.id
    trace = read_trace(export_from_dir(log_dir, None, session=sid))
    cont = [e for e in trace.events if isinstance(e, Routed) and e.resume and e.request_id == rid]
    assert cont and all(e.resume > 0 for e in cont)
    chunks = [e for e in trace.events if isinstance(e, Chunk) and e.request_id == rid]
    assert [c.index for c in chunks if c.stage == "thinker"] == list(range(120))
    adm = next(
        e for e in trace.events if isinstance(e, Admitted) and e.request_id == again.response.id
    )
    assert [m.role for m in adm.spec.messages] == ["user", "assistant"]
    assert adm.spec.messages[0].media and adm.spec.messages[1].content == transcript
    assert user_item and drive(trace).ok


async def _read_to_done(conn: Any, seen: list[Any], heard: asyncio.Event) -> Any:
    """The SDK's iterator (which reconnects) up to ``response.done``;
    ``heard`` is set after 20 pieces of transcript."""
    async for ev in conn:
        assert ev.type != "error", ev
        seen.append(ev)
        if sum(e.type == "response.output_audio_transcript.delta" for e in seen) >= 20:
            heard.set()
        if ev.type == "response.done":
            return ev
    raise AssertionError("the connection closed before response.done")


@pytest.mark.skipif(not use_processes(), reason="needs the process runtime")
async def test_function_call_items_survive_kill_9_and_restart(tmp_path: Path):
    """A call and its output in the conversation come back after ``kill -9``
    and a restart: retrieved as they were, and read by the next response as
    chat's history holds them."""
    cfg, log_dir, port = tmp_path / "p.toml", tmp_path / "log", _free_port()
    cfg.write_text(SLOW)
    first = await _serve(cfg, log_dir, port)
    second: ServeProcess | None = None
    ask = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]}
    call = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"a": 1}'}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "42"}
    try:
        async with client_for(first).realtime.connect(model="rt-restart") as conn:
            sid = (await next_event(conn, "session.created")).session.id
            await manual(conn, output_modalities=["text"])
            ids = []
            for item in (ask, call, output):
                await conn.conversation.item.create(item=item)
                ids.append((await next_event(conn, "conversation.item.done")).item.id)
            # A response's events are sent once on disk, and the items before
            # them with them (a session's own events are not waited on).
            await conn.response.create(response={"max_output_tokens": 4})
            await next_event(conn, "response.done")
        await first.kill9()
        second = await _serve(cfg, log_dir, port)
        async with client_for(second).realtime.connect(
            model="rt-restart", extra_query={"session_id": sid}
        ) as conn:
            await next_event(conn, "session.created")
            await conn.conversation.item.retrieve(item_id=ids[1])
            got = (await next_event(conn, "conversation.item.retrieved")).item
            assert (got.type, got.call_id, got.name, got.arguments) == (
                "function_call",
                "call_1",
                "f",
                '{"a": 1}',
            )
            await conn.response.create(response={"max_output_tokens": 4})
            done = await next_event(conn, "response.done")
    finally:
        await first.close()
        if second is not None:
            await second.close()
    trace = read_trace(export_from_dir(log_dir, None, session=sid))
    adm = next(
        e for e in trace.events if isinstance(e, Admitted) and e.request_id == done.response.id
    )
    msgs = adm.spec.messages
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[1].tool_calls[0].id == "call_1" and msgs[2].tool_call_id == "call_1"
    assert drive(trace).ok
