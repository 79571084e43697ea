"""Servers for the HTTP tests: scripted pipelines behind a real HttpServer.

Each server is shared by the whole test session (starting real worker
processes costs about a second).  Stages run in real worker processes
through ``StageRuntime``; set ``OMNIX_HTTP_TEST_INPROC=1`` to run them in
the server process instead (``omnix.testing.serving.InProcessRuntime``).

Also the built-in pipelines on real engines (``server``, for modules
marked ``engines`` that name a ``PIPELINE``): one server per pipeline,
shared by the modules that name it (``BuiltinServers``).

Tests that use these fixtures must run on the session's event loop:
``pytestmark = pytest.mark.asyncio(loop_scope="session")``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest
import pytest_asyncio

from omnix.http.app import HttpServer
from omnix.http.options import HttpOptions
from omnix.pipelines.config import PipelineConfig, TalkerArgs, VllmArgs
from omnix.pipelines.validate import load_pipeline, parse_pipeline
from omnix.stages.options import RuntimeOptions
from omnix.testing.pipelines import scripted_omni_toml
from omnix.testing.serving import serve_omni, serve_scripted

API_KEY = "sk-test-omnix"

OMNI = scripted_omni_toml(
    "http-omni",
    thinker='engine = { kind = "scripted", chunks_per_piece = 6, delay_ms = 1 }',
    talker='engine = { kind = "scripted", chunks_per_piece = 4, delay_ms = 1, output_modality = "codec" }',
    edge_thinker="every = 3",
    edge_talker="every = 1",
)

# Long enough to act on a request while it runs (~2 s), and a thinker of
# capacity 1 with no queue: a second concurrent request is refused.
SLOW = """
name = "http-slow"
[[stages]]
name = "thinker"
max_queue = 0
engine = { kind = "scripted", chunks_per_piece = 200, delay_ms = 10, capacity = 1 }
[[stages]]
name = "code2wav"
engine = { kind = "scripted", chunks_per_piece = 1, delay_ms = 1, output_modality = "audio" }
[[edges]]
source = "thinker"
target = "code2wav"
forward = "chunk"
every = 4
[outputs]
text = "thinker"
audio = "code2wav"
"""

IMAGE = """
name = "http-image"
[[stages]]
name = "image"
engine = { kind = "scripted", chunks_per_piece = 1, output_modality = "image" }
[outputs]
image = "image"
"""

#: Bodies over this get 413 on the test servers.
MAX_BODY = 64 * 1024


def use_processes() -> bool:
    return os.environ.get("OMNIX_HTTP_TEST_INPROC", "") != "1"


async def _serve(text: str, telemetry: bool = False, **options: Any) -> AsyncIterator[HttpServer]:
    """A scripted server for ``text`` answering with ``HttpOptions(**options)``
    (bodies over ``MAX_BODY`` get 413)."""
    async with serve_scripted(
        parse_pipeline(text),
        HttpOptions(max_body=MAX_BODY, **options),
        processes=use_processes(),
        telemetry=telemetry,
    ) as server:
        yield server


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def omni_server() -> AsyncIterator[HttpServer]:
    async for s in _serve(OMNI, telemetry=True):
        yield s


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def slow_server() -> AsyncIterator[HttpServer]:
    async for s in _serve(SLOW):
        yield s


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def image_server() -> AsyncIterator[HttpServer]:
    async for s in _serve(IMAGE):
        yield s


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def key_server() -> AsyncIterator[HttpServer]:
    async for s in _serve(IMAGE, api_key=API_KEY):
        yield s


@pytest_asyncio.fixture(loop_scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def parse_sse(body: bytes) -> list[dict[str, str]]:
    """SSE frames as dicts of their fields (``id``, ``event``, ``data``)."""
    frames = []
    for block in body.decode().split("\n\n"):
        if not block.strip():
            continue
        frame: dict[str, str] = {}
        for line in block.split("\n"):
            key, _, value = line.partition(":")
            frame[key] = value[1:] if value.startswith(" ") else value
        frames.append(frame)
    return frames


# -- real engines (tests marked ``engines``) -----------------------------------


def engines_missing() -> str | None:
    """Why the built-in pipelines cannot run here, or None."""
    import importlib.util

    for dist in ("vllm", "torch", "diffusers"):
        if importlib.util.find_spec(dist) is None:
            return f"{dist} is not installed"
    return None


def real_engine_marks() -> list[pytest.MarkDecorator]:
    """``pytestmark`` of a module that serves a built-in pipeline on real
    engines (the ``server`` and ``client`` fixtures below)."""
    missing = engines_missing()
    return [
        pytest.mark.engines,
        pytest.mark.skipif(missing is not None, reason=f"real engines unavailable: {missing}"),
        pytest.mark.asyncio(loop_scope="session"),
    ]


class BuiltinServers:
    """Built-in pipelines on real engines, shared by the modules that name
    the same ``PIPELINE`` (loading vLLM or diffusers costs tens of seconds
    on two cores, and none of these modules needs a fresh server: each
    looks at its own requests' events).  The ``KEEP`` pipelines used last
    stay up; an older one is shut down when another starts, so the
    session never holds every engine at once."""

    KEEP = 2

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.tmp_path_factory = tmp_path_factory
        self.up: dict[str, tuple[HttpServer, AsyncGenerator[HttpServer, None]]] = {}

    async def get(self, name: str) -> HttpServer:
        if name in self.up:
            self.up[name] = self.up.pop(name)  # the most recent last
            return self.up[name][0]
        while len(self.up) >= self.KEEP:
            await self._close(next(iter(self.up)))
        serving = serve_builtin(name, self.tmp_path_factory)
        server = await anext(serving)
        self.up[name] = (server, serving)
        return server

    async def _close(self, name: str) -> None:
        _, serving = self.up.pop(name)
        await serving.aclose()

    async def close(self) -> None:
        for name in list(self.up):
            await self._close(name)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def builtin_servers(tmp_path_factory) -> AsyncIterator[BuiltinServers]:
    servers = BuiltinServers(tmp_path_factory)
    try:
        yield servers
    finally:
        await servers.close()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(request, builtin_servers: BuiltinServers) -> HttpServer:
    """The built-in pipeline the test module names in ``PIPELINE`` (or a
    variant of it in ``SERVER``: ``serve_builtin``), on real engines:
    shared with the other modules that name it (``BuiltinServers``)."""
    name = getattr(request.module, "SERVER", None) or getattr(request.module, "PIPELINE", None)
    if name is None:
        raise RuntimeError(
            f"{request.module.__name__} uses the server fixture but sets no PIPELINE"
        )
    return await builtin_servers.get(name)


@pytest_asyncio.fixture(loop_scope="session")
async def client(server: HttpServer):
    """The official ``openai`` client on ``server``."""
    import openai

    c = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120
    )
    yield c
    await c.close()


async def serve_builtin(name: str, tmp_path_factory) -> AsyncGenerator[HttpServer, None]:
    """A built-in pipeline on real engines, its tiny models built once per
    session (``$OMNIX_MODEL_DIR`` when set: point it at a folder that keeps
    them to skip building).  ``NAME+tools``: its vLLM stages started as
    ``--enable-auto-tool-choice --tool-call-parser hermes`` would;
    ``NAME+long``: its talkers speak 400 frames (32 s) an answer, so
    that an answer is still being made seconds after it starts, however
    quiet the machine (a barge-in's test)."""
    from tests.model_fixtures import session_models

    session_models(tmp_path_factory)
    base, _, variant = name.partition("+")
    pipeline = load_pipeline(base)
    if variant == "tools":
        pipeline = with_tool_parser(pipeline)
    elif variant == "long":
        pipeline = with_long_answers(pipeline, frames=400)
    elif variant:
        raise ValueError(
            f"unknown server variant {variant!r} in {name!r}: give NAME, NAME+tools or NAME+long"
        )
    async with serve_engines(pipeline) as server:
        yield server


@contextlib.asynccontextmanager
async def serve_engines(pipeline: PipelineConfig) -> AsyncGenerator[HttpServer, None]:
    """``pipeline`` served on real engines in worker processes (its models
    found: ``session_models`` ran)."""
    from omnix.api import Omni

    # A worker loading vLLM on a busy 2-core machine can miss heartbeats for
    # seconds (GIL-heavy imports); the default 2 s bound then kills it while
    # it starts.  These tests are about HTTP, not about that bound.
    omni = Omni(
        pipeline,
        runtime_options=RuntimeOptions(
            forward_worker_output=False, lost_after_s=20.0, start_timeout_s=600.0
        ),
    )
    async with serve_omni(omni, grace_s=2.0, telemetry=False) as server:
        yield server


def with_tool_parser(pipeline: PipelineConfig) -> PipelineConfig:
    """``pipeline`` with its vLLM stages parsing tool calls (hermes, auto)."""
    return msgspec.structs.replace(
        pipeline,
        stages=tuple(
            msgspec.structs.replace(
                st,
                engine=msgspec.structs.replace(
                    st.engine, enable_auto_tool_choice=True, tool_call_parser="hermes"
                ),
            )
            if isinstance(st.engine, VllmArgs)
            else st
            for st in pipeline.stages
        ),
    )


def with_long_answers(pipeline: PipelineConfig, frames: int) -> PipelineConfig:
    """``pipeline`` with its talkers speaking ``frames`` frames, their end
    of speech held back until then (random weights may pick it at any
    frame), of answers of at least two text tokens (one would leave the
    talker nothing to speak)."""
    pipeline = with_talker_sampling(pipeline, max_tokens=frames, min_tokens=frames)
    return with_sampling(pipeline, VllmArgs, min_tokens=2)


def with_talker_sampling(pipeline: PipelineConfig, **fields: Any) -> PipelineConfig:
    """``pipeline`` with its talkers' sampling defaults set to ``fields``
    (``StageParams``' names: ``temperature=0.0`` for greedy, ``max_tokens``
    for a bound on frames, which random weights never end by themselves)."""
    return with_sampling(pipeline, TalkerArgs, **fields)


def with_sampling(pipeline: PipelineConfig, engine: type, **fields: Any) -> PipelineConfig:
    """``pipeline`` with the sampling defaults of its ``engine`` stages set to ``fields``."""
    return msgspec.structs.replace(
        pipeline,
        stages=tuple(
            msgspec.structs.replace(st, sampling=msgspec.structs.replace(st.sampling, **fields))
            if isinstance(st.engine, engine)
            else st
            for st in pipeline.stages
        ),
    )
