"""``POST /v1/completions`` without a model: bad bodies are 400s naming the
field with nothing admitted; a pipeline whose text stage is not vLLM
refuses the route (and does not publish it); the plan records a raw
prompt (token ids as given) that the dispatcher hands to the engine raw;
the legacy ``text_completion`` shape (echo, logprobs, n > 1, streams)
renders from the log alone.  Real vLLM: test_engines_sampling.py."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from omnix.events.options import RawPrompt, group_of
from omnix.events.types import Admitted, Chunk, Event, Finished, StageFinished, TokenLogprob
from omnix.http.chat.plan import chat_plan
from omnix.http.chat.protocol import ChatCompletionRequest
from omnix.http.common.plan import Plan, PlanContext
from omnix.http.completions.plan import completion_plan
from omnix.http.completions.protocol import CompletionRequest
from omnix.http.core.errors import ApiError
from omnix.http.openapi import OpenApi
from omnix.http.render import GroupStreamRenderer, render_response, render_stream
from omnix.orchestrator.dispatch import _source_piece
from omnix.pipelines.validate import load_pipeline

from .conftest import parse_sse

_on_session_loop = pytest.mark.asyncio(loop_scope="session")

_decode = msgspec.json.Decoder(CompletionRequest)


def _served(name: str = "tiny-text") -> PlanContext:
    ids = iter(range(10**6))
    return PlanContext(
        load_pipeline(name), new_request_id=lambda: f"r{next(ids)}", new_seed=lambda: 11
    )


def _plan(body: dict[str, Any], tokenizer: Any = None, name: str = "tiny-text") -> Plan:
    return completion_plan(_decode.decode(json.dumps(body)), _served(name), tokenizer=tokenizer)


class _Tok:
    """A stand-in tokenizer: 100 ids, id i decodes to ``<i>``."""

    def __len__(self) -> int:
        return 100

    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)


# -- over HTTP, on the scripted pipeline ----------------------------------------------

DECODE_BAD: dict[str, tuple[dict[str, Any], str]] = {
    "logprobs over 5": ({"prompt": "hi", "logprobs": 6}, "logprobs"),
    "logprobs negative": ({"prompt": "hi", "logprobs": -1}, "logprobs"),
    "logprobs a bool": ({"prompt": "hi", "logprobs": True}, "logprobs"),
    "n of 0": ({"prompt": "hi", "n": 0}, "n"),
    "max_tokens of 0": ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    "temperature over 2": ({"prompt": "hi", "temperature": 3}, "temperature"),
    "an empty prompt list": ({"prompt": []}, "prompt"),
    "a negative token id": ({"prompt": [1, -2]}, "prompt"),
    "a prompt of another type": ({"prompt": {"text": "hi"}}, "prompt"),
    "no prompt": ({"max_tokens": 3}, "prompt"),
    "an unknown field": ({"prompt": "hi", "frobnicate": 1}, "frobnicate"),
    "best_of of 0": ({"prompt": "hi", "best_of": 0}, "best_of"),
}


@_on_session_loop
@pytest.mark.parametrize("case", list(DECODE_BAD))
async def test_a_bad_body_is_400_naming_the_field_and_admits_nothing(omni_server, http, case):
    body, param = DECODE_BAD[case]
    before = len(omni_server.omni.log)
    async with http.post(omni_server.url + "/v1/completions", json=body) as r:
        got = await r.json()
        assert r.status == 400, got
    err = got["error"]
    assert err["type"] == "invalid_request_error"
    # A missing field has no param: the message names it.
    assert (err["param"] or "").startswith(param) or f"`{param}`" in err["message"], err
    assert len(omni_server.omni.log) == before, "a refused request was admitted"


@_on_session_loop
async def test_a_scripted_text_stage_refuses_the_route_and_does_not_publish_it(omni_server, http):
    before = len(omni_server.omni.log)
    async with http.post(omni_server.url + "/v1/completions", json={"prompt": "hi"}) as r:
        err = (await r.json())["error"]
        assert r.status == 400, err
    assert err["code"] == "unsupported_parameter" and err["param"] == "prompt"
    assert "'thinker'" in err["message"] and "scripted" in err["message"]
    assert len(omni_server.omni.log) == before
    assert not omni_server.state.openapi.published("/v1/completions")
    async with http.get(omni_server.url + "/openapi.json") as r:
        doc = await r.json()
    assert "/v1/completions" not in doc["paths"]


def test_a_vllm_text_stage_publishes_the_route():
    for name in ("tiny-text", "tiny-omni"):
        api = OpenApi(load_pipeline(name), max_batch=8)
        assert api.published("/v1/completions")
        doc = api.document()
        assert "/v1/completions" in doc["paths"]
        props = doc["components"]["schemas"]["CompletionRequest"]["properties"]
        assert props["model"]["enum"] == ["", name]
    assert not OpenApi(load_pipeline("tiny-tts"), max_batch=8).published("/v1/completions")


# -- the plan (a vLLM pipeline's config; no engine runs) ------------------------------

PLAN_BAD: dict[str, tuple[dict[str, Any], str, str]] = {
    "suffix": ({"prompt": "hi", "suffix": "end"}, "suffix", "unsupported_parameter"),
    "best_of 2": ({"prompt": "hi", "best_of": 2}, "best_of", "unsupported_value"),
    "echo with logprobs": (
        {"prompt": "hi", "echo": True, "logprobs": 1},
        "echo",
        "unsupported_value",
    ),
    "a mixed prompt": ({"prompt": ["hi", 3]}, "prompt", "invalid_value"),
    "a streamed batch": ({"prompt": ["a", "b"], "stream": True}, "stream", "unsupported_value"),
    "n with a batch": ({"prompt": ["a", "b"], "n": 2}, "n", "unsupported_value"),
    "a resumable n": (
        {"prompt": "a", "n": 2, "stream": True, "stream_options": {"resumable": True}},
        "stream_options",
        "unsupported_value",
    ),
    "stream_options unstreamed": (
        {"prompt": "a", "stream_options": {"include_usage": True}},
        "stream_options",
        "invalid_value",
    ),
    "an empty string": ({"prompt": ""}, "prompt", "invalid_value"),
    "an empty string in a batch": ({"prompt": ["a", ""]}, "prompt[1]", "invalid_value"),
    "a token id past the vocabulary": ({"prompt": [1, 100]}, "prompt", "invalid_value"),
    "logit_bias key not a token id": (
        {"prompt": "a", "logit_bias": {"x": 1}},
        "logit_bias",
        "invalid_value",
    ),
    "another model": ({"prompt": "a", "model": "gpt-4"}, "model", "model_not_found"),
}


@pytest.mark.parametrize("case", list(PLAN_BAD))
def test_a_bad_value_is_refused_by_the_plan(case):
    body, param, code = PLAN_BAD[case]
    with pytest.raises(ApiError) as exc:
        _plan(body, tokenizer=_Tok())
    assert exc.value.param == param and exc.value.code == code, exc.value


def test_token_ids_need_the_tokenizer():
    with pytest.raises(ApiError) as exc:
        _plan({"prompt": [1, 2]})
    assert exc.value.param == "prompt" and "tokenizer" in str(exc.value)


def test_the_plan_records_a_raw_prompt_and_the_shared_sampling_fields():
    ((_, spec),) = _plan(
        {"prompt": "Once upon", "logprobs": 3, "ignore_eos": True, "top_k": 4, "stop": "x"}
    ).specs
    assert spec.api == "completions" and spec.prompt == "Once upon" and not spec.messages
    assert spec.raw_prompt == RawPrompt() and not spec.raw_prompt.token_ids
    p = spec.stage_params["thinker"]
    # completions' default max_tokens (vLLM's and OpenAI's), logprobs as given
    assert (p.max_tokens, p.logprobs, p.ignore_eos, p.top_k, p.stop) == (16, 3, True, 4, ("x",))
    ((_, ids_spec),) = _plan({"prompt": [5, 6], "max_tokens": 3}, tokenizer=_Tok()).specs
    assert ids_spec.prompt == "<5><6>"
    assert ids_spec.raw_prompt is not None and list(ids_spec.raw_prompt.token_ids) == [5, 6]
    batch = _plan({"prompt": [[1], [2, 3]], "max_tokens": 3}, tokenizer=_Tok()).specs
    assert [s.prompt for _, s in batch] == ["<1>", "<2><3>"]
    assert [getattr(group_of(s.response), "index", None) for _, s in batch] == [0, 1]
    n2 = _plan({"prompt": "a", "n": 2, "stream": True}).specs
    assert [s.seed for _, s in n2] == [11, 12]
    group = group_of(n2[0][1].response)
    assert group is not None and group.streamed and group.samples


def test_the_dispatcher_hands_the_prompt_over_raw():
    ((_, spec),) = _plan({"prompt": "Once"}).specs
    piece = _source_piece(spec, ())
    assert piece.raw and piece.text == "Once" and not piece.messages and not piece.token_ids
    ((_, ids_spec),) = _plan({"prompt": [7, 8]}, tokenizer=_Tok()).specs
    assert _source_piece(ids_spec, ()).token_ids == (7, 8)
    ((_, chat),) = chat_plan(
        msgspec.json.decode(
            b'{"messages": [{"role": "user", "content": "hi"}]}', type=ChatCompletionRequest
        ),
        _served(),
    ).specs
    assert not _source_piece(chat, ()).raw


def test_a_non_vllm_text_stage_is_named():
    with pytest.raises(ApiError) as exc:
        _plan({"prompt": "hi"}, name="tiny-tts")
    assert exc.value.status == 400


# -- rendering from the log ------------------------------------------------------------


def _events(
    rid: str, spec: Any, pieces: list[tuple[str, tuple[TokenLogprob, ...]]], pos: int = 0
) -> list[Event]:
    evs: list[Event] = [
        Admitted(request_id=rid, pipeline="tiny-text", spec=spec, pos=pos, ts_ns=2 * 10**9)
    ]
    for i, (text, lps) in enumerate(pieces):
        evs.append(
            Chunk(
                request_id=rid,
                stage="thinker",
                replica=0,
                index=i,
                modality="text",
                text=text,
                token_ids=tuple(range(len(lps))),
                logprobs=lps,
                pos=pos + 1 + i,
            )
        )
    k = pos + 1 + len(pieces)
    evs.append(
        StageFinished(
            request_id=rid,
            stage="thinker",
            replica=0,
            chunks=len(pieces),
            finish_reason="length",
            prompt_tokens=4,
            output_tokens=3,
            pos=k,
        )
    )
    evs.append(Finished(request_id=rid, pos=k + 1))
    return evs


LPS = [
    (
        "ab",
        (
            TokenLogprob("a", -0.5, (("a", -0.5), ("b", -1.0))),
            TokenLogprob("b", -2.0, (("c", -0.1), ("b", -2.0))),
        ),
    ),
    ("c", (TokenLogprob("c", -0.25, (("c", -0.25), ("d", -3.0))),)),
]


def test_whole_with_logprobs_is_the_legacy_shape():
    ((rid, spec),) = _plan({"prompt": "Hi", "logprobs": 2, "max_tokens": 3}).specs
    r = render_response(_events(rid, spec, LPS), blobs=None)  # type: ignore[arg-type]
    data = json.loads(r.body)
    assert data["id"] == f"cmpl-{rid}" and data["object"] == "text_completion"
    assert data["created"] == 2 and data["model"] == "tiny-text"
    (choice,) = data["choices"]
    assert (choice["index"], choice["text"], choice["finish_reason"]) == (0, "abc", "length")
    assert choice["logprobs"] == {
        "text_offset": [0, 1, 2],
        "token_logprobs": [-0.5, -2.0, -0.25],
        "tokens": ["a", "b", "c"],
        "top_logprobs": [{"a": -0.5, "b": -1.0}, {"b": -2.0, "c": -0.1}, {"c": -0.25, "d": -3.0}],
    }
    assert data["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


def test_echo_starts_the_text_whole_and_streamed():
    ((rid, spec),) = _plan({"prompt": "Hi ", "echo": True}).specs
    data = json.loads(render_response(_events(rid, spec, [("ab", ()), ("c", ())]), None).body)  # type: ignore[arg-type]
    assert data["choices"][0]["text"] == "Hi abc" and data["choices"][0]["logprobs"] is None
    ((rid, spec),) = _plan(
        {"prompt": "Hi ", "echo": True, "stream": True, "stream_options": {"include_usage": True}}
    ).specs
    body = b"".join(render_stream(_events(rid, spec, [("ab", ()), ("c", ())]), None))  # type: ignore[arg-type]
    frames = parse_sse(body)
    assert all("id" not in f for f in frames), "no id: lines unless resumable"
    assert frames[-1]["data"] == "[DONE]"
    chunks = [json.loads(f["data"]) for f in frames[:-1]]
    assert all(c["object"] == "text_completion" and c["id"] == f"cmpl-{rid}" for c in chunks)
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert texts == ["Hi ab", "c", ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]] == [
        None,
        None,
        "length",
    ]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 7


def test_streamed_logprobs_offsets_run_on_and_resumable_streams_carry_ids():
    ((rid, spec),) = _plan(
        {"prompt": "x", "logprobs": 1, "stream": True, "stream_options": {"resumable": True}}
    ).specs
    body = b"".join(render_stream(_events(rid, spec, LPS), None))  # type: ignore[arg-type]
    frames = parse_sse(body)
    assert all("id" in f for f in frames[:-1])
    chunks = [json.loads(f["data"]) for f in frames[:-1]]
    offsets = [
        c["choices"][0]["logprobs"]["text_offset"] for c in chunks if c["choices"][0]["logprobs"]
    ]
    assert offsets == [[0, 1], [2]]


def test_n_2_streams_as_one_response_and_whole_counts_the_prompt_once():
    specs = _plan(
        {"prompt": "x", "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    ).specs
    (r0, s0), (r1, s1) = specs
    evs = sorted(
        _events(r0, s0, [("a", ())], pos=0) + _events(r1, s1, [("b", ())], pos=100),
        key=lambda e: e.pos,
    )
    g = GroupStreamRenderer(None)  # type: ignore[arg-type]
    body = b"".join(p for ev in evs for p in g.feed(ev))
    assert g.done and body == b"".join(render_stream(evs, None))  # type: ignore[arg-type]
    chunks = [json.loads(f["data"]) for f in parse_sse(body)[:-1]]
    assert {c["choices"][0]["index"] for c in chunks if c["choices"]} == {0, 1}
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}
    specs = _plan({"prompt": "x", "n": 2}).specs
    (r0, s0), (r1, s1) = specs
    evs = _events(r0, s0, [("a", ())], pos=0) + _events(r1, s1, [("b", ())], pos=100)
    data = json.loads(render_response(evs, None).body)  # type: ignore[arg-type]
    assert [c["text"] for c in data["choices"]] == ["a", "b"]
    assert data["usage"]["prompt_tokens"] == 4 and data["request_ids"] == [r0, r1]
