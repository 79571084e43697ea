"""Realtime function calls on ``tiny-omni``'s real engines (the thinker
with vLLM's ``hermes`` parser and ``--enable-auto-tool-choice``), through
the official ``openai`` client: a named function (held by structured
output even on random weights) comes as a ``function_call`` item, its
arguments streamed; the client's ``function_call_output`` continues the
conversation, the thinker reading the call and its result as chat's
history gives them (the same prompt, token for token); a cancel during a
call's arguments (``response.cancel``, or the user speaking over it with
server VAD on) ends the response once, ``cancelled``, its call
``incomplete`` and never said done, the session going on; and a session
taken up again from the log (as after a restart) holds its calls."""

from __future__ import annotations

import json
from typing import Any

import pytest

from omnix.events.types import Cancelled, CancelRequested, Chunk, StageFinished, is_terminal
from omnix.http.realtime.protocol import FunctionCallItem, FunctionCallOutputItem
from omnix.http.realtime.record import fold_session

from ..conftest import real_engine_marks
from ..tool_calls import REALTIME_WEATHER, admitted
from .conftest import client_for, next_event, silence, speech, stream

PIPELINE = "tiny-omni"
SERVER = "tiny-omni+tools"  # its thinker parses hermes tool calls
pytestmark = real_engine_marks()

# A long string (a call to cancel while it is written): random weights
# close a free one within ~40 tokens, a quarter of a second, and a cancel or
# a voice that comes later on a loaded machine would find the call done.
NOTE = {
    "type": "function",
    "name": "take_note",
    "parameters": {
        "type": "object",
        "properties": {"text": {"type": "string", "minLength": 2000}},
        "required": ["text"],
    },
}
ASK = "What is the weather in Paris?"


async def _text_session(conn: Any, **session: Any) -> str:
    sid = (await next_event(conn, "session.created")).session.id
    await conn.session.update(
        session={
            "type": "realtime",
            "output_modalities": ["text"],
            "audio": {"input": {"turn_detection": None}},
            **session,
        }
    )
    updated = await next_event(conn, "session.updated")
    assert [t.name for t in updated.session.tools] == [t["name"] for t in session.get("tools", [])]
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]}
    )
    await next_event(conn, "conversation.item.done")
    return str(sid)


async def test_a_named_call_and_its_output_continue_the_conversation(server, client):
    named = {"type": "function", "name": "get_weather"}
    async with client_for(server).realtime.connect(model=PIPELINE) as conn:
        sid = await _text_session(conn, tools=[REALTIME_WEATHER, NOTE], tool_choice=named)
        await conn.response.create(response={"max_output_tokens": 200})
        events: list[Any] = []
        done = await next_event(conn, "response.done", events)
        assert done.response.status == "completed", done.response.status_details
        (added,) = [e for e in events if e.type == "response.output_item.added"]
        call = added.item
        assert call.type == "function_call" and call.name == "get_weather"
        assert call.arguments == "" and call.call_id and call.status == "in_progress"
        deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
        (args_done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert deltas and all(d.call_id == call.call_id and d.item_id == call.id for d in deltas)
        assert "".join(d.delta for d in deltas) == args_done.arguments
        assert json.loads(args_done.arguments)["city"] in ("Paris", "Oslo")
        (item_done,) = [e for e in events if e.type == "response.output_item.done"]
        assert item_done.item.status == "completed"
        assert item_done.item.arguments == args_done.arguments
        # A call alone: no message item, none spoken.
        assert [o.type for o in done.response.output] == ["function_call"]
        assert done.response.output[0].id == call.id
        assert not any(e.type.startswith("response.output_text") for e in events)
        types = [e.type for e in events]
        assert types.index("conversation.item.added") < types.index(
            "response.function_call_arguments.delta"
        )
        rid = done.response.id
        assert any(isinstance(e, Chunk) and e.tool_calls for e in server.omni.log.events_for(rid))

        # An output for no call of the conversation is refused; the session goes on.
        await conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": "call_nope", "output": "{}"}
        )
        err = await conn.recv()
        assert err.type == "error" and err.error.param == "item.call_id"

        await conn.conversation.item.create(
            item={
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": '{"sky": "clear"}',
            }
        )
        out_item = (await next_event(conn, "conversation.item.done")).item
        assert out_item.type == "function_call_output" and out_item.call_id == call.call_id
        await conn.response.create(response={"tool_choice": "none", "max_output_tokens": 8})
        second = await next_event(conn, "response.done")
    assert second.response.status in ("completed", "incomplete")
    assert [o.type for o in second.response.output] == ["message"]
    sent = admitted(server, second.response.id).spec.messages
    assert [m.role for m in sent] == ["user", "assistant", "tool"]
    (tc,) = sent[1].tool_calls
    assert (tc.id, tc.name, tc.arguments) == (call.call_id, "get_weather", args_done.arguments)
    assert sent[2].tool_call_id == call.call_id and sent[2].content == '{"sky": "clear"}'
    # Chat's history of the same turn, through the same chat template: the
    # same prompt, token for token.
    chat = await client.chat.completions.create(
        model=PIPELINE,
        messages=[
            {"role": "user", "content": ASK},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": args_done.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": '{"sky": "clear"}'},
        ],
        tools=[
            {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
            for t in (REALTIME_WEATHER, NOTE)
        ],
        tool_choice="none",
        max_tokens=1,
    )
    assert chat.usage is not None
    assert second.response.usage.input_tokens == chat.usage.prompt_tokens

    # The session taken up again from the log (what a restarted server does).
    log = server.omni.log
    folded = fold_session(log.read(0, log.next_pos), sid, server.omni.blobs)
    items = [e.item for e in folded.conversation]
    assert [type(i) for i in items[1:4]] == [
        FunctionCallItem,
        FunctionCallOutputItem,
        type(items[0]),
    ]
    assert items[1].call_id == call.call_id and items[1].arguments == args_done.arguments
    async with client_for(server).realtime.connect(
        model=PIPELINE, extra_query={"session_id": sid}
    ) as conn:
        created = await next_event(conn, "session.created")
        assert [t.name for t in created.session.tools] == ["get_weather", "take_note"]
        assert created.session.tool_choice.name == "get_weather"
        await conn.conversation.item.retrieve(item_id=call.id)
        got = (await next_event(conn, "conversation.item.retrieved")).item
        assert got.type == "function_call" and got.arguments == args_done.arguments
        await conn.response.create(response={"tool_choice": "none", "max_output_tokens": 4})
        third = await next_event(conn, "response.done")
    again = admitted(server, third.response.id).spec.messages
    assert again[:3] == sent


async def test_parallel_tool_calls_false_makes_one_call_and_is_kept(server):
    async with client_for(server).realtime.connect(model=PIPELINE) as conn:
        sid = await _text_session(
            conn, tools=[REALTIME_WEATHER], tool_choice="required", parallel_tool_calls=False
        )
        # (random weights, free to call again, would call until max_output_tokens)
        await conn.response.create(response={"max_output_tokens": 200})
        one = await next_event(conn, "response.done")
        await conn.response.create(
            response={"parallel_tool_calls": True, "tool_choice": "none", "max_output_tokens": 4}
        )
        other = await next_event(conn, "response.done")
    assert one.response.status == "completed", one.response.status_details
    (call,) = one.response.output
    assert call.type == "function_call" and call.status == "completed"
    assert json.loads(call.arguments)["city"] in ("Paris", "Oslo")

    def stage_parallel(rid: str) -> list[bool | None]:
        params = admitted(server, rid).spec.stage_params.values()
        return [p.parallel_tool_calls for p in params if p.tools]

    # The text stage runs it as chat's parallel_tool_calls: the same field.
    assert stage_parallel(one.response.id) == [False]
    assert stage_parallel(other.response.id) == [True]  # a response's own, for it alone
    # In the log: the session folded back (a restart, a replay) has it.
    log = server.omni.log
    folded = fold_session(log.read(0, log.next_pos), sid, server.omni.blobs)
    assert folded.settings is not None and folded.settings.parallel_tool_calls is False
    async with client_for(server).realtime.connect(
        model=PIPELINE, extra_query={"session_id": sid}
    ) as conn:
        created = await next_event(conn, "session.created")
    assert created.session.parallel_tool_calls is False


async def test_a_cancel_during_the_arguments_ends_the_response_once(server):
    async with client_for(server).realtime.connect(model=PIPELINE) as conn:
        await _text_session(conn, tools=[NOTE], tool_choice="required")
        await conn.response.create(response={"max_output_tokens": 400})
        await next_event(conn, "response.function_call_arguments.delta")
        await conn.response.cancel()
        events: list[Any] = []
        done = await next_event(conn, "response.done", events)
    assert done.response.status == "cancelled"
    (call,) = done.response.output
    assert call.type == "function_call" and call.status == "incomplete"
    # Its arguments are never said done (a client would call the function
    # with half of them): the item ends, incomplete.
    assert [
        e.type for e in events if "function_call_arguments.done" in e.type or "item.done" in e.type
    ] == ["response.output_item.done", "conversation.item.done"]
    events_log = server.omni.log.events_for(done.response.id)
    assert sum(1 for e in events_log if is_terminal(e)) == 1
    assert isinstance(events_log[-1], Cancelled)


async def test_speech_over_a_calls_arguments_cancels_it_once_and_the_session_goes_on(server):
    pytest.importorskip("silero_vad", reason="server VAD needs the silero-vad package")
    said = speech()
    note = {"type": "function", "name": "take_note"}
    async with client_for(server).realtime.connect(model=PIPELINE) as conn:
        await next_event(conn, "session.created")
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": {"type": "server_vad"}}},
                # The turn VAD answers by itself: a short answer, no call.
                "tools": [NOTE],
                "tool_choice": "none",
                "max_output_tokens": 8,
            }
        )
        await next_event(conn, "session.updated")
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": ASK}],
            }
        )
        await next_event(conn, "conversation.item.done")
        await stream(conn, silence(0.3))  # the VAD is up, hearing no one
        # The call's arguments go on for hundreds of tokens (NOTE).
        await conn.response.create(response={"tool_choice": note, "max_output_tokens": 1500})
        events: list[Any] = [await next_event(conn, "response.function_call_arguments.delta")]
        rid = events[0].response_id
        # The user speaks over the call's arguments.
        await stream(conn, said[: 48 * 600])
        done = await next_event(conn, "response.done", events)
        types = [e.type for e in events]
        assert "input_audio_buffer.speech_started" in types
        # Their turn ends: it is committed and answered, the session going on.
        await stream(conn, said[48 * 600 :] + silence(0.8))
        await next_event(conn, "input_audio_buffer.committed")
        second = await next_event(conn, "response.done")
        (call,) = done.response.output
        await conn.conversation.item.retrieve(item_id=call.id)
        kept = (await next_event(conn, "conversation.item.retrieved")).item

    assert done.response.id == rid and done.response.status == "cancelled"
    assert done.response.status_details.reason == "turn_detected"
    assert call.type == "function_call" and call.status == "incomplete"
    assert "response.function_call_arguments.done" not in types
    (item_done,) = [e for e in events if e.type == "response.output_item.done"]
    assert item_done.item.status == "incomplete"
    sent = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert call.arguments == item_done.item.arguments == sent
    # The log: the cancel came while the call's arguments were in flight
    # (the thinker still writing them), and ended the request once.
    log = server.omni.log.events_for(rid)
    (asked,) = [e for e in log if isinstance(e, CancelRequested)]
    assert asked.reason == "interrupted"
    before = [e for e in log if e.pos < asked.pos]
    assert not any(isinstance(e, StageFinished) for e in before)
    assert (
        "".join(p.arguments for e in before if isinstance(e, Chunk) for p in e.tool_calls) == sent
    )
    assert sum(1 for e in log if is_terminal(e)) == 1
    assert isinstance(log[-1], Cancelled) and log[-1].reason == "interrupted"
    # The next turn: the unfinished call stays in the conversation,
    # incomplete, unread by the model; the answer comes.
    assert kept.type == "function_call" and kept.status == "incomplete"
    assert second.response.id != rid
    assert second.response.status in ("completed", "incomplete"), second.response.status_details
    assert [o.type for o in second.response.output] == ["message"]
    heard = admitted(server, second.response.id).spec.messages
    assert [m.role for m in heard] == ["user", "user"]
    assert heard[0].content == ASK and heard[1].media and not any(m.tool_calls for m in heard)
