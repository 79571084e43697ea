"""A cached diffusion stage through a real server (``tiny-image`` with a
first-block cache from the command line's spec): the request completes
with a progress event per step, the stage's engine reports its cache, the
request's trace carries the cache in its recorded pipeline, and driving
the trace re-derives every decision."""

from __future__ import annotations

import base64
import io

import msgspec
import openai
import pytest_asyncio
from PIL import Image

from omnix.events.types import Progress
from omnix.pipelines.config import DiffusersArgs
from omnix.pipelines.diffusion_cache import FirstBlockCache, parse_cache_spec
from omnix.pipelines.validate import load_pipeline
from omnix.replay.drive import drive
from omnix.stages.options import RuntimeOptions
from omnix.testing.serving import serve_omni
from omnix.trace import export_trace, read_trace

from .conftest import real_engine_marks

pytestmark = real_engine_marks()

CACHE = FirstBlockCache(threshold=0.6)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def cached_server(tmp_path_factory):
    from omnix.api import Omni
    from tests.model_fixtures import session_models

    session_models(tmp_path_factory)
    base = load_pipeline("tiny-image")
    stage, cache = parse_cache_spec("image:first_block,threshold=0.6")
    assert (stage, cache) == ("image", CACHE)
    (st,) = base.stages
    assert isinstance(st.engine, DiffusersArgs)
    engine = msgspec.structs.replace(st.engine, cache=cache)
    pipeline = msgspec.structs.replace(base, stages=(msgspec.structs.replace(st, engine=engine),))
    omni = Omni(pipeline, runtime_options=RuntimeOptions(lost_after_s=20.0, start_timeout_s=600.0))
    async with serve_omni(omni, grace_s=2.0, telemetry=False) as server:
        yield server


async def test_a_cached_image_completes_with_progress_and_replays(cached_server, http):
    server = cached_server
    async with http.get(server.url + "/engines") as resp:
        engines = await resp.json()
    assert "first_block" in str(engines)
    client = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300
    )
    try:
        raw = await client.images.with_raw_response.generate(
            model="tiny-image",
            prompt="a red fox",
            size="64x64",
            extra_body={"seed": 5, "num_inference_steps": 8},
        )
    finally:
        await client.close()
    rid = raw.headers["x-request-id"]
    img = Image.open(io.BytesIO(base64.b64decode(raw.parse().data[0].b64_json)))
    assert img.size == (64, 64)
    steps = [(e.step, e.total) for e in server.omni.log.events_for(rid) if isinstance(e, Progress)]
    assert steps == [(i, 8) for i in range(1, 9)]
    trace = read_trace(
        export_trace(server.omni.log, server.omni.blobs, server.omni.pipeline, [rid])
    )
    recorded = trace.pipeline.stage("image").engine
    assert isinstance(recorded, DiffusersArgs) and recorded.cache == CACHE
    assert drive(trace).ok
