"""Sampling parameters on chat, against the scripted pipeline: every bad
value is a 400 naming it with nothing admitted, an engine that cannot
honour a parameter is named, logprobs and n > 1 render (live and from the
log) as OpenAI's.  Real vLLM values: test_engines_sampling.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from omnix.events.types import Admitted, Event, RequestEvent
from omnix.http.render import render_response, render_stream

from .conftest import parse_sse

pytestmark = pytest.mark.asyncio(loop_scope="session")

USER = [{"role": "user", "content": "hi"}]

BAD: dict[str, tuple[dict[str, Any], str, str]] = {
    "top_logprobs without logprobs": ({"top_logprobs": 2}, "top_logprobs", "invalid_value"),
    "top_logprobs over 20": (
        {"logprobs": True, "top_logprobs": 21},
        "top_logprobs",
        "invalid_value",
    ),
    "logprobs not a bool": ({"logprobs": "yes"}, "logprobs", "invalid_value"),
    "n of 0": ({"n": 0}, "n", "invalid_value"),
    "n with a batch": ({"n": 2, "messages": [USER, USER]}, "n", "unsupported_value"),
    "min_p over 1": ({"min_p": 2.0}, "min_p", "invalid_value"),
    "repetition_penalty of 0": ({"repetition_penalty": 0.0}, "repetition_penalty", "invalid_value"),
    "frequency_penalty over 2": ({"frequency_penalty": 3.0}, "frequency_penalty", "invalid_value"),
    "logit_bias key not a token id": ({"logit_bias": {"x": 1}}, "logit_bias", "invalid_value"),
    "logit_bias over 100": ({"logit_bias": {"1": 101}}, "logit_bias", "invalid_value"),
    "stop_token_ids negative": ({"stop_token_ids": [-1]}, "stop_token_ids", "invalid_value"),
    "min_tokens negative": ({"min_tokens": -1}, "min_tokens", "invalid_value"),
    # The log (and a trace) holds 64-bit integers: a larger one is refused, not recorded.
    "top_k past 32 bits": ({"top_k": 2**31}, "top_k", "invalid_value"),
    "stop_token_ids past 32 bits": ({"stop_token_ids": [2**31]}, "stop_token_ids", "invalid_value"),
    "a stage's top_k past 64 bits": (
        {"sampling_params_list": {"thinker": {"top_k": 2**70}}},
        "top_k",
        "invalid_value",
    ),
    "json_schema without its schema": (
        {"response_format": {"type": "json_schema"}},
        "response_format",
        "invalid_value",
    ),
    "response_format of another type": (
        {"response_format": {"type": "xml"}},
        "response_format",
        "invalid_value",
    ),
    # The scripted thinker honours logprobs only: the rest name the stage.
    "ignore_eos on a scripted stage": ({"ignore_eos": True}, "ignore_eos", "unsupported_parameter"),
    "json on a scripted stage": (
        {"response_format": {"type": "json_object"}},
        "response_format",
        "unsupported_parameter",
    ),
    "penalty on a scripted stage": (
        {"presence_penalty": 0.5},
        "presence_penalty",
        "unsupported_parameter",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
async def test_a_bad_sampling_value_is_400_naming_it_and_admits_nothing(omni_server, http, case):
    extra, param, code = BAD[case]
    before = len(omni_server.omni.log)
    body = {"messages": USER, **extra}
    async with http.post(omni_server.url + "/v1/chat/completions", json=body) as r:
        got = await r.json()
        assert r.status == 400, got
    err = got["error"]
    assert err["type"] == "invalid_request_error"
    # The param is the field, or the JSON path inside it (stop_token_ids[0]).
    assert err["param"].startswith(param) and err["code"] == code, err
    if code == "unsupported_parameter":
        assert "'thinker'" in err["message"], "the stage that cannot honour it is named"
    assert len(omni_server.omni.log) == before, "a refused request was admitted"


def _group_events(server: Any, start: int, group: str) -> list[Event]:
    return [
        ev
        for ev in server.omni.log.read(start)
        if isinstance(ev, RequestEvent)
        and (ev.request_id == group or ev.request_id.startswith(group + "-"))
    ]


async def test_logprobs_render_as_openai_and_from_the_log(omni_server, http):
    start = len(omni_server.omni.log)
    body = {"messages": USER, "logprobs": True, "top_logprobs": 2, "seed": 5}
    async with http.post(omni_server.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        raw = await r.read()
        rid = r.headers["X-Request-Id"]
    data = json.loads(raw)
    content = data["choices"][0]["logprobs"]["content"]
    assert len(content) == data["usage"]["completion_tokens"]
    assert all(t["logprob"] <= 0 and len(t["top_logprobs"]) == 2 for t in content)
    assert "".join(t["token"] for t in content) == data["choices"][0]["message"]["content"]
    (admitted,) = [ev for ev in omni_server.omni.log.read(start) if type(ev) is Admitted]
    assert admitted.request_id == rid
    assert render_response(omni_server.omni.log.events_for(rid), omni_server.omni.blobs).body == raw


async def test_logprobs_stream_with_each_delta(omni_server, http):
    body = {"messages": USER, "logprobs": True, "stream": True, "seed": 5}
    async with http.post(omni_server.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        raw = await r.read()
        rid = r.headers["X-Request-Id"]
    chunks = [json.loads(f["data"]) for f in parse_sse(raw) if f.get("data", "").startswith("{")]
    with_text = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert with_text and all(c["choices"][0]["logprobs"]["content"] for c in with_text)
    events = omni_server.omni.log.events_for(rid)
    assert b"".join(render_stream(events, omni_server.omni.blobs)) == raw


async def test_n_2_whole_and_streamed_are_two_choices_and_replay(omni_server, http):
    start = len(omni_server.omni.log)
    async with http.post(
        omni_server.url + "/v1/chat/completions", json={"messages": USER, "n": 2, "seed": 7}
    ) as r:
        assert r.status == 200, await r.text()
        whole = json.loads(await r.read())
    assert [c["index"] for c in whole["choices"]] == [0, 1]
    assert all(c["message"]["content"] for c in whole["choices"])
    start = len(omni_server.omni.log)
    body = {"messages": USER, "n": 2, "stream": True, "seed": 7}
    async with http.post(omni_server.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        raw = await r.read()
        group = r.headers["X-Request-Id"]
    chunks = [json.loads(f["data"]) for f in parse_sse(raw) if f.get("data", "").startswith("{")]
    finished = {
        c["choices"][0]["index"]
        for c in chunks
        if c["choices"] and c["choices"][0]["finish_reason"]
    }
    assert finished == {0, 1}
    events = _group_events(omni_server, start, group)
    assert len({ev.request_id for ev in events}) == 2, "n=2 is two requests"
    assert b"".join(render_stream(events, omni_server.omni.blobs)) == raw


async def test_tokenize_is_404_on_a_pipeline_without_a_tokenizer(omni_server, http):
    async with http.post(omni_server.url + "/tokenize", json={"prompt": "hi"}) as r:
        err = (await r.json())["error"]
        assert r.status == 404
    assert err["code"] == "tokenizer_unavailable" and "'thinker'" in err["message"]
