"""A page this server served itself (the playground) may call it from a
browser, with no ``--allowed-origins``: its ``Origin`` is the server's own,
under a Host that is an IP address or ``localhost`` (a DNS name could be an
attacker's, rebound to this address); its WebSocket sends the API key as
OpenAI's ``openai-insecure-api-key.KEY`` subprotocol, since a browser's
WebSocket cannot send headers."""

from __future__ import annotations

import aiohttp
import pytest

from omnix.http.options import HttpOptions
from omnix.pipelines.validate import parse_pipeline
from omnix.testing.serving import serve_scripted

from .conftest import OMNI

pytestmark = pytest.mark.asyncio(loop_scope="session")

KEY = "sk-browser"
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


async def test_the_servers_own_origin_may_post_under_an_address_host(omni_server, http):
    port = omni_server.port
    url = omni_server.url + "/v1/chat/completions"
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        headers = {"Host": host, "Origin": f"http://{host}"}
        async with http.post(url, json=CHAT, headers=headers) as r:
            assert r.status == 200, host
            assert "Access-Control-Allow-Origin" not in r.headers


async def test_a_named_host_is_no_own_origin_dns_could_rebind_it(omni_server, http):
    host = f"evil.example:{omni_server.port}"
    before = len(omni_server.omni.log)
    async with http.post(
        omni_server.url + "/v1/chat/completions",
        json=CHAT,
        headers={"Host": host, "Origin": f"http://{host}"},
    ) as r:
        assert r.status == 403
        assert (await r.json())["error"]["code"] == "origin_not_allowed"
    async with http.post(
        omni_server.url + "/v1/chat/completions",
        json=CHAT,
        headers={"Origin": f"http://127.0.0.1:{omni_server.port + 1}"},
    ) as r:
        assert r.status == 403
    assert len(omni_server.omni.log) == before


async def test_the_servers_own_origin_may_open_a_websocket(omni_server, http):
    url = omni_server.url + "/v1/realtime"
    async with http.ws_connect(url, origin=omni_server.url) as ws:
        assert (await ws.receive_json())["type"] == "session.created"
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        async with http.ws_connect(url, origin="http://evil.example"):
            pass
    assert refused.value.status == 403


async def test_a_browsers_websocket_sends_the_key_as_a_subprotocol(http):
    async with serve_scripted(parse_pipeline(OMNI), HttpOptions(api_key=KEY)) as server:
        url = server.url + "/v1/realtime"
        given = ("realtime", f"openai-insecure-api-key.{KEY}")
        async with http.ws_connect(url, protocols=given, origin=server.url) as ws:
            assert ws.protocol == "realtime"
            assert (await ws.receive_json())["type"] == "session.created"
        for wrong in (("realtime", "openai-insecure-api-key.sk-wrong"), ("realtime",)):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                async with http.ws_connect(url, protocols=wrong, origin=server.url):
                    pass
            assert refused.value.status == 401
        # Not on a plain request: there the key is the Authorization header's.
        async with http.get(
            server.url + "/v1/models",
            headers={"Sec-WebSocket-Protocol": f"openai-insecure-api-key.{KEY}"},
        ) as r:
            assert r.status == 401
