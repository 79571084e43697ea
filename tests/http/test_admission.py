"""Refuse early, refuse whole: what a generation route checks before it
admits anything (Content-Type, X-Request-Id, batch size, room for the
whole batch), and that a refusal leaves nothing admitted."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from omnix import __version__
from omnix.events.types import Admitted, Rejected
from omnix.http.app import HttpServer
from omnix.http.options import HttpOptions
from omnix.pipelines.validate import parse_pipeline
from omnix.testing.serving import serve_scripted

pytestmark = pytest.mark.asyncio(loop_scope="session")

# Room for 3 requests: 2 credits of the thinker's one replica, 1 queue place.
# Each request runs ~0.5 s, long enough to fill it.
PIPELINE = """
name = "admission"
[[stages]]
name = "thinker"
max_queue = 1
engine = { kind = "scripted", chunks_per_piece = 50, delay_ms = 10, capacity = 2 }
[outputs]
text = "thinker"
"""
MAX_BATCH = 5
USER = [{"role": "user", "content": "hi"}]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server() -> AsyncIterator[HttpServer]:
    async with serve_scripted(parse_pipeline(PIPELINE), HttpOptions(max_batch=MAX_BATCH)) as server:
        yield server


def events_of(server: HttpServer, start: int) -> list:
    return list(server.omni.log.read(start))


def error(body: dict) -> dict:
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


async def test_json_routes_take_json_only(server, http):
    body = b'{"messages": [{"role": "user", "content": "hi"}]}'
    for ctype in (
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/json; charset=latin-1",
    ):
        before = len(server.omni.log)
        headers = {} if ctype is None else {"Content-Type": ctype}
        async with http.post(server.url + "/v1/chat/completions", data=body, headers=headers) as r:
            assert r.status == 415, ctype
            err = error(await r.json())
            assert err["code"] == "unsupported_media_type" and err["param"] == "Content-Type"
            assert "Content-Type: application/json" in err["message"]
        assert len(server.omni.log) == before
    for route in ("/v1/audio/speech", "/v1/images/generations"):
        async with http.post(
            server.url + route, data=b"{}", headers={"Content-Type": "text/plain"}
        ) as r:
            assert r.status == 415
    ok = {"Content-Type": "application/json; charset=utf-8"}
    async with http.post(server.url + "/v1/chat/completions", data=body, headers=ok) as r:
        assert r.status == 200, await r.text()


async def test_x_request_id_names_the_request_and_a_duplicate_is_409(server, http):
    url = server.url + "/v1/chat/completions"
    async with http.post(
        url, json={"messages": USER}, headers={"X-Request-Id": "client-id.1"}
    ) as r:
        assert r.status == 200, await r.text()
        assert r.headers["X-Request-Id"] == "client-id.1"
        assert (await r.json())["id"] == "chatcmpl-client-id.1"
    assert server.omni.state("client-id.1").status == "finished"
    before = len(server.omni.log)
    async with http.post(
        url, json={"messages": USER}, headers={"X-Request-Id": "client-id.1"}
    ) as r:
        assert r.status == 409
        assert r.headers["X-Request-Id"] == "client-id.1"
        err = error(await r.json())
        assert err["code"] == "duplicate_request_id" and err["type"] == "conflict_error"
        assert "client-id.1" in err["message"] and err["param"] == "X-Request-Id"
    assert len(server.omni.log) == before
    # A batch's members are ID-0, ID-1...; one of them in use refuses all.
    batch = {"messages": [USER, USER]}
    async with http.post(url, json=batch, headers={"X-Request-Id": "grp"}) as r:
        assert r.status == 200, await r.text()
        assert r.headers["X-Request-Id"] == "grp-0,grp-1"
        assert (await r.json())["id"] == "chatcmpl-grp"
    async with http.post(url, json={"messages": USER}, headers={"X-Request-Id": "grp2-1"}) as r:
        assert r.status == 200
    before = len(server.omni.log)
    async with http.post(url, json=batch, headers={"X-Request-Id": "grp2"}) as r:
        assert r.status == 409
        assert "grp2-1" in error(await r.json())["message"]
    assert len(server.omni.log) == before
    body = {"messages": USER, "max_tokens": 1}
    for bad in ("", "has space", "-leading-dash", "x" * 129, "ünicode", "a/b"):
        async with http.post(url, json=body, headers={"X-Request-Id": bad}) as r:
            assert r.status == 400, bad
            err = error(await r.json())
            assert err["code"] == "invalid_request_id" and err["param"] == "X-Request-Id"
    assert len(server.omni.log) == before


async def test_a_batch_over_the_limit_is_400(server, http):
    before = len(server.omni.log)
    batch = {"messages": [USER] * (MAX_BATCH + 1)}
    async with http.post(server.url + "/v1/chat/completions", json=batch) as r:
        assert r.status == 400
        err = error(await r.json())
        assert err["code"] == "batch_too_large" and err["param"] == "messages"
        assert f"at most {MAX_BATCH}" in err["message"] and "--max-batch" in err["message"]
    assert len(server.omni.log) == before


async def test_a_batch_is_admitted_whole_or_refused_whole(server, http):
    url = server.url + "/v1/chat/completions"
    assert server.omni.room(("text",)) == 3
    # 4 > room for 3: refused whole, each member recorded as rejected.
    start = len(server.omni.log)
    async with http.post(url, json={"messages": [USER] * 4}, headers={"X-Request-Id": "big"}) as r:
        assert r.status == 429
        assert r.headers["Retry-After"] == "1"
        # The refusal is rendered from the first member's event (render.py).
        assert r.headers["X-Request-Id"] == "big-0"
        err = error(await r.json())
        assert err["code"] == "overloaded" and "none was admitted" in err["message"]
    evs = events_of(server, start)
    assert [type(ev) for ev in evs] == [Rejected] * 4
    assert [ev.request_id for ev in evs] == ["big-0", "big-1", "big-2", "big-3"]
    assert not any(isinstance(ev, Admitted) for ev in evs)
    # 3 fit: all admitted and run.
    async with http.post(url, json={"messages": [USER] * 3}) as r:
        assert r.status == 200, await r.text()
        assert len((await r.json())["choices"]) == 3


async def test_version_answers_like_vllm(server, http):
    async with http.get(server.url + "/version") as r:
        assert r.status == 200
        assert await r.json() == {"version": __version__}
