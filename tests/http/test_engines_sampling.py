"""vLLM's sampling extras on ``tiny-text``'s real engine, through the
official ``openai`` client: logprobs are vLLM's (and in the log), a
json_schema answer parses against its schema, ``n`` = 2 streamed and not,
``ignore_eos`` + ``min_tokens`` honoured; and vLLM's own ``vllm bench
serve --backend openai-chat`` against the live server fails no request."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from omnix.events.types import Chunk
from omnix.http.render import render_response

from .conftest import real_engine_marks

PIPELINE = "tiny-text"
pytestmark = real_engine_marks()

USER = [{"role": "user", "content": "Tell me about the sea."}]


async def test_logprobs_are_vllms_and_in_the_log(server, client):
    resp = await client.chat.completions.create(
        model=PIPELINE, messages=USER, seed=3, max_tokens=8, logprobs=True, top_logprobs=3
    )
    content = resp.choices[0].logprobs.content
    assert content and len(content) == resp.usage.completion_tokens
    for tok in content:
        assert tok.logprob <= 0.0 and len(tok.top_logprobs) == 3
        assert all(t.logprob <= 0.0 for t in tok.top_logprobs)
        assert tok.bytes == list(tok.token.encode("utf-8", errors="replace"))
    rid = resp.id.removeprefix("chatcmpl-")
    logged = [
        lp for e in server.omni.log.events_for(rid) if isinstance(e, Chunk) for lp in e.logprobs
    ]
    assert [lp.logprob for lp in logged] == [t.logprob for t in content]


async def test_json_schema_answer_parses_against_its_schema(server, client, http):
    schema = {
        "type": "object",
        # Bounded values: a random-weight model must still reach the end.
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    body = {
        "messages": USER,
        "seed": 1,
        "max_tokens": 200,
        "logprobs": True,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema},
        },
    }
    async with http.post(server.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        raw = await r.read()
        rid = r.headers["X-Request-Id"]
    data = json.loads(raw)
    assert data["choices"][0]["finish_reason"] == "stop", data["choices"][0]["message"]["content"]
    answer = json.loads(data["choices"][0]["message"]["content"])
    assert isinstance(answer["name"], str) and len(answer["name"]) <= 8
    assert isinstance(answer["age"], int) and 0 <= answer["age"] <= 120
    # Replay: the log renders the very bytes the client received.
    assert render_response(server.omni.log.events_for(rid), server.omni.blobs).body == raw
    # json_object bounds nothing: a random-weight model may write one long
    # key until max_tokens. What it wrote is still the start of an object,
    # and an answer that ended by itself parses.
    obj = await client.chat.completions.create(
        model=PIPELINE, messages=USER, max_tokens=100, response_format={"type": "json_object"}
    )
    content = obj.choices[0].message.content or ""
    assert content.startswith("{")
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


async def test_n_2_streamed_and_not(server, client):
    resp = await client.chat.completions.create(
        model=PIPELINE, messages=USER, n=2, max_tokens=6, temperature=1.0, seed=4
    )
    assert [c.index for c in resp.choices] == [0, 1]
    assert all(c.message.content for c in resp.choices)
    # Seeded as the first: unseeded, the tiny model may sample EOS first
    # and leave a choice empty.  The same seed, the same two answers.
    stream = await client.chat.completions.create(
        model=PIPELINE,
        messages=USER,
        n=2,
        max_tokens=6,
        temperature=1.0,
        seed=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts: dict[int, str] = {0: "", 1: ""}
    finished = set()
    usage = None
    async for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
        usage = chunk.usage or usage
    assert finished == {0, 1}
    assert [texts[0], texts[1]] == [c.message.content for c in resp.choices]
    assert usage is not None and usage.completion_tokens == resp.usage.completion_tokens


async def test_ignore_eos_and_min_tokens_are_honoured(server, client):
    resp = await client.chat.completions.create(
        model=PIPELINE,
        messages=USER,
        max_tokens=20,
        seed=2,
        extra_body={
            "ignore_eos": True,
            "min_tokens": 20,
            "repetition_penalty": 1.1,
            "top_k": 5,
            "min_p": 0.01,
            "stop_token_ids": [],
            "skip_special_tokens": True,
        },
        frequency_penalty=0.2,
        presence_penalty=0.1,
        logit_bias={"5": 1.0},
    )
    assert resp.usage.completion_tokens == 20
    assert resp.choices[0].finish_reason == "length"


async def test_tokenize_and_detokenize_agree_with_the_engine(server, client, http):
    async with http.post(server.url + "/tokenize", json={"messages": USER}) as r:
        assert r.status == 200, await r.text()
        tokens = await r.json()
    assert tokens["max_model_len"] == 512
    resp = await client.chat.completions.create(model=PIPELINE, messages=USER, max_tokens=2)
    assert tokens["count"] == len(tokens["tokens"]) == resp.usage.prompt_tokens
    async with http.post(
        server.url + "/tokenize", json={"prompt": "the sea", "return_token_strs": True}
    ) as r:
        plain = await r.json()
    assert len(plain["token_strs"]) == plain["count"]
    async with http.post(server.url + "/detokenize", json={"tokens": plain["tokens"]}) as r:
        assert (await r.json())["prompt"] == "the sea"
    async with http.post(server.url + "/detokenize", json={"tokens": [10**6]}) as r:
        assert r.status == 400 and (await r.json())["error"]["param"] == "tokens"


async def test_a_prompt_or_budget_over_the_context_is_400_before_admission(server, http):
    before = len(server.omni.log)
    long = [{"role": "user", "content": "the sea " * 400}]
    async with http.post(server.url + "/v1/chat/completions", json={"messages": long}) as r:
        err = (await r.json())["error"]
        assert r.status == 400, err
    assert (err["code"], err["param"]) == ("context_length_exceeded", "messages")
    assert "maximum context length is 512 tokens" in err["message"]
    body = {"messages": USER, "max_tokens": 600}
    async with http.post(server.url + "/v1/chat/completions", json=body) as r:
        err = (await r.json())["error"]
        assert r.status == 400, err
    assert (err["code"], err["param"]) == ("context_length_exceeded", "max_tokens")
    assert len(server.omni.log) == before, "a refused request was admitted"


# -- /v1/completions ---------------------------------------------------------------------

PROMPT = "The sea is"


async def _tokenize(http, url: str, **body) -> list[int]:
    async with http.post(url + "/tokenize", json=body) as r:
        assert r.status == 200, await r.text()
        return (await r.json())["tokens"]


async def test_completion_prompt_is_raw_as_text_and_as_token_ids(server, client, http):
    raw_ids = await _tokenize(http, server.url, prompt=PROMPT)
    chat_ids = await _tokenize(http, server.url, messages=[{"role": "user", "content": PROMPT}])
    assert len(raw_ids) != len(chat_ids)
    text = await client.completions.create(
        model=PIPELINE, prompt=PROMPT, max_tokens=6, temperature=0
    )
    assert text.object == "text_completion" and text.id.startswith("cmpl-")
    # The engine saw the prompt raw: no chat template around it.
    assert text.usage.prompt_tokens == len(raw_ids)
    assert text.choices[0].text and text.choices[0].finish_reason in ("stop", "length")
    ids = await client.completions.create(
        model=PIPELINE, prompt=raw_ids, max_tokens=6, temperature=0
    )
    assert ids.usage.prompt_tokens == len(raw_ids)
    assert ids.choices[0].text == text.choices[0].text
    # A batch of prompts (strings, or id lists): one choice each, in order.
    for prompt in ([PROMPT, PROMPT], [raw_ids, raw_ids]):
        batch = await client.completions.create(
            model=PIPELINE, prompt=prompt, max_tokens=6, temperature=0
        )
        assert [c.index for c in batch.choices] == [0, 1]
        assert [c.text for c in batch.choices] == [text.choices[0].text] * 2
        assert batch.usage.prompt_tokens == 2 * len(raw_ids)
    # The prompt-length check counts it raw too.
    async with http.post(server.url + "/v1/completions", json={"prompt": raw_ids * 200}) as r:
        err = (await r.json())["error"]
        assert r.status == 400 and err["code"] == "context_length_exceeded", err


async def test_completion_streams_echoes_and_samples_n_2(server, client):
    whole = await client.completions.create(
        model=PIPELINE, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=9
    )
    stream = await client.completions.create(
        model=PIPELINE,
        prompt=PROMPT,
        max_tokens=8,
        temperature=1.0,
        seed=9,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage, finish = "", None, None
    async for chunk in stream:
        assert chunk.object == "text_completion"
        for c in chunk.choices:
            text += c.text
            finish = c.finish_reason or finish
        usage = chunk.usage or usage
    assert text == whole.choices[0].text and finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    echo = await client.completions.create(
        model=PIPELINE, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=9, echo=True
    )
    assert echo.choices[0].text == PROMPT + whole.choices[0].text
    n2 = await client.completions.create(
        model=PIPELINE, prompt=PROMPT, max_tokens=6, temperature=1.0, seed=4, n=2
    )
    assert [c.index for c in n2.choices] == [0, 1] and all(c.text for c in n2.choices)
    streamed = await client.completions.create(
        model=PIPELINE, prompt=PROMPT, max_tokens=6, n=2, stream=True
    )
    texts: dict[int, str] = {0: "", 1: ""}
    async for chunk in streamed:
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts[0] and texts[1]


async def test_completion_logprobs_are_vllms_and_replay_renders_the_same_bytes(
    server, client, http
):
    for k in (0, 3):
        resp = await client.completions.create(
            model=PIPELINE, prompt=PROMPT, max_tokens=8, seed=3, logprobs=k
        )
        lp = resp.choices[0].logprobs
        assert lp is not None and len(lp.tokens) == resp.usage.completion_tokens
        assert all(v <= 0.0 for v in lp.token_logprobs)
        for tok, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
            # the token itself, then the k most likely (a dict, as vLLM's: one
            # key per text, so two tokens that decode alike share one)
            assert tok in top and 1 <= len(top) <= k + 1
            assert max(top.values()) >= v - 1e-6 or k == 0
        assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
        rid = resp.id.removeprefix("cmpl-")
        logged = [
            x for e in server.omni.log.events_for(rid) if isinstance(e, Chunk) for x in e.logprobs
        ]
        assert [x.logprob for x in logged] == lp.token_logprobs
    for stream in (False, True):
        body = {"prompt": PROMPT, "max_tokens": 8, "seed": 5, "logprobs": 2, "stream": stream}
        async with http.post(server.url + "/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            raw = await r.read()
            rid = r.headers["X-Request-Id"]
        events = server.omni.log.events_for(rid)
        assert render_response(events, server.omni.blobs).body == raw
        if stream:
            assert b"\nid:" not in raw and not raw.startswith(b"id:")
            assert raw.endswith(b"data: [DONE]\n\n")


#: A ShareGPT-shaped dataset (vLLM's ``--dataset-name sharegpt`` format).
_SHAREGPT = [
    {
        "id": f"c{i}",
        "conversations": [
            {
                "from": "human",
                "value": f"Question {i}: what do you know about the sea and its tides?",
            },
            {
                "from": "gpt",
                "value": "The sea rises and falls twice a day with the pull of the moon.",
            },
        ],
    }
    for i in range(12)
]


@pytest.mark.parametrize(
    ("backend", "endpoint", "dataset"),
    [
        ("openai-chat", "/v1/chat/completions", "random"),
        ("openai", "/v1/completions", "random"),
        ("openai-chat", "/v1/chat/completions", "sharegpt"),
        ("openai", "/v1/completions", "sharegpt"),
    ],
)
async def test_vllm_bench_serve_fails_no_request(server, tmp_path, backend, endpoint, dataset):
    """vLLM's own benchmark client against the live server (through the
    CLI shim): every request completes."""
    from omnix.models.paths import resolve_model

    if dataset == "random":
        data = ["--random-input-len", "16", "--random-output-len", "8"]
    else:
        path = tmp_path / "sharegpt.json"
        path.write_text(json.dumps(_SHAREGPT))
        data = ["--dataset-path", str(path), "--sharegpt-output-len", "8"]
    result = tmp_path / "bench.json"
    cmd = [
        sys.executable, "-m", "omnix.bench.vllm_bench", "serve",
        "--backend", backend, "--base-url", server.url, "--endpoint", endpoint, "--model", PIPELINE,
        "--tokenizer", str(resolve_model("thinker")), "--dataset-name", dataset, *data,
        "--num-prompts", "8", "--max-concurrency", "4",
        "--save-result", "--result-dir", str(tmp_path), "--result-filename", result.name,
        "--disable-tqdm",
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 600)
    assert proc.returncode == 0, out.decode()[-4000:]
    res = json.loads(result.read_text())
    assert res["completed"] == 8, out.decode()[-4000:]
    assert res.get("failed", 0) == 0, out.decode()[-4000:]
    assert res["total_output_tokens"] > 0, out.decode()[-4000:]
