"""Chat tool calls on a real vLLM engine (``tiny-text`` with vLLM's
``hermes`` tool-call parser and ``--enable-auto-tool-choice``), driven by
the official ``openai`` client's tool-call loop: ``required`` and a named
function are held by structured output even on random weights, the calls
come back whole and, streamed, as the deltas the client assembles; the
tool's answer goes back in the history; the log renders the very bytes the
client received.  Bad tools, choices and parser names: one 400 (or one
usage error) naming the field, before anything is admitted."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import msgspec
import openai
import pytest
import pytest_asyncio

from omnix.events.types import Admitted, Chunk
from omnix.http.app import HttpServer
from omnix.http.render import render_response
from omnix.pipelines.config import VllmArgs
from omnix.pipelines.validate import PipelineError, load_pipeline, validate_pipeline
from omnix.replay.client import client_bytes
from omnix.stages.options import RuntimeOptions
from omnix.testing.serving import serve_omni
from omnix.trace import read_trace

from .conftest import real_engine_marks
from .tool_calls import CHAT_WEATHER

PIPELINE = "tiny-text"
pytestmark = real_engine_marks()

# Bounded arguments: a random-weight model must still reach the end.
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def _with_parsers(**parsers) -> object:
    cfg = load_pipeline(PIPELINE)
    stages = tuple(
        msgspec.structs.replace(st, engine=msgspec.structs.replace(st.engine, **parsers))
        if isinstance(st.engine, VllmArgs)
        else st
        for st in cfg.stages
    )
    return msgspec.structs.replace(cfg, stages=stages)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(tmp_path_factory) -> AsyncIterator[HttpServer]:
    from omnix.api import Omni
    from tests.model_fixtures import session_models

    session_models(tmp_path_factory)
    cfg = _with_parsers(enable_auto_tool_choice=True, tool_call_parser="hermes")
    omni = Omni(
        cfg,
        runtime_options=RuntimeOptions(
            forward_worker_output=False, lost_after_s=20.0, start_timeout_s=600.0
        ),
    )
    async with serve_omni(omni, grace_s=2.0, telemetry=False) as s:
        yield s


@pytest_asyncio.fixture(loop_scope="session")
async def client(server: HttpServer):
    c = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120
    )
    yield c
    await c.close()


async def test_required_tool_loop_with_the_openai_client(server, client):
    first = await client.chat.completions.create(
        model=PIPELINE,
        messages=USER,
        tools=[CHAT_WEATHER, TIME],
        tool_choice="required",
        # One call: a random-weight model would add calls until max_tokens.
        parallel_tool_calls=False,
        seed=5,
        max_tokens=200,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    calls = choice.message.tool_calls
    assert len(calls) == 1 and all(c.type == "function" and c.id for c in calls)
    for c in calls:
        assert c.function.name in ("get_weather", "get_time")
        args = json.loads(c.function.arguments)
        if c.function.name == "get_weather":
            assert args["city"] in ("Paris", "Oslo")
    # The calls are in the log: the log renders the response the client got.
    rid = first.id.removeprefix("chatcmpl-")
    events = server.omni.log.events_for(rid)
    assert any(isinstance(e, Chunk) and e.tool_calls for e in events)
    # The loop goes on: the calls and their answers in the history.
    history = [
        *USER,
        choice.message.model_dump(exclude_none=True),
        *({"role": "tool", "tool_call_id": c.id, "content": '{"sky": "clear"}'} for c in calls),
    ]
    second = await client.chat.completions.create(
        model=PIPELINE,
        messages=history,
        tools=[CHAT_WEATHER, TIME],
        tool_choice="none",
        max_tokens=8,
    )
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].message.content
    (admitted,) = [
        e
        for e in server.omni.log.events_for(second.id.removeprefix("chatcmpl-"))
        if isinstance(e, Admitted)
    ]
    sent = admitted.spec.messages
    assert [m.role for m in sent] == ["user", "assistant"] + ["tool"] * len(calls)
    assert [c.id for c in sent[1].tool_calls] == [c.id for c in calls]
    assert sent[2].tool_call_id == calls[0].id


async def test_named_function_streams_deltas_the_client_assembles(server, client, http):
    named = {"type": "function", "function": {"name": "get_weather"}}
    async with client.chat.completions.stream(
        model=PIPELINE, messages=USER, tools=[CHAT_WEATHER, TIME], tool_choice=named, max_tokens=200
    ) as stream:
        final = await stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
    assert final.choices[0].finish_reason == "tool_calls"
    # The SSE bytes again from the log alone (what `omnix replay --client-bytes` does).
    body = {
        "model": PIPELINE,
        "messages": USER,
        "tools": [CHAT_WEATHER],
        "tool_choice": named,
        "stream": True,
        "max_tokens": 200,
    }
    async with http.post(server.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        raw = await r.read()
        rid = r.headers["X-Request-Id"]
    assert b'"tool_calls":[{"index":0,"id":"' in raw
    assert render_response(server.omni.log.events_for(rid), server.omni.blobs).body == raw
    # And from the trace a client downloads (`omnix replay --client-bytes`).
    async with http.get(f"{server.url}/v1/requests/{rid}/trace") as r:
        assert r.status == 200
        trace = read_trace(await r.read())
    assert client_bytes(trace, rid) == raw


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "objekt"}},
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        (
            {
                "tools": [CHAT_WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            },
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [CHAT_WEATHER, CHAT_WEATHER]}, "tools[1].function.name"),
    ],
)
async def test_bad_tools_are_one_400_naming_the_field(server, http, body, param):
    before = len(server.omni.log)
    req = {"model": PIPELINE, "messages": USER, **body}
    async with http.post(server.url + "/v1/chat/completions", json=req) as r:
        assert r.status == 400, await r.text()
        err = (await r.json())["error"]
    assert err["param"] == param, err
    assert len(server.omni.log) == before  # nothing admitted


def test_a_parser_name_vllm_lacks_is_refused_naming_the_flag():
    with pytest.raises(PipelineError, match=r"tool_call_parser \(--tool-call-parser\).*'nope'"):
        validate_pipeline(_with_parsers(tool_call_parser="nope"))
    with pytest.raises(PipelineError, match=r"reasoning_parser \(--reasoning-parser\).*'nah'"):
        validate_pipeline(_with_parsers(reasoning_parser="nah"))
    with pytest.raises(PipelineError, match="needs tool_call_parser"):
        validate_pipeline(_with_parsers(enable_auto_tool_choice=True))
