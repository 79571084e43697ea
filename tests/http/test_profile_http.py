"""POST /start_profile and /stop_profile: on with --profile-dir (traces
under DIR/<stage>/<replica>/), 404 saying how to turn them on without."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from omnix.pipelines.validate import parse_pipeline
from omnix.stages.options import RuntimeOptions
from omnix.testing.serving import serve_scripted

from .conftest import OMNI, use_processes

pytestmark = [
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.skipif(not use_processes(), reason="profiles worker processes"),
]


async def test_start_and_stop_profile_write_a_trace_per_worker_of_the_stages(http, tmp_path):
    async with serve_scripted(
        parse_pipeline(OMNI), processes=True, runtime_options=RuntimeOptions(profile_dir=tmp_path)
    ) as server:
        async with http.post(server.url + "/start_profile", json={"stages": ["thinker"]}) as r:
            body = await r.json()
            assert r.status == 200, body
        assert [(w["stage"], w["replica"], w["ok"]) for w in body["workers"]] == [
            ("thinker", 0, True)
        ]
        async with http.post(
            server.url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}]},
        ) as r:
            assert r.status == 200
        async with http.post(server.url + "/stop_profile", json={"stages": ["thinker"]}) as r:
            body = await r.json()
            assert r.status == 200, body
        (worker,) = body["workers"]
        trace = Path(worker["detail"])
        assert trace.parent == tmp_path / "thinker" / "0"
        assert json.loads(await asyncio.to_thread(trace.read_text))["traceEvents"]
        assert not (tmp_path / "talker").exists()
        # No body: every stage.
        async with http.post(server.url + "/start_profile") as r:
            body = await r.json()
            assert r.status == 200, body
        assert {w["stage"] for w in body["workers"]} == {
            st.name for st in server.omni.pipeline.stages
        }
        async with http.post(server.url + "/stop_profile") as r:
            assert r.status == 200
        async with http.post(server.url + "/start_profile", json={"stages": ["nope"]}) as r:
            err = (await r.json())["error"]
            assert r.status == 400 and err["param"] == "stages" and "'nope'" in err["message"]


async def test_profiling_is_404_unless_enabled(omni_server, http):
    async with http.post(omni_server.url + "/start_profile", json={}) as r:
        err = (await r.json())["error"]
        assert r.status == 404
    assert err["code"] == "profiling_off" and "--profile-dir" in err["message"]
