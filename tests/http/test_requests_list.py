"""``GET /v1/requests``: the requests the server holds, their folded state,
filtered by status, newest first, at most ``limit``; bad values are 400s;
described in the OpenAPI document; behind the API key like its neighbours."""

from __future__ import annotations

import asyncio

import pytest

from .test_requests import USER, terminal

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def listed(http, url: str, **query: str) -> dict:
    async with http.get(url + "/v1/requests", params=query) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def test_ended_requests_are_listed_newest_first_up_to_the_limit(omni_server, http):
    url = omni_server.url
    rids = []
    for _ in range(3):
        async with http.post(url + "/v1/chat/completions", json={"messages": USER}) as r:
            assert r.status == 200
            rids.append(r.headers["X-Request-Id"])
    page = await listed(http, url, status="finished", limit="2")
    assert [s["request_id"] for s in page["data"]] == rids[:0:-1]  # the two newest
    assert page["object"] == "list" and page["has_more"] is True
    # Each entry is the request's state, as GET /v1/requests/{id} answers it.
    async with http.get(f"{url}/v1/requests/{rids[2]}") as r:
        assert page["data"][0] == await r.json()
    everything = await listed(http, url)
    assert set(rids) <= {s["request_id"] for s in everything["data"]}
    ended = await listed(http, url, status="ended", limit="1000")
    assert set(rids) <= {s["request_id"] for s in ended["data"]}
    assert all(
        s["status"] in ("finished", "cancelled", "failed", "rejected") for s in ended["data"]
    )
    assert not {s["request_id"] for s in (await listed(http, url, status="running"))["data"]} & set(
        rids
    )


async def test_a_running_request_is_listed_as_running(slow_server, http):
    url = slow_server.url
    async with http.post(
        url + "/v1/chat/completions", json={"messages": USER, "stream": True}
    ) as r:
        rid = r.headers["X-Request-Id"]
        async with asyncio.timeout(10):
            while slow_server.omni.state(rid).status != "running":
                await r.content.readuntil(b"\n\n")
        running = await listed(http, url, status="running")
        in_flight = await listed(http, url, status="in_flight")
        ended = await listed(http, url, status="ended")
        async with http.post(f"{url}/v1/requests/{rid}/cancel") as c:
            assert c.status == 200
    assert rid in {s["request_id"] for s in running["data"]}
    assert all(s["status"] == "running" for s in running["data"])
    assert rid in {s["request_id"] for s in in_flight["data"]}
    assert rid not in {s["request_id"] for s in ended["data"]}
    await terminal(slow_server, rid)
    cancelled = await listed(http, url, status="cancelled")
    assert rid in {s["request_id"] for s in cancelled["data"]}


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"status": "done"}, "status"),
        ({"status": ""}, "status"),
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "-1"}, "limit"),
    ],
)
async def test_a_bad_status_or_limit_is_a_400_naming_it(omni_server, http, query, param):
    async with http.get(omni_server.url + "/v1/requests", params=query) as r:
        err = (await r.json())["error"]
        assert r.status == 400, err
    assert err["param"] == param and err["code"] == "invalid_value"


async def test_it_is_described_and_behind_the_api_key(omni_server, key_server, http):
    async with http.get(omni_server.url + "/openapi.json") as r:
        op = (await r.json())["paths"]["/v1/requests"]["get"]
    params = {p["name"]: p["schema"] for p in op["parameters"]}
    assert "running" in params["status"]["enum"] and params["limit"]["maximum"] == 1000
    async with http.get(key_server.url + "/v1/requests") as r:
        assert r.status == 401
    headers = {"Authorization": "Bearer sk-test-omnix"}
    async with http.get(key_server.url + "/v1/requests", headers=headers) as r:
        assert r.status == 200 and (await r.json())["object"] == "list"
