"""A Qwen3-TTS worker killed with SIGKILL while it speaks, and a client that
hears one uninterrupted answer equal to an undisturbed run's: the tiny
CustomVoice folder as ``omnix serve PATH`` derives it, with two replicas of
its talker and of its decoder (a ready spare for each kill), the talker
greedy and bounded to ``FRAMES`` frames (random weights never end an
answer), real worker processes, ``/v1/audio/speech`` streamed as pcm.

Exact, as the Qwen3-Omni migration tests are (test_engines_migration.py):
a greedy talker continued after the frames it delivered replays them and
goes on as the undisturbed run (tests/engines/test_talker.py holds the
machinery it shares), and the decoder is deterministic given its frames.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest
import pytest_asyncio

from omnix.events.types import Finished
from omnix.http.app import HttpServer
from omnix.pipelines.folder import derive_pipeline
from tests.model_fixtures import session_models

from .conftest import real_engine_marks, serve_engines, with_talker_sampling
from .migration import assert_seam, kill_serving, lost, migration_facts, stage_chunks

pytestmark = [*real_engine_marks(), pytest.mark.slow, pytest.mark.timeout(900)]

FRAMES = 48
TEXT = "Hello there, it is a lovely morning in the old city, how are you?"
#: Bounds on waiting, not assertions on time.
READY_LIMIT_S = 600.0


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tts(tmp_path_factory) -> AsyncIterator[HttpServer]:
    folder = session_models(tmp_path_factory).qwen3_tts_custom_voice
    derived = with_talker_sampling(
        derive_pipeline(folder, gpu=False), temperature=0.0, max_tokens=FRAMES
    )
    pipeline = msgspec.structs.replace(
        derived, stages=tuple(msgspec.structs.replace(s, replicas=2) for s in derived.stages)
    )
    async with serve_engines(pipeline) as server:
        yield server


@pytest_asyncio.fixture(loop_scope="session")
async def server(tts: HttpServer) -> HttpServer:
    """The module's server once every replica is ready (again, after a kill)."""
    want = {s.name: s.replicas for s in tts.omni.pipeline.stages}
    async with asyncio.timeout(READY_LIMIT_S):
        while tts.omni.ready() != want:  # noqa: ASYNC110 (Omni offers no readiness event)
            await asyncio.sleep(0.1)
    return tts


async def _speak(server: HttpServer, stage: str = "", after: int = 0) -> tuple[str, bytes]:
    """One streamed speech request (its id, its pcm); with ``stage``, the
    worker of that stage serving it is killed once it logged ``after`` chunks."""
    import aiohttp

    body = {"input": TEXT, "voice": "vivian", "response_format": "pcm", "stream_format": "audio"}
    before = set(server.omni.log.state.requests)
    async with aiohttp.ClientSession() as http:
        async with http.post(server.url + "/v1/audio/speech", json=body) as r:
            assert r.status == 200, await r.text()
            (rid,) = set(server.omni.log.state.requests) - before
            killer = None
            if stage:
                killer = asyncio.create_task(_kill_after(server, rid, stage, after))
            pcm = await r.read()
    if killer is not None:
        assert killer.done(), f"the request ended before {stage} logged {after} chunks"
        killer.result()
    return rid, pcm


async def _kill_after(server: HttpServer, rid: str, stage: str, n: int) -> tuple[int, int]:
    while len(stage_chunks(server, rid, stage)) < n:  # noqa: ASYNC110 (no event per chunk here)
        await asyncio.sleep(0.002)
    return kill_serving(server, rid, stage)


@pytest.mark.parametrize("stage, after", [("talker", 8), ("code2wav", 1)])
async def test_a_worker_killed_mid_speech_is_continued_sample_for_sample(
    server, stage: str, after: int
) -> None:
    ref_rid, ref = await _speak(server)
    assert len(ref) == (FRAMES - 1) * 1920 * 2
    ref_frames = [c.token_ids for c in stage_chunks(server, ref_rid, "talker")]

    rid, got = await _speak(server, stage, after)
    assert got == ref  # the client heard the undisturbed speech, sample for sample
    terminal, resumed = migration_facts(server, rid)
    assert [type(e) for e in terminal] == [Finished]
    (cont,) = [c for c in resumed if c.stage == stage]
    (killed,) = {c.replica for c in stage_chunks(server, rid, stage)[: cont.resume]}
    assert cont.replica != killed
    assert_seam(stage_chunks(server, rid, stage), killed, cont)
    assert [c.token_ids for c in stage_chunks(server, rid, "talker")] == ref_frames
    assert lost(server, stage, killed), f"no worker_lost for {stage}/{killed}"
