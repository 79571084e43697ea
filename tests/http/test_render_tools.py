"""Tool calls and reasoning rendered from the log alone (no server): the
whole ``chat.completion`` and the SSE stream of one recorded answer with
reasoning, text and two parallel calls agree, and the openai client's own
stream assembler (``ChatCompletionStreamState``) builds from the stream
the very message the whole response holds."""

from __future__ import annotations

import json

from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from omnix.events.blobs import MemoryBlobStore
from omnix.events.clock import ManualClock
from omnix.events.log import MemoryLog
from omnix.events.options import ChatOptions
from omnix.events.types import (
    Admitted,
    Chunk,
    Finished,
    RequestSpec,
    Routed,
    StageFinished,
    StageStarted,
    ToolCallDelta,
)
from omnix.http.render import API_CHAT, RENDER_VERSION, render_response

from .conftest import parse_sse

#: (text, reasoning, call pieces) of each chunk, as a parser split them
PIECES = [
    ("", "The user ", ()),
    ("", "wants both.", ()),
    ("Checking. ", "", ()),
    ("", "", (ToolCallDelta(0, "call_a", "get_weather", ""),)),
    ("", "", (ToolCallDelta(0, arguments='{"city": '),)),
    ("", "", (ToolCallDelta(0, arguments='"Oslo"}'),)),
    ("", "", (ToolCallDelta(1, "call_b", "get_time", "{}"),)),
]


def _events(stream: bool):
    log = MemoryLog(ManualClock(10**18))
    rid = "req-t"
    opts = ChatOptions(
        render=RENDER_VERSION, stream=stream, text_stage="thinker", usage_stage="thinker"
    )
    spec = RequestSpec(prompt="hi", api=API_CHAT, model="m", seed=1, response=opts)
    log.append(Admitted(request_id=rid, pipeline="p", spec=spec))
    log.append(Routed(request_id=rid, stage="thinker", replica=0, seq=0, sources=(0,), last=True))
    log.append(StageStarted(request_id=rid, stage="thinker", replica=0))
    for i, (text, reasoning, calls) in enumerate(PIECES):
        log.append(
            Chunk(
                request_id=rid,
                stage="thinker",
                replica=0,
                index=i,
                modality="text",
                text=text,
                token_ids=(i,),
                reasoning=reasoning,
                tool_calls=calls,
            )
        )
    n = len(PIECES)
    log.append(StageFinished(request_id=rid, stage="thinker", replica=0, chunks=n))
    log.append(Finished(request_id=rid, cause=log.next_pos - 1))
    return log.events_for(rid)


def test_the_whole_message_holds_the_answer_reasoning_and_calls():
    data = json.loads(render_response(_events(False), MemoryBlobStore()).body)
    (choice,) = data["choices"]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["content"] == "Checking. "
    assert msg["reasoning_content"] == "The user wants both."
    assert msg["tool_calls"] == [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        },
        {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ]


def test_the_openai_client_assembles_the_stream_into_the_same_message():
    body = render_response(_events(True), MemoryBlobStore()).body
    frames = [f["data"] for f in parse_sse(body) if f["data"] != "[DONE]"]
    state: ChatCompletionStreamState = ChatCompletionStreamState()
    for data in frames:
        for _ in state.handle_chunk(ChatCompletionChunk.model_validate_json(data)):
            pass
    final = state.get_final_completion().choices[0]
    whole = json.loads(render_response(_events(False), MemoryBlobStore()).body)
    msg = whole["choices"][0]["message"]
    assert final.finish_reason == "tool_calls"
    assert final.message.content == msg["content"]
    calls = [
        {
            "id": c.id,
            "type": c.type,
            "function": {"name": c.function.name, "arguments": c.function.arguments},
        }
        for c in final.message.tool_calls or []
    ]
    assert calls == msg["tool_calls"]
    # A call's id and name come once, on its first piece.
    firsts = [
        tc
        for data in frames
        for ch in json.loads(data)["choices"]
        for tc in ch["delta"].get("tool_calls", [])
        if "id" in tc
    ]
    assert [(tc["index"], tc["function"]["name"]) for tc in firsts] == [
        (0, "get_weather"),
        (1, "get_time"),
    ]
    reasoning = "".join(
        ch["delta"].get("reasoning_content", "")
        for data in frames
        for ch in json.loads(data)["choices"]
    )
    assert reasoning == "The user wants both."
