"""Schema v10: tool calls.  A chunk a text stage's parsers split carries
its reasoning and its calls' pieces; a chat message its calls or the call
it answers; a stage's parameters the request's tools.  Records of v9 (none
of these fields) read as before: no reasoning, no calls."""

from __future__ import annotations

import msgspec

from omnix.events.codec import decode_event, encode_event
from omnix.events.types import (
    SCHEMA_VERSION,
    Admitted,
    ChatMessage,
    Chunk,
    RequestSpec,
    StageParams,
    ToolCall,
    ToolCallDelta,
)


def test_a_parsed_chunk_round_trips_and_a_v9_chunk_reads_without_calls() -> None:
    ev = Chunk(
        pos=5,
        ts_ns=7,
        request_id="r",
        stage="thinker",
        replica=0,
        index=2,
        modality="text",
        text="Sure. ",
        token_ids=(1, 2, 3),
        reasoning="the user wants weather",
        tool_calls=(ToolCallDelta(0, "call_1", "get_weather", '{"ci'),),
    )
    data = encode_event(ev)
    assert data[0] == SCHEMA_VERSION == 15
    assert decode_event(data) == ev
    fields = msgspec.msgpack.decode(data[1:])
    v9 = bytes([9]) + msgspec.msgpack.encode(fields[:-2])
    old = decode_event(v9)
    assert isinstance(old, Chunk) and old.text == "Sure. "
    assert old.reasoning == "" and old.tool_calls == ()


def test_a_history_with_calls_and_the_tools_round_trip() -> None:
    spec = RequestSpec(
        messages=(
            ChatMessage("user", "weather?"),
            ChatMessage("assistant", "", tool_calls=(ToolCall("c1", "get_weather", "{}"),)),
            ChatMessage("tool", "sunny", tool_call_id="c1"),
        ),
        stage_params={
            "thinker": StageParams(
                tools='[{"type":"function","function":{"name":"get_weather"}}]',
                tool_choice='"auto"',
                parallel_tool_calls=False,
            )
        },
    )
    ev = Admitted(pos=1, ts_ns=2, request_id="r", pipeline="p", spec=spec)
    assert decode_event(encode_event(ev)) == ev
