"""CORS: closed by default, open to the origins ``--allowed-origins`` names."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from omnix.http.app import HttpServer
from omnix.http.core.cors import parse_origins
from omnix.http.options import HttpOptions
from omnix.pipelines.validate import parse_pipeline
from omnix.testing.serving import serve_scripted

pytestmark = pytest.mark.asyncio(loop_scope="session")

PIPELINE = """
name = "cors"
[[stages]]
name = "thinker"
engine = { kind = "scripted", chunks_per_piece = 3 }
[outputs]
text = "thinker"
"""
PAGE = "http://localhost:3000"
EVIL = "https://evil.example"
KEY = "sk-cors"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def serving(**options: Any) -> contextlib.AbstractAsyncContextManager[HttpServer]:
    return serve_scripted(parse_pipeline(PIPELINE), HttpOptions(**options))


def preflight(origin: str, headers: str = "authorization,content-type") -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": headers,
    }


async def test_closed_by_default(http):
    async with serving() as server:
        url = server.url + "/v1/chat/completions"
        async with http.options(url, headers=preflight(PAGE)) as r:
            assert r.status == 403
            assert "Access-Control-Allow-Origin" not in r.headers
            assert "Access-Control-Allow-Methods" not in r.headers
            err = (await r.json())["error"]
            assert err["code"] == "origin_not_allowed" and "--allowed-origins" in err["message"]
        # A page's POST (a "simple request" needs no preflight) starts nothing.
        before = len(server.omni.log)
        async with http.post(url, json=CHAT, headers={"Origin": EVIL}) as r:
            assert r.status == 403
            assert "Access-Control-Allow-Origin" not in r.headers
        assert len(server.omni.log) == before
        async with http.get(server.url + "/health", headers={"Origin": PAGE}) as r:
            assert r.status == 200
            assert "Access-Control-Allow-Origin" not in r.headers
        # Clients that are not browsers send no Origin: unaffected.
        async with http.post(url, json=CHAT) as r:
            assert r.status == 200
            assert "Access-Control-Allow-Origin" not in r.headers


async def test_allowed_origins(http):
    async with serving(
        allowed_origins=parse_origins(PAGE + ",https://app.example"), api_key=KEY
    ) as server:
        url = server.url + "/v1/chat/completions"
        # The preflight carries no credentials: answered before the API key.
        async with http.options(url, headers=preflight(PAGE)) as r:
            assert r.status == 204
            assert r.headers["Access-Control-Allow-Origin"] == PAGE
            assert "POST" in r.headers["Access-Control-Allow-Methods"]
            assert r.headers["Access-Control-Allow-Headers"] == "authorization,content-type"
            assert r.headers["Access-Control-Max-Age"] == "600"
            assert "Origin" in r.headers.getall("Vary")
        async with http.options(url, headers=preflight(EVIL)) as r:
            assert r.status == 403
            assert "Access-Control-Allow-Origin" not in r.headers
        # The actual request: headers on the answer, errors included.
        async with http.post(url, json=CHAT, headers={"Origin": PAGE, **AUTH}) as r:
            assert r.status == 200
            assert r.headers["Access-Control-Allow-Origin"] == PAGE
            assert "X-Request-Id" in r.headers["Access-Control-Expose-Headers"]
        async with http.post(
            url, json={**CHAT, "stream": True}, headers={"Origin": PAGE, **AUTH}
        ) as r:
            assert r.status == 200 and r.content_type == "text/event-stream"
            assert r.headers["Access-Control-Allow-Origin"] == PAGE
            await r.read()
        async with http.post(url, json=CHAT, headers={"Origin": PAGE}) as r:
            assert r.status == 401
            assert r.headers["Access-Control-Allow-Origin"] == PAGE
        before = len(server.omni.log)
        async with http.post(url, json=CHAT, headers={"Origin": EVIL, **AUTH}) as r:
            assert r.status == 403
            assert "Access-Control-Allow-Origin" not in r.headers
        assert len(server.omni.log) == before
        async with http.get(server.url + "/health", headers={"Origin": EVIL}) as r:
            assert r.status == 200
            assert "Access-Control-Allow-Origin" not in r.headers


async def test_any_origin(http):
    async with serving(allowed_origins=parse_origins("*")) as server:
        url = server.url + "/v1/chat/completions"
        async with http.options(url, headers=preflight(EVIL, "")) as r:
            assert r.status == 204
            assert r.headers["Access-Control-Allow-Origin"] == "*"
            assert "Authorization" in r.headers["Access-Control-Allow-Headers"]
        async with http.post(url, json=CHAT, headers={"Origin": EVIL}) as r:
            assert r.status == 200
            assert r.headers["Access-Control-Allow-Origin"] == "*"


async def test_parse_origins() -> None:
    assert parse_origins(None) == frozenset()
    assert parse_origins("") == frozenset()
    assert parse_origins(" HTTP://Localhost:3000/ , https://a.example") == {
        "http://localhost:3000",
        "https://a.example",
    }
    assert parse_origins(["*"]) == {"*"}
    for bad in ("localhost:3000", "http://a.example/app", "ftp://a.example", "null"):
        with pytest.raises(ValueError, match="not an origin"):
            parse_origins(bad)
