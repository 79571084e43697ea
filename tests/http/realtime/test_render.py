"""A realtime response's server events from its log events alone
(``render.ResponseStream``): a function call cut off by a cancel ends
with its item ``incomplete`` and, from render 2 on, no
``function_call_arguments.done`` (its arguments are not whole); a
response of render 1 (recorded before) renders as it did, one; a call
that completes is said done either way."""

from __future__ import annotations

import json
from typing import Any

import pytest

from omnix.events.blobs import MemoryBlobStore
from omnix.events.options import API_REALTIME, RealtimeOptions
from omnix.events.types import (
    Admitted,
    Cancelled,
    CancelRequested,
    Chunk,
    Event,
    Finished,
    RequestSpec,
    StageFinished,
    StageParams,
    ToolCallDelta,
)
from omnix.http.realtime.render import ResponseStream
from omnix.http.realtime.respond import REALTIME_RENDER

RID = "resp_1"
TOOLS = StageParams(
    tools='[{"type": "function", "function": {"name": "f"}}]', tool_choice='"required"'
)


def _events(render: int, *, cancelled: bool) -> list[Event]:
    opts = RealtimeOptions(
        render=render,
        item="item_1",
        conversation="conv_1",
        usage_stage="thinker",
        text_stage="thinker",
    )
    spec = RequestSpec(
        messages=(),
        stage_params={"thinker": TOOLS},
        api=API_REALTIME,
        response=opts,
    )

    def chunk(pos: int, i: int, piece: ToolCallDelta) -> Chunk:
        return Chunk(
            pos=pos,
            request_id=RID,
            stage="thinker",
            replica=0,
            index=i,
            modality="text",
            tool_calls=(piece,),
        )

    out: list[Event] = [
        Admitted(pos=0, request_id=RID, pipeline="p", spec=spec),
        chunk(1, 0, ToolCallDelta(index=0, id="call_1", name="f", arguments='{"a": ')),
    ]
    if cancelled:
        out += [
            CancelRequested(pos=2, request_id=RID, reason="interrupted"),
            chunk(3, 1, ToolCallDelta(index=0, arguments='"b"}')),
            Cancelled(pos=4, request_id=RID, reason="interrupted"),
        ]
    else:
        out += [
            chunk(2, 1, ToolCallDelta(index=0, arguments='"b"}')),
            StageFinished(pos=3, request_id=RID, stage="thinker", replica=0, chunks=2),
            Finished(pos=4, request_id=RID),
        ]
    return out


def _render(events: list[Event]) -> list[dict[str, Any]]:
    stream = ResponseStream(MemoryBlobStore())
    return [json.loads(f) for ev in events for f in stream.feed(ev)]


def _ending(sent: list[dict[str, Any]]) -> list[str]:
    types = [e["type"] for e in sent]
    return types[types.index("response.function_call_arguments.delta") :]


def test_a_call_cut_off_by_a_cancel_is_incomplete_and_never_said_done() -> None:
    assert REALTIME_RENDER == 2
    sent = _render(_events(REALTIME_RENDER, cancelled=True))
    assert _ending(sent) == [
        "response.function_call_arguments.delta",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    item = sent[-3]["item"]
    assert (item["type"], item["status"], item["arguments"]) == (
        "function_call",
        "incomplete",
        '{"a": ',
    )
    done = sent[-1]["response"]
    assert done["status"] == "cancelled" and done["status_details"]["reason"] == "turn_detected"
    assert done["output"] == [item]


def test_a_response_of_render_1_renders_as_it_was_recorded() -> None:
    sent = _render(_events(1, cancelled=True))
    assert _ending(sent)[:3] == [
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert sent[-4]["arguments"] == '{"a": '


@pytest.mark.parametrize("render", [1, REALTIME_RENDER])
def test_a_call_that_completes_is_said_done(render: int) -> None:
    sent = _render(_events(render, cancelled=False))
    assert _ending(sent) == [
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert sent[-4]["arguments"] == '{"a": "b"}'
    assert sent[-3]["item"]["status"] == "completed"
