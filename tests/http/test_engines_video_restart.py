"""A video job survives a kill -9 of ``omnix serve --log-dir``: the
restarted server routes the video stage again (a diffusion stage cannot
continue from a step, so it starts the generation over and the ``Video``
says so: ``restarts``), the job completes, its MP4 is served, and its
trace replays with every decision re-derived."""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path

import aiohttp
import pytest

from omnix.engines.media_files import mp4_frames
from omnix.events.types import Routed, WorkerLost
from omnix.orchestrator.recovery import RESTART_REASON
from omnix.replay.drive import drive
from omnix.testing.served import omnix_serve
from omnix.trace import read_trace

from .conftest import real_engine_marks, use_processes

pytestmark = [
    *real_engine_marks(),
    pytest.mark.skipif(not use_processes(), reason="needs the process runtime"),
]


async def _job(http: aiohttp.ClientSession, url: str, vid: str) -> dict:
    async with http.get(f"{url}/v1/videos/{vid}") as r:
        assert r.status == 200, await r.text()
        return await r.json()


@pytest.mark.timeout(600)
async def test_a_video_job_survives_a_kill_9_of_the_server(tmp_path: Path, tmp_path_factory):
    from tests.model_fixtures import session_models

    session_models(tmp_path_factory)
    log_dir = tmp_path / "log"
    args = ("--pipeline", "tiny-video", "--log-dir", str(log_dir))
    form = aiohttp.FormData(default_to_multipart=True)
    for k, v in {"prompt": "a long walk", "num_inference_steps": "300", "num_frames": "5"}.items():
        form.add_field(k, v)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        async with aiohttp.ClientSession() as http:
            async with omnix_serve(*args) as first:
                async with http.post(first.url + "/v1/videos", data=form) as r:
                    assert r.status == 200, await r.text()
                    vid = (await r.json())["id"]
                async with asyncio.timeout(120):
                    while (job := await _job(http, first.url, vid))["progress"] < 5:  # noqa: ASYNC110
                        await asyncio.sleep(0.05)
                assert job["status"] == "in_progress"
                await first.kill9()
            async with omnix_serve(*args) as second:
                async with asyncio.timeout(300):
                    polling = ("queued", "in_progress")
                    while (job := await _job(http, second.url, vid))["status"] in polling:  # noqa: ASYNC110
                        await asyncio.sleep(0.1)
                assert job["status"] == "completed", job
                assert job["restarts"] == 1 and job["progress"] == 100
                async with http.get(f"{second.url}/v1/videos/{vid}/content") as r:
                    assert r.status == 200 and r.content_type == "video/mp4"
                    assert mp4_frames(await r.read()).shape == (5, 32, 32, 3)
                async with http.get(f"{second.url}/v1/requests/{vid}/trace") as r:
                    assert r.status == 200, await r.text()
                    trace = read_trace(await r.read())
    assert any(isinstance(e, WorkerLost) and e.reason == RESTART_REASON for e in trace.events)
    routes = [e for e in trace.events if isinstance(e, Routed) and e.request_id == vid]
    assert [(e.seq, e.resume) for e in routes] == [(0, 0), (0, 0)]  # started over: no chunk yet
    assert drive(trace).ok
