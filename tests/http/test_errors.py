"""Bad input, auth, readiness and shutdown: the right status, OpenAI's error
body, and nothing appended to the log for a request that was not admitted."""

from __future__ import annotations

import asyncio
import json

import pytest

from omnix.api import Omni
from omnix.http.app import HttpServer
from omnix.pipelines.validate import parse_pipeline

from .conftest import API_KEY, IMAGE, MAX_BODY

pytestmark = pytest.mark.asyncio(loop_scope="session")

USER = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return json.dumps({"messages": USER, **fields}).encode()


# (name, method, path, raw body, status, error param, error code)
# fmt: off
BAD = [
    ("malformed json", "POST", "/v1/chat/completions", b'{"messages": [', 400, None, "invalid_json"),
    ("empty body", "POST", "/v1/chat/completions", b"", 400, None, "invalid_json"),
    ("body not an object", "POST", "/v1/chat/completions", b"[1, 2]", 400, None, "invalid_value"),
    ("messages wrong type", "POST", "/v1/chat/completions", b'{"messages": "hi"}', 400, "messages", "invalid_value"),
    ("messages missing", "POST", "/v1/chat/completions", b'{"model": "http-omni"}', 400, None, "invalid_value"),
    ("messages empty", "POST", "/v1/chat/completions", b'{"messages": []}', 400, "messages", "invalid_value"),
    ("user content null", "POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": null}]}', 400, "messages[0].content", "invalid_value"),
    ("system content missing", "POST", "/v1/chat/completions", b'{"messages": [{"role": "system"}, {"role": "user", "content": "x"}]}', 400, "messages[0].content", "invalid_value"),
    ("batch member content null", "POST", "/v1/chat/completions", json.dumps({"messages": [USER, [{"role": "user", "content": None}]]}).encode(), 400, "messages[1][0].content", "invalid_value"),
    ("conversation empty", "POST", "/v1/chat/completions", b'{"messages": [[]]}', 400, "messages[0]", "invalid_value"),
    ("mixed batch", "POST", "/v1/chat/completions", json.dumps({"messages": [USER, USER[0]]}).encode(), 400, "messages", "invalid_value"),
    ("bad role", "POST", "/v1/chat/completions", b'{"messages": [{"role": "robot", "content": "x"}]}', 400, "messages[0].role", "invalid_value"),
    ("unknown field", "POST", "/v1/chat/completions", chat(frobnicate=True), 400, "frobnicate", "unknown_field"),
    ("temperature too high", "POST", "/v1/chat/completions", chat(temperature=2.5), 400, "temperature", "invalid_value"),
    ("temperature as string", "POST", "/v1/chat/completions", chat(temperature="hot"), 400, "temperature", "invalid_value"),
    ("top_p zero", "POST", "/v1/chat/completions", chat(top_p=0), 400, "top_p", "invalid_value"),
    ("max_tokens zero", "POST", "/v1/chat/completions", chat(max_tokens=0), 400, "max_tokens", "invalid_value"),
    ("negative seed", "POST", "/v1/chat/completions", chat(seed=-1), 400, "seed", "invalid_value"),
    ("n streamed with audio", "POST", "/v1/chat/completions", chat(n=2, stream=True, modalities=["text", "audio"]), 400, "n", "unsupported_value"),
    ("n zero", "POST", "/v1/chat/completions", chat(n=0), 400, "n", "invalid_value"),
    ("stream_options without stream", "POST", "/v1/chat/completions", chat(stream_options={"include_usage": True}), 400, "stream_options", "invalid_value"),
    ("unknown modality", "POST", "/v1/chat/completions", chat(modalities=["video"]), 400, "modalities[0]", "invalid_value"),
    ("audio without modality", "POST", "/v1/chat/completions", chat(audio={"format": "wav", "voice": "x"}), 400, "audio", "invalid_value"),
    ("bad audio format", "POST", "/v1/chat/completions", chat(modalities=["text", "audio"], audio={"format": "ogg"}), 400, "audio.format", "invalid_value"),
    ("streamed batch", "POST", "/v1/chat/completions", json.dumps({"messages": [USER, USER], "stream": True}).encode(), 400, "stream", "unsupported_value"),
    ("tools on a scripted stage", "POST", "/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools", "unsupported_parameter"),
    ("tool_choice without tools", "POST", "/v1/chat/completions", chat(tool_choice="required"), 400, "tool_choice", "invalid_value"),
    ("functions", "POST", "/v1/chat/completions", chat(functions=[{"name": "f"}]), 400, "functions", "unsupported_parameter"),
    ("penalty", "POST", "/v1/chat/completions", chat(presence_penalty=1.0), 400, "presence_penalty", "unsupported_parameter"),
    ("json response format", "POST", "/v1/chat/completions", chat(response_format={"type": "json_object"}), 400, "response_format", "unsupported_parameter"),
    ("image input", "POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]}).encode(), 400, "messages[0].content[0]", "unsupported_input"),
    ("unknown model", "POST", "/v1/chat/completions", chat(model="gpt-9"), 404, "model", "model_not_found"),
    ("params list too short", "POST", "/v1/chat/completions", chat(sampling_params_list=[{"temperature": 0.1}]), 400, "sampling_params_list", "invalid_value"),
    ("params for unknown stage", "POST", "/v1/chat/completions", chat(sampling_params_list={"vocoder": {"temperature": 0.1}}), 400, "sampling_params_list", "invalid_value"),
    ("unknown stage param", "POST", "/v1/chat/completions", chat(sampling_params_list={"thinker": {"temp": 0.1}}), 400, "sampling_params_list[...].temp", "unknown_field"),
    ("stage param out of range", "POST", "/v1/chat/completions", chat(sampling_params_list={"talker": {"top_p": 3}}), 400, "top_p", "invalid_value"),
    ("modality the pipeline lacks", "POST", "/v1/images/generations", b'{"prompt": "a cat"}', 400, "modalities", "unsupported_modality"),
    ("speech without input", "POST", "/v1/audio/speech", b'{"voice": "x"}', 400, None, "invalid_value"),
    ("speech empty input", "POST", "/v1/audio/speech", b'{"input": ""}', 400, "input", "invalid_value"),
    ("speech speed", "POST", "/v1/audio/speech", b'{"input": "hi", "speed": 10}', 400, "speed", "invalid_value"),
    ("speech format", "POST", "/v1/audio/speech", b'{"input": "hi", "response_format": "ogg"}', 400, "response_format", "invalid_value"),
    ("speech stream format", "POST", "/v1/audio/speech", b'{"input": "hi", "stream_format": "websocket"}', 400, "stream_format", "invalid_value"),
    ("no such route", "POST", "/v1/embeddings", chat(), 404, None, "not_found"),
    ("wrong method", "GET", "/v1/chat/completions", None, 405, None, "method_not_allowed"),
    ("body too large", "POST", "/v1/chat/completions", chat(pad="x" * (MAX_BODY + 1)), 413, None, "request_entity_too_large"),
    ("unknown request", "GET", "/v1/requests/req-nope", None, 404, "id", "request_not_found"),
    ("cancel unknown request", "POST", "/v1/requests/req-nope/cancel", None, 404, "id", "request_not_found"),
    ("events of unknown request", "GET", "/v1/requests/req-nope/events", None, 404, "id", "request_not_found"),
    ("trace of unknown request", "GET", "/v1/requests/req-nope/trace", None, 404, "id", "request_not_found"),
]

IMAGE_BAD = [
    ("url format", {"prompt": "x", "response_format": "url"}, 400, "response_format", "unsupported_value"),
    ("size not WxH", {"prompt": "x", "size": "big"}, 400, "size", "invalid_value"),
    ("size not multiple of 8", {"prompt": "x", "size": "65x64"}, 400, "size", "invalid_value"),
    ("n too large", {"prompt": "x", "n": 100}, 400, "n", "invalid_value"),
    ("steps disagree", {"prompt": "x", "steps": 3, "num_inference_steps": 4}, 400, "steps", "invalid_value"),
    ("chat on an image pipeline", None, 400, "modalities", "unsupported_modality"),
]
# fmt: on


def assert_error(body: dict, status: int, param: str | None, code: str | None) -> None:
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and len(err["message"]) > 10
    assert (
        err["type"]
        == {
            400: "invalid_request_error",
            404: "not_found_error",
            405: "invalid_request_error",
            413: "invalid_request_error",
            415: "invalid_request_error",
        }[status]
    )
    assert err["param"] == param
    assert err["code"] == code


@pytest.mark.parametrize(
    ("name", "method", "path", "body", "status", "param", "code"), BAD, ids=[b[0] for b in BAD]
)
async def test_bad_request_is_answered_and_appends_nothing(
    omni_server, http, name, method, path, body, status, param, code
):
    before = len(omni_server.omni.log)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    async with http.request(method, omni_server.url + path, data=body, headers=headers) as r:
        assert r.status == status, await r.text()
        assert r.content_type == "application/json"
        assert_error(await r.json(), status, param, code)
        if status == 405:
            assert "POST" in r.headers["Allow"]
    assert len(omni_server.omni.log) == before


@pytest.mark.parametrize(
    ("name", "body", "status", "param", "code"), IMAGE_BAD, ids=[b[0] for b in IMAGE_BAD]
)
async def test_bad_image_request(image_server, http, name, body, status, param, code):
    before = len(image_server.omni.log)
    path = "/v1/images/generations" if body is not None else "/v1/chat/completions"
    async with http.post(image_server.url + path, json=body or {"messages": USER}) as r:
        assert r.status == status, await r.text()
        assert_error(await r.json(), status, param, code)
    assert len(image_server.omni.log) == before


async def test_api_key_is_required_on_every_route_but_the_probes(key_server, http):
    url = key_server.url
    # Liveness and readiness probes (Kubernetes') carry no key, as vLLM's don't.
    async with http.get(url + "/health") as r:
        assert r.status == 200
    async with http.get(url + "/ready") as r:
        assert r.status == 200
        assert (await r.json())["ready"] is True
    for method, path in [
        ("GET", "/v1/models"),
        ("GET", "/openapi.json"),
        ("POST", "/v1/images/generations"),
        ("GET", "/v1/requests/x"),
    ]:
        async with http.request(method, url + path) as r:
            assert r.status == 401
            err = (await r.json())["error"]
            assert err["type"] == "authentication_error" and err["code"] == "missing_api_key"
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
        async with http.request(method, url + path, headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401
            assert (await r.json())["error"]["code"] == "invalid_api_key"
    before = len(key_server.omni.log)
    async with http.post(url + "/v1/images/generations", json={"prompt": "x"}) as r:
        assert r.status == 401
    assert len(key_server.omni.log) == before
    auth = {"Authorization": f"Bearer {API_KEY}"}
    async with http.get(url + "/v1/models", headers=auth) as r:
        assert r.status == 200
        assert (await r.json())["data"][0]["id"] == "http-image"
    async with http.post(url + "/v1/images/generations", json={"prompt": "x"}, headers=auth) as r:
        assert r.status == 200


async def test_openai_client_sees_typed_errors(key_server):
    import openai

    bad = openai.AsyncOpenAI(base_url=key_server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await bad.models.list()
    good = openai.AsyncOpenAI(base_url=key_server.url + "/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        # A size outside the client's Literal, on purpose: the server must refuse it.
        await good.images.generate(prompt="x", size="65x64")  # type: ignore[arg-type]
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == "size"
    with pytest.raises(openai.BadRequestError):
        # USER is a plain list of dicts, not the client's message TypedDicts.
        await good.chat.completions.create(model="http-image", messages=USER)  # type: ignore[arg-type]
    await bad.close()
    await good.close()


async def test_not_ready_while_loading_and_503_after_shutdown(http):
    from omnix.testing.serving import InProcessRuntime

    omni = Omni(parse_pipeline(IMAGE), runtime_factory=InProcessRuntime)
    server = await HttpServer(omni, telemetry=False).start()
    try:
        async with http.get(server.url + "/health") as r:
            assert r.status == 200
        async with http.get(server.url + "/ready") as r:
            assert r.status == 503
            assert (await r.json())["ready"] is False
        async with http.post(server.url + "/v1/images/generations", json={"prompt": "x"}) as r:
            assert r.status == 503
            assert r.headers["Retry-After"] == "5"
            assert (await r.json())["error"]["code"] == "not_ready"
        assert len(omni.log) == 0
        await omni.start()
        server.mark_serving()
        async with http.get(server.url + "/ready") as r:
            assert r.status == 200
            assert (await r.json()) == {"ready": True, "accepting": True, "stages": {"image": 1}}
        await omni.shutdown()
        server.mark_stopping()
        before = len(omni.log)
        async with http.post(server.url + "/v1/images/generations", json={"prompt": "x"}) as r:
            assert r.status == 503
            assert r.headers["Retry-After"] == "30"
            assert (await r.json())["error"]["code"] == "shutting_down"
        async with http.get(server.url + "/ready") as r:
            assert r.status == 503
        assert len(omni.log) == before
    finally:
        await omni.shutdown()
        await server.close()


async def test_a_client_that_sends_half_a_body_and_leaves_admits_nothing(omni_server, http):
    before = len(omni_server.omni.log)
    _, writer = await asyncio.open_connection("127.0.0.1", omni_server.port)
    writer.write(
        b'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"mess'
    )
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    async with http.get(omni_server.url + "/health") as r:
        assert r.status == 200
    assert len(omni_server.omni.log) == before
