"""``/v1/realtime`` driven by the official ``openai`` realtime client over a
real socket: sessions, turns of audio and text, the event order the SDK
expects, each response one request in the log, overrides, conversation
items, barge-in through the log, the Bearer key and the Origin check."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import pytest

from omnix.events.options import API_REALTIME, RealtimeOptions
from omnix.events.types import (
    Admitted,
    Cancelled,
    CancelRequested,
    Chunk,
    SessionChanged,
    is_terminal,
)

from .conftest import API_KEY, b64, client_for, manual, next_event, pcm16

pytestmark = pytest.mark.asyncio(loop_scope="session")

#: The server events of one audio response, deltas collapsed, in the order
#: the SDK expects them.
AUDIO_ORDER = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_audio_transcript.delta",
    "response.output_audio.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


def collapsed(types: list[str]) -> list[str]:
    out: list[str] = []
    for t in types:
        if t.endswith(".delta") and t in out:
            continue
        out.append(t)
    return out


async def response_events(conn: Any) -> list[Any]:
    events: list[Any] = []
    done = await next_event(conn, "response.done", events)
    return [*events, done]


def admitted(server: Any, rid: str) -> Admitted:
    ev = server.omni.log.events_for(rid)[0]
    assert isinstance(ev, Admitted)
    return ev


async def test_session_created_then_updated(rt_server):
    async with client_for(rt_server).realtime.connect(model="rt-omni") as conn:
        created = await conn.recv()
        assert created.type == "session.created"
        s = created.session
        assert s.type == "realtime" and s.model == "rt-omni" and s.id.startswith("sess_")
        assert s.output_modalities == ["audio"]
        assert s.audio.input.format.type == "audio/pcm" and s.audio.input.format.rate == 24000
        assert s.audio.input.turn_detection.type == "server_vad"
        await conn.session.update(
            session={
                "type": "realtime",
                "instructions": "Answer in one word.",
                "output_modalities": ["text"],
                "max_output_tokens": 5,
                "audio": {
                    "input": {"turn_detection": None},
                    "output": {"voice": "ethan", "format": {"type": "audio/pcm", "rate": 24000}},
                },
            }
        )
        updated = await conn.recv()
        assert updated.type == "session.updated"
        u = updated.session
        assert u.id == s.id and u.instructions == "Answer in one word."
        assert u.output_modalities == ["text"] and u.max_output_tokens == 5
        assert u.audio.input.turn_detection is None and u.audio.output.voice == "ethan"


async def test_parallel_tool_calls_is_taken_kept_and_recorded(rt_server):
    """The SDK's ``parallel_tool_calls`` (a session's; here with no tools,
    which it waits for, as chat ignores it without tools)."""
    async with client_for(rt_server).realtime.connect(model="rt-omni") as conn:
        created = await next_event(conn, "session.created")
        assert created.session.parallel_tool_calls is None
        shown = []
        for update in (
            {"parallel_tool_calls": False},
            {"instructions": "x"},
            {"parallel_tool_calls": None},
        ):
            await conn.session.update(session={"type": "realtime", **update})
            shown.append((await next_event(conn, "session.updated")).session.parallel_tool_calls)
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "q"}],
            }
        )
        await conn.response.create(response={"parallel_tool_calls": False, "max_output_tokens": 4})
        done = await next_event(conn, "response.done")
    assert shown == [False, False, None]
    log = rt_server.omni.log
    recorded = [
        e.settings.parallel_tool_calls
        for e in log.read(0, log.next_pos)
        if isinstance(e, SessionChanged) and e.session == created.session.id and e.settings
    ]
    assert recorded == [None, False, False, None]
    assert done.response.status in ("completed", "incomplete"), done.response.status_details
    # No tools: the stages are given none of them.
    assert not any(
        p.tools or p.parallel_tool_calls is not None
        for p in admitted(rt_server, done.response.id).spec.stage_params.values()
    )


async def test_an_audio_turn_in_the_order_the_sdk_expects(rt_server):
    async with client_for(rt_server).realtime.connect(model="rt-omni") as conn:
        await next_event(conn, "session.created")
        await manual(conn, instructions="Be brief.")
        audio = pcm16(0.5)
        for i in range(0, len(audio), 4800):  # 100 ms appends
            await conn.input_audio_buffer.append(audio=b64(audio[i : i + 4800]))
        await conn.input_audio_buffer.commit()
        committed = await conn.recv()
        assert committed.type == "input_audio_buffer.committed"
        added = await next_event(conn, "conversation.item.added")
        assert added.item.id == committed.item_id and added.item.role == "user"
        assert added.item.content[0].type == "input_audio"
        await next_event(conn, "conversation.item.done")
        await conn.response.create()
        events = await response_events(conn)
    assert collapsed([e.type for e in events]) == AUDIO_ORDER
    created, done = events[0], events[-1]
    rid = created.response.id
    assert done.response.id == rid and done.response.status == "completed"
    assert done.response.usage.output_tokens > 0 and done.response.usage.total_tokens > 0
    deltas = [e for e in events if e.type == "response.output_audio_transcript.delta"]
    transcript = "".join(e.delta for e in deltas)
    final = next(e for e in events if e.type == "response.output_audio_transcript.done")
    assert transcript and final.transcript == transcript
    item = done.response.output[0]
    assert item.role == "assistant" and item.content[0].transcript == transcript
    pcm = b"".join(
        base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
    )
    assert len(pcm) > 0 and len(pcm) % 2 == 0
    # The response is one request in the log, its conversation as input.
    ev = admitted(rt_server, rid)
    spec = ev.spec
    assert spec.api == API_REALTIME and spec.outputs == ("text", "audio")
    assert isinstance(spec.response, RealtimeOptions)
    assert spec.response.item == item.id and spec.response.previous_item == committed.item_id
    assert [m.role for m in spec.messages] == ["system", "user"]
    assert spec.messages[0].content == "Be brief."
    (part,) = spec.messages[1].media
    assert part.kind == "audio" and part.rate == 16000
    samples = rt_server.omni.blobs.get_array(part.blob)
    assert abs(samples.size - 8000) <= 16  # 0.5 s resampled to 16 kHz


async def test_text_turns_carry_the_conversation(rt_server):
    async with client_for(rt_server).realtime.connect(model="rt-omni") as conn:
        await next_event(conn, "session.created")
        await manual(conn, output_modalities=["text"])
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hello there"}],
            }
        )
        added = await next_event(conn, "conversation.item.added")
        assert added.item.content[0].text == "Hello there"
        await conn.response.create()
        first = await response_events(conn)
        types = collapsed([e.type for e in first])
        assert "response.output_text.delta" in types and "response.output_text.done" in types
        assert not any("audio" in t for t in types)
        answer = next(e for e in first if e.type == "response.output_text.done").text
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "More"}],
            }
        )
        await next_event(conn, "conversation.item.done")
        await conn.response.create()
        second = await response_events(conn)
    spec = admitted(rt_server, second[0].response.id).spec
    assert spec.outputs == ("text",)
    assert [(m.role, m.content) for m in spec.messages] == [
        ("user", "Hello there"),
        ("assistant", answer),
        ("user", "More"),
    ]


async def test_response_overrides(rt_server):
    async with client_for(rt_server).realtime.connect(model="rt-omni") as conn:
        await next_event(conn, "session.created")
        await manual(conn)
        await conn.conversation.item.create(
            item={
                "type": "message",
                "id": "item_q",
                "role": "user",
                "content": [{"type": "input_text", "text": "Q"}],
            }
        )
        await next_event(conn, "conversation.item.done")
        await conn.response.create(
            response={
                "instructions": "Out of band.",
                "output_modalities": ["text"],
                "max_output_tokens": 3,
                "conversation": "none",
                "metadata": {"topic": "probe"},
                "input": [{"type": "item_reference", "id": "item_q"}],
            }
        )
        events = await response_events(conn)
        assert "conversation.item.added" not in [e.type for e in events]
        done = events[-1].response
        assert done.status == "incomplete" and done.status_details.reason == "max_output_tokens"
        assert done.conversation_id is None and done.metadata == {"topic": "probe"}
        assert done.usage.output_tokens == 3
        spec = admitted(rt_server, done.id).spec
        assert [(m.role, m.content) for m in spec.messages] == [
            ("system", "Out of band."),
            ("user", "Q"),
        ]
        assert spec.stage_params["thinker"].max_tokens == 3
        # Out of band: the conversation holds the question alone.
        await conn.conversation.item.retrieve(item_id=done.output[0].id)
        err = await next_event(conn, "error")
        assert err.error.code == "item_not_found"


async def test_items_deleted_retrieved_truncated(rt_server):
    async with client_for(rt_server).realtime.connect(model="rt-omni") as conn:
        await next_event(conn, "session.created")
        await manual(conn)
        audio = pcm16(0.3)
        await conn.input_audio_buffer.append(audio=b64(audio))
        await conn.input_audio_buffer.commit()
        committed = await next_event(conn, "input_audio_buffer.committed")
        await conn.conversation.item.retrieve(item_id=committed.item_id)
        got = await next_event(conn, "conversation.item.retrieved")
        assert base64.b64decode(got.item.content[0].audio) == audio
        await conn.response.create()
        events = await response_events(conn)
        item = events[-1].response.output[0]
        await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=10)
        truncated = await next_event(conn, "conversation.item.truncated")
        assert truncated.item_id == item.id and truncated.audio_end_ms == 10
        await conn.conversation.item.delete(item_id=committed.item_id)
        deleted = await next_event(conn, "conversation.item.deleted")
        assert deleted.item_id == committed.item_id
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "x"}],
            }
        )
        await next_event(conn, "conversation.item.done")
        await conn.response.create()
        events = await response_events(conn)
    # The deleted audio is gone from the context, the truncated answer's
    # transcript too (the user did not hear it).
    spec = admitted(rt_server, events[0].response.id).spec
    assert [(m.role, m.content, len(m.media)) for m in spec.messages] == [("user", "x", 0)]


async def test_barge_in_cancels_through_the_log(rt_slow):
    server = rt_slow
    async with client_for(server).realtime.connect(model="rt-slow") as conn:
        await next_event(conn, "session.created")
        await manual(conn)
        await conn.input_audio_buffer.append(audio=b64(pcm16(0.3)))
        await conn.input_audio_buffer.commit()
        await next_event(conn, "conversation.item.done")
        await conn.response.create()
        created = await next_event(conn, "response.created")
        rid = created.response.id
        await next_event(conn, "response.output_audio.delta")
        t_cancel = time.monotonic()
        await conn.response.cancel()
        after: list[Any] = []
        last_audio = t_cancel
        while True:
            ev = await conn.recv()
            after.append(ev)
            if ev.type == "response.output_audio.delta":
                last_audio = time.monotonic()
            if ev.type == "response.done":
                break
        done = after[-1].response
        assert done.status == "cancelled" and done.status_details.reason == "client_cancelled"
        # The socket goes on: nothing of the cancelled response follows.
        await conn.session.update(session={"type": "realtime", "instructions": "next"})
        await next_event(conn, "session.updated")
    gap_ms = (last_audio - t_cancel) * 1000
    assert gap_ms < 100, f"an audio delta left {gap_ms:.0f} ms after the cancel"
    events = server.omni.log.events_for(rid)
    assert sum(1 for e in events if is_terminal(e)) == 1
    assert isinstance(events[-1], Cancelled)
    cancel = next(e for e in events if isinstance(e, CancelRequested))
    # Every stage stopped, and no delta was rendered from after the cancel.
    rs = server.omni.state(rid)
    assert rs is not None and not any(st.status in ("running", "pending") for st in rs.stages)
    sent = {e.event_id for e in after}
    late = [e for e in events if isinstance(e, Chunk) and e.pos > cancel.pos]
    assert not any(f"event_{e.pos}" in sent for e in late)


async def _text_turn(conn) -> None:
    """A manual-turn text session: "hi" added, a response asked for."""
    await next_event(conn, "session.created")
    await manual(conn, output_modalities=["text"])
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    )
    await next_event(conn, "conversation.item.done")
    await conn.response.create()


async def test_a_second_response_while_one_runs_is_an_error(rt_slow):
    async with client_for(rt_slow).realtime.connect(model="rt-slow") as conn:
        await _text_turn(conn)
        created = await next_event(conn, "response.created")
        await conn.send({"type": "response.create", "event_id": "evt_second"})
        err = await next_event(conn, "error")
        assert err.error.code == "conversation_already_has_active_response"
        assert err.error.event_id == "evt_second" and err.error.type == "invalid_request_error"
        await conn.response.cancel(response_id=created.response.id)
        done = await next_event(conn, "response.done")
        assert done.response.status == "cancelled"


async def test_a_client_that_goes_cancels_its_response(rt_slow):
    server = rt_slow
    async with client_for(server).realtime.connect(model="rt-slow") as conn:
        await _text_turn(conn)
        rid = (await next_event(conn, "response.created")).response.id
    for _ in range(200):
        rs = server.omni.state(rid)
        if rs is not None and rs.terminal:
            break
        await asyncio.sleep(0.05)
    events = server.omni.log.events_for(rid)
    assert isinstance(events[-1], Cancelled) and events[-1].reason == "disconnect"


async def test_the_key_is_required(rt_guarded):
    import websockets

    with pytest.raises(websockets.exceptions.InvalidStatus) as exc:
        async with client_for(rt_guarded, "wrong").realtime.connect(model="rt-omni"):
            pass
    assert exc.value.response.status_code == 401
    async with client_for(rt_guarded, API_KEY).realtime.connect(model="rt-omni") as conn:
        assert (await conn.recv()).type == "session.created"


async def test_origins_follow_the_cors_policy(rt_guarded):
    import websockets

    url = rt_guarded.url.replace("http", "ws") + "/v1/realtime?model=rt-omni"
    auth = {"Authorization": f"Bearer {API_KEY}"}
    with pytest.raises(websockets.exceptions.InvalidStatus) as exc:
        async with websockets.connect(url, additional_headers=auth, origin="https://evil.example"):
            pass
    assert exc.value.response.status_code == 403
    async with websockets.connect(url, additional_headers=auth, origin="https://ok.example") as ws:
        assert '"session.created"' in await ws.recv()


async def test_another_model_is_404(rt_server):
    import websockets

    with pytest.raises(websockets.exceptions.InvalidStatus) as exc:
        async with client_for(rt_server).realtime.connect(model="gpt-realtime"):
            pass
    assert exc.value.response.status_code == 404


async def test_a_prompt_holds_the_newest_audio_the_model_takes(rt_server):
    """tiny-omni's thinker takes one clip a prompt (``max_audio_parts``):
    a second spoken turn is heard, the first stays in the conversation
    without its audio in the context."""
    async with client_for(rt_server).realtime.connect(model="rt-omni") as conn:
        await next_event(conn, "session.created")
        await manual(conn, output_modalities=["text"])
        for _ in range(2):
            await conn.input_audio_buffer.append(audio=b64(pcm16(0.3)))
            await conn.input_audio_buffer.commit()
            await next_event(conn, "conversation.item.done")
            await conn.response.create()
            done = await next_event(conn, "response.done")
    spec = admitted(rt_server, done.response.id).spec
    assert [(m.role, len(m.media)) for m in spec.messages] == [("assistant", 0), ("user", 1)]


async def test_function_call_items_a_client_gives_are_history(rt_server):
    """A call the assistant made and its output, given by the client
    (``conversation.item.create`` and a response's ``input``), reach the
    model as chat's history holds them; an output of no known call is
    refused naming ``call_id``."""
    call = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"a": 1}'}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "42"}
    ask = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]}
    async with client_for(rt_server).realtime.connect(model="rt-omni") as conn:
        await next_event(conn, "session.created")
        await manual(conn, output_modalities=["text"])
        for item in (ask, call, output):
            await conn.conversation.item.create(item=item)
            done = await next_event(conn, "conversation.item.done")
        assert done.item.type == "function_call_output" and done.item.output == "42"
        await conn.conversation.item.retrieve(item_id=done.item.id)
        got = (await next_event(conn, "conversation.item.retrieved")).item
        assert (got.call_id, got.output) == ("call_1", "42")
        await conn.response.create()
        first = await response_events(conn)
        # In a response's own input: a call earlier in the same input counts.
        lone = {**call, "call_id": "call_2"}
        await conn.response.create(
            response={"conversation": "none", "input": [ask, lone, {**output, "call_id": "call_2"}]}
        )
        second = await response_events(conn)
        await conn.response.create(response={"input": [ask, {**output, "call_id": "call_3"}]})
        err = await conn.recv()
    assert err.type == "error" and err.error.param == "response.input[1].call_id"
    assert err.error.code == "call_not_found"
    for events, call_id in ((first, "call_1"), (second, "call_2")):
        msgs = admitted(rt_server, events[-1].response.id).spec.messages
        assert [m.role for m in msgs] == ["user", "assistant", "tool"]
        (tc,) = msgs[1].tool_calls
        assert (tc.id, tc.name, tc.arguments) == (call_id, "f", '{"a": 1}')
        assert (msgs[2].tool_call_id, msgs[2].content) == (call_id, "42")


async def test_null_response_instructions_keep_the_sessions(rt_server):
    # LiveKit's realtime plugin sends "instructions": null on every response.create.
    async with client_for(rt_server).realtime.connect(model="rt-omni") as conn:
        await next_event(conn, "session.created")
        await manual(conn, instructions="Be brief.", output_modalities=["text"])
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hi"}],
            }
        )
        await next_event(conn, "conversation.item.done")
        await conn.send({"type": "response.create", "response": {"instructions": None}})
        done = await next_event(conn, "response.done")
    assert done.response.status == "completed"
    (adm,) = [e for e in rt_server.omni.log.events_for(done.response.id) if isinstance(e, Admitted)]
    assert adm.spec.messages[0].role == "system" and adm.spec.messages[0].content == "Be brief."
