"""What the realtime tests share: their servers, audio, and reading a session's events.

The servers are scripted omni pipelines that take audio (thinker ->
talker -> code2wav) behind a real ``HttpServer``, shared by the session
of tests like ``conftest.py``'s; ``SLOW`` speaks long enough to be
interrupted.  ``connect`` opens the ``openai`` SDK's realtime client on
one; ``next_event`` reads server events up to one of a type.  ``speech``
is a recorded sentence (espeak-ng, committed as a fixture) for server VAD
to hear, ``stream`` appends audio as a microphone would.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest_asyncio
import soundfile as sf

from omnix.http.app import HttpServer
from omnix.testing.pipelines import scripted_omni_toml

from ..conftest import _serve

#: A scripted omni pipeline that takes audio input (at most 4 s a turn).
FAST = scripted_omni_toml(
    "rt-omni",
    thinker='engine = { kind = "scripted", chunks_per_piece = 8, delay_ms = 2 }\n'
    "media = { audio = true, max_audio_seconds = 4.0 }",
    edge_thinker='forward = "chunk"\nevery = 2',
)

#: Long answers whose audio flows while the text is written: one to interrupt.
SLOW = scripted_omni_toml(
    "rt-slow",
    thinker='engine = { kind = "scripted", chunks_per_piece = 400, delay_ms = 10 }\n'
    "media = { audio = true }",
    edge_thinker='forward = "chunk"\nevery = 2',
)

API_KEY = "sk-realtime-test"


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def rt_server() -> AsyncIterator[HttpServer]:
    async for s in _serve(FAST):
        yield s


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def rt_slow() -> AsyncIterator[HttpServer]:
    async for s in _serve(SLOW):
        yield s


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def rt_guarded() -> AsyncIterator[HttpServer]:
    """A server with an API key that allows one browser origin."""
    async for s in _serve(FAST, api_key=API_KEY, allowed_origins=frozenset({"https://ok.example"})):
        yield s


def pcm16(seconds: float, freq: float = 220.0) -> bytes:
    """A tone as pcm16 mono at 24 kHz."""
    t = np.arange(int(24000 * seconds)) / 24000
    return (np.sin(2 * np.pi * freq * t) * 8000).astype("<i2").tobytes()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


SPEECH = Path(__file__).parent / "fixtures" / "speech_24k.wav"


def speech() -> bytes:
    """The recorded sentence, as pcm16 mono at 24 kHz."""
    pcm, rate = sf.read(SPEECH, dtype="int16")
    assert rate == 24000
    return pcm.astype("<i2").tobytes()


def silence(seconds: float) -> bytes:
    return bytes(int(48000 * seconds) // 2 * 2)


async def stream(conn: Any, pcm: bytes, ms: int = 100) -> None:
    """Append ``pcm`` in pieces of ``ms`` milliseconds, as a microphone would."""
    step = 48 * ms
    for i in range(0, len(pcm), step):
        await conn.input_audio_buffer.append(audio=b64(pcm[i : i + step]))


def client_for(server: HttpServer, api_key: str = "unused") -> Any:
    import openai

    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0)


async def next_event(conn: Any, type_: str, seen: list[Any] | None = None) -> Any:
    """Read events up to the first of ``type_`` (returned); the others
    go to ``seen``.  An error event on the way fails the test."""
    while True:
        ev = await conn.recv()
        if ev.type == type_:
            return ev
        assert ev.type != "error", ev
        if seen is not None:
            seen.append(ev)


async def manual(conn: Any, **session: Any) -> None:
    """Turn detection off (the client commits), with ``session`` set too."""
    await conn.session.update(
        session={"type": "realtime", "audio": {"input": {"turn_detection": None}}, **session}
    )
    await next_event(conn, "session.updated")
