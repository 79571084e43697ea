"""A request that vLLM aborts on its own ends, with an error the client sees
(issue #28, point 11).

vLLM (v1) aborts the requests it runs by itself when its engine core stops
serving: SIGTERM or SIGINT make the engine core abort everything in flight
(``EngineCore._handle_shutdown``: ``FinishReason.ABORT`` to the client) and
exit.  That ``abort`` is not the acknowledgement of an abort omnix asked
for; were it reported as one, the stage would end ``aborted`` while the
request is not cancelling, and the orchestrator, which finishes a request
only when every stage has finished, would wait forever.  Here the vLLM
engine core of the stage serving a streamed request is sent SIGTERM: the
worker exits (``EngineDead``), its replica is recorded lost and, with
retries off, the request fails on that stage; the client's stream ends
with an error event and ``[DONE]``.  For the first stage (the thinker) and
for a later one: the stand-in talker of ``omnix.testing.pipelines``'
``standin-omni`` (tiny-omni's own talker runs no vLLM), fed by the thinker.

With retries on (the built-in default for vLLM stages) the same loss makes
a continuation instead, on the restarted replica: that path is
tests/http/test_engines_migration.py's (an engine core killed mid-stream).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator

import aiohttp
import msgspec
import psutil
import pytest
import pytest_asyncio

from omnix.events.types import Chunk, Failed, StageFinished, WorkerJoined, WorkerLost, is_terminal
from omnix.http.app import HttpServer
from omnix.pipelines.config import PipelineConfig
from omnix.pipelines.validate import validate_pipeline
from omnix.stages.options import RuntimeOptions
from omnix.testing.pipelines import standin_omni

from .conftest import real_engine_marks

pytestmark = [*real_engine_marks(), pytest.mark.slow]

USER = [{"role": "user", "content": "Tell me a story about a cat."}]
# Bounds on waiting, not assertions on time: a vLLM replica restarting on a
# busy 2-core machine takes 20-60 s; a request that hangs exceeds them.
READY_LIMIT_S = 600.0
END_LIMIT_S = 300.0


def _pipeline() -> PipelineConfig:
    base = standin_omni()
    no_retry = {"thinker", "talker"}
    cfg = msgspec.structs.replace(
        base,
        name="standin-omni-self-abort",
        stages=tuple(
            msgspec.structs.replace(
                s,
                retry=False,
                # A long talker run (one piece, see the edge below), so its
                # engine core is signalled while it generates.
                sampling=msgspec.structs.replace(s.sampling, max_tokens=400, ignore_eos=True)
                if s.name == "talker"
                else s.sampling,
            )
            if s.name in no_retry
            else s
            for s in base.stages
        ),
        # The talker takes the thinker's whole answer as one piece: one
        # sub-request, running when its engine core is signalled.
        edges=tuple(
            msgspec.structs.replace(e, forward="finish") if e.source == "thinker" else e
            for e in base.edges
        ),
    )
    validate_pipeline(cfg)
    return cfg


PIPELINE = _pipeline()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def self_abort_server(tmp_path_factory) -> AsyncIterator[HttpServer]:
    from omnix.api import Omni
    from omnix.testing.serving import serve_omni
    from tests.model_fixtures import session_models

    session_models(tmp_path_factory)
    omni = Omni(
        PIPELINE,
        # See conftest.serve_builtin: vLLM loading on 2 cores can starve
        # heartbeats for seconds.  A worker's exit is seen at once.
        runtime_options=RuntimeOptions(
            forward_worker_output=False, lost_after_s=20.0, start_timeout_s=600.0
        ),
    )
    async with serve_omni(omni, grace_s=2.0, telemetry=False) as server:
        yield server


@pytest_asyncio.fixture(loop_scope="session")
async def server(self_abort_server: HttpServer) -> HttpServer:
    """The module's server once every replica of every stage is ready (a
    test's replica is restarted after it)."""
    want = {s.name: s.replicas for s in PIPELINE.stages}
    async with asyncio.timeout(READY_LIMIT_S):
        while self_abort_server.omni.ready() != want:  # noqa: ASYNC110 (Omni offers no readiness event)
            await asyncio.sleep(0.1)
    return self_abort_server


def _sigterm_engine_core(server: HttpServer, stage: str) -> int:
    """SIGTERM the vLLM engine core started by ``stage``'s worker (replica
    0, the only one); its pid."""
    joined = [
        e
        for e in server.omni.log.read()
        if type(e) is WorkerJoined and e.stage == stage and e.replica == 0
    ]
    worker = psutil.Process(joined[-1].pid)
    (core,) = [p for p in worker.children(recursive=True) if "EngineCore" in p.name()]
    os.kill(core.pid, signal.SIGTERM)
    return core.pid


class _Stream:
    """A streamed chat read frame by frame (SSE ``data:`` payloads)."""

    def __init__(self) -> None:
        self.rid = ""
        self.frames: list[str] = []
        self.content = 0  # frames with text content
        self.ended = False
        self.changed = asyncio.Event()

    async def read(self, http: aiohttp.ClientSession, url: str, body: dict) -> None:
        try:
            async with http.post(url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                async for raw in resp.content:
                    self._take(raw.decode().strip())
        finally:
            self.ended = True
            self.changed.set()

    def _take(self, line: str) -> None:
        if not line.startswith("data: "):
            return
        data = line[len("data: ") :]
        self.frames.append(data)
        if data != "[DONE]":
            obj = json.loads(data)
            self.rid = self.rid or str(obj.get("id", "")).removeprefix("chatcmpl-")
            delta = (obj.get("choices") or [{}])[0].get("delta") or {}
            if delta.get("content"):
                self.content += 1
        self.changed.set()

    async def until(self, pred) -> None:
        while not pred():
            self.changed.clear()
            await self.changed.wait()


async def _signalled_mid_stream(server: HttpServer, stage: str, body: dict) -> tuple[_Stream, int]:
    """Stream ``body``; once ``stage`` has logged a chunk of the request,
    SIGTERM that stage's engine core; read the stream to its end."""
    log = server.omni.log
    stream = _Stream()
    timeout = aiohttp.ClientTimeout(total=END_LIMIT_S + 60)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        reading = asyncio.create_task(stream.read(http, server.url, body))
        try:
            async with asyncio.timeout(END_LIMIT_S):
                await stream.until(lambda: stream.rid or stream.ended)
                while not any(
                    type(e) is Chunk and e.stage == stage for e in log.events_for(stream.rid)
                ):
                    assert not stream.ended, f"the request ended before {stage} produced"
                    await asyncio.sleep(0.02)
                core = _sigterm_engine_core(server, stage)
                await reading  # a request that hangs never gets here
        finally:
            reading.cancel()
    return stream, core


def _assert_failed_on(server: HttpServer, stream: _Stream, stage: str) -> None:
    # The client: an error event, then [DONE], then the stream closed.
    assert stream.frames[-1] == "[DONE]"
    err = json.loads(stream.frames[-2])["error"]
    assert err["code"] == "stage_lost"
    assert f"stage {stage!r}" in err["message"] and f"{stage}/0 was lost" in err["message"]
    # The log: one end, the failure of that stage, its replica lost; the
    # stage never recorded as finished "aborted" (nobody asked for an abort).
    events = server.omni.log.events_for(stream.rid)
    terminal = [e for e in events if is_terminal(e)]
    assert [type(e) for e in terminal] == [Failed]
    (failed,) = terminal
    assert isinstance(failed, Failed)
    assert (failed.reason, failed.stage) == ("stage_lost", stage)
    assert not [
        e
        for e in events
        if type(e) is StageFinished and e.stage == stage and e.finish_reason == "aborted"
    ]
    lost = [e for e in server.omni.log.read() if type(e) is WorkerLost and e.stage == stage]
    assert lost, f"no worker_lost for {stage}/0"


async def test_the_first_stage_aborted_by_vllm_fails_the_request_and_closes_the_stream(server):
    body = {
        "model": PIPELINE.name,
        "messages": USER,
        "stream": True,
        "temperature": 0.0,
        "max_tokens": 300,
        "ignore_eos": True,
    }
    stream, _ = await _signalled_mid_stream(server, "thinker", body)
    assert stream.content >= 1  # it was streaming when vLLM aborted it
    _assert_failed_on(server, stream, "thinker")


async def test_a_later_stage_aborted_by_vllm_fails_the_request_and_closes_the_stream(server):
    body = {
        "model": PIPELINE.name,
        "messages": USER,
        "stream": True,
        "temperature": 0.0,
        "max_tokens": 24,
        "modalities": ["text", "audio"],
        "audio": {"voice": "alloy", "format": "pcm16"},
    }
    stream, _ = await _signalled_mid_stream(server, "talker", body)
    _assert_failed_on(server, stream, "talker")
    # The thinker had finished; the talker was the stage that failed.
    events = server.omni.log.events_for(stream.rid)
    assert [e.finish_reason for e in events if type(e) is StageFinished and e.stage == "thinker"]
