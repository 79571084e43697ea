"""``POST /admin/stages/{name}/replicas``: behind the API key, a clear 4xx
for an unknown stage, a fixed-count stage, a count out of range or a bad
body, and the count set as ``Scaled`` events the log records (replicas
start and join, or drain and leave), described in the OpenAPI document
within the stage's range."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from omnix.events.types import Scaled
from omnix.http.app import HttpServer
from omnix.testing.pipelines import scripted_omni_toml

from .conftest import API_KEY, _serve

pytestmark = pytest.mark.asyncio(loop_scope="session")

SCALING = scripted_omni_toml(
    "http-scaling",
    # Scaled by hand here: its own rules would take minutes to act.
    talker="replicas = { min = 1, max = 3, up_after = 1000, down_after_s = 600 }",
)
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def scaling_server() -> AsyncIterator[HttpServer]:
    async for s in _serve(SCALING, api_key=API_KEY):
        yield s


async def _post(http, server, stage: str, body, headers=AUTH):
    url = f"{server.url}/admin/stages/{stage}/replicas"
    async with http.post(url, json=body, headers=headers) as r:
        return r.status, await r.json()


async def test_it_needs_the_api_key(scaling_server, http):
    status, body = await _post(http, scaling_server, "talker", {"replicas": 2}, headers={})
    assert status == 401 and body["error"]["code"] == "missing_api_key"
    status, _ = await _post(
        http, scaling_server, "talker", {"replicas": 2}, headers={"Authorization": "Bearer no"}
    )
    assert status == 401
    assert not [e for e in scaling_server.omni.log.read() if type(e) is Scaled]


@pytest.mark.parametrize(
    ("stage", "body", "status", "code", "says"),
    [
        ("nope", {"replicas": 2}, 404, "unknown_stage", "has no stage 'nope'"),
        ("thinker", {"replicas": 2}, 409, "fixed_replicas", "fixed replica count"),
        ("talker", {"replicas": 4}, 400, "out_of_range", "between 1 and 3"),
        ("talker", {"replicas": 0}, 400, None, ">= 1"),
        ("talker", {"replicas": "2"}, 400, None, "Expected `int`"),
        ("talker", {"count": 2}, 400, None, "count"),
    ],
)
async def test_a_bad_count_is_refused_and_appends_nothing(
    scaling_server, http, stage, body, status, code, says
):
    got, answer = await _post(http, scaling_server, stage, body)
    assert got == status, answer
    assert says in answer["error"]["message"]
    if code is not None:
        assert answer["error"]["code"] == code
    assert not [e for e in scaling_server.omni.log.read() if type(e) is Scaled]


async def test_a_count_set_by_hand_starts_and_drains_replicas(scaling_server, http):
    omni = scaling_server.omni
    status, body = await _post(http, scaling_server, "talker", {"replicas": 3})
    assert status == 200, body
    assert body["stage"] == "talker" and body["replicas"] == 3
    assert (body["min"], body["max"], body["draining"]) == (1, 3, [])
    started = [omni.log.get(p) for p in body["scaled"]]
    assert [(e.replica, e.op, e.reason) for e in started] == [
        (1, "start", "admin"),
        (2, "start", "admin"),
    ]
    deadline = time.monotonic() + 30
    while omni.ready()["talker"] < 3:
        assert time.monotonic() < deadline, "the started replicas never joined"
        await asyncio.sleep(0.05)
    async with http.get(scaling_server.url + "/ready", headers=AUTH) as r:
        assert (await r.json())["stages"]["talker"] == 3
    status, body = await _post(http, scaling_server, "talker", {"replicas": 1})
    assert status == 200 and body["replicas"] == 1 and body["ready"] == 1
    assert sorted(body["draining"]) == [1, 2]
    deadline = time.monotonic() + 30
    while omni.orchestrator.scaler.draining("talker"):
        assert time.monotonic() < deadline, "the drained replicas never left"
        await asyncio.sleep(0.05)
    left = [e for e in omni.log.read() if type(e) is Scaled and e.op == "left"]
    assert sorted(e.replica for e in left) == [1, 2]
    status, body = await _post(http, scaling_server, "talker", {"replicas": 1})
    assert status == 200 and body["scaled"] == []


async def test_it_is_described_within_the_stage_range(scaling_server, omni_server, http):
    async with http.get(omni_server.url + "/openapi.json") as r:
        # No stage of that pipeline scales: the route answers 404 or 409 there.
        assert "/admin/stages/{name}/replicas" not in (await r.json())["paths"]
    async with http.get(scaling_server.url + "/openapi.json", headers=AUTH) as r:
        spec = await r.json()
    op = spec["paths"]["/admin/stages/{name}/replicas"]["post"]
    assert set(op["responses"]) >= {"200", "400", "401", "404", "409"}
    assert op["parameters"][0]["schema"] == {"enum": ["talker"]}
    count = spec["components"]["schemas"]["SetReplicas"]["properties"]["replicas"]
    assert (count["minimum"], count["maximum"]) == (1, 3)
