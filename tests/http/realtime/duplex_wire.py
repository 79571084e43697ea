"""A full-duplex client as vLLM-Omni's are written, for the duplex tests.

``Probe`` speaks exactly the messages vLLM-Omni's ``DuplexClient`` and its
PersonaPlex validation probe send, over a real WebSocket (``websockets``,
the library their client uses): the URL (``?duplex=1&model=...&
autostart=0``), the opening ``session.update`` (``SessionConfig.
to_session_payload``'s fields with the PersonaPlex preset's formats: 24 kHz
float PCM in, 16-bit out), 80 ms ``input_audio_buffer.append`` frames
(``format``, ``sample_rate_hz``, ``duration_ms``, ``audio_end_ms``,
``is_speech``), an ``event_id`` on every event, ``session.event_ack`` for
every server event with a ``server_event_seq`` and duplicates dropped by
it, ``session.heartbeat``, ``playback.ack``, ``session.close`` then waiting
for ``session.closed``; and ``session.resume`` with the last seq it had.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import numpy as np
import websockets

from omnix.events.types import Event, StageParams
from omnix.transport.work import EngineOutput

from ..conftest import parse_sse

RATE = 24000
FRAME = 1920


def speech(frames: int) -> np.ndarray:
    """A voiced, gliding tone: audio that encodes to varied Mimi codes."""
    t = np.arange(frames * FRAME) / RATE
    f0 = 140 + 20 * np.sin(2 * math.pi * 5 * t)
    phase = 2 * math.pi * np.cumsum(f0) / RATE
    voice = sum(np.sin(h * phase) / h for h in range(1, 6))
    return (0.2 * voice).astype(np.float32)


def session_payload(model: str, **over: Any) -> dict[str, Any]:
    """``SessionConfig.to_session_payload`` of the PersonaPlex preset, no
    voice or persona (this checkpoint has none)."""
    payload: dict[str, Any] = {
        "model": model,
        "modalities": ["audio", "text"],
        "input_audio_format": "pcm_f32le",
        "output_audio_format": "pcm16",
        "sample_rate_hz": RATE,
        "audio": {"input": {"sample_rate_hz": RATE}, "output": {"sample_rate_hz": RATE}},
        "turn_detection": None,
        "extra_body": {"auto_response": True},
    }
    payload.update(over)
    return payload


def frame_event(frame: np.ndarray, seq: int) -> dict[str, Any]:
    frame = np.ascontiguousarray(np.pad(frame, (0, FRAME - frame.size)), dtype="<f4")
    return {
        "type": "input_audio_buffer.append",
        "audio": base64.b64encode(frame.tobytes()).decode("ascii"),
        "format": "pcm_f32le",
        "sample_rate_hz": RATE,
        "duration_ms": 80,
        "audio_end_ms": (seq + 1) * 80,
        "is_speech": bool(np.sqrt(np.mean(np.square(frame))) >= 1e-4),
    }


class Probe:
    """One socket: ``send`` stamps an ``event_id``; a reader task keeps
    every server event in ``events`` and acks those with a seq."""

    def __init__(self, url: str, model: str, *, read_every: float = 0.0, rcvbuf: int = 0) -> None:
        self.url = f"{url.replace('http', 'ws')}/v1/realtime?duplex=1&model={model}&autostart=0"
        self.model = model
        self.events: list[dict[str, Any]] = []
        self.last_seq = 0
        self.closed: websockets.ConnectionClosed | None = None
        #: seconds a slow client takes over each message it reads
        self._read_every = read_every
        self._rcvbuf = rcvbuf
        self._more = asyncio.Event()
        self.ws: Any = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Probe:
        kw: dict[str, Any] = {"max_size": 64 << 20}
        if self._rcvbuf:
            # A client that reads slowly: a small kernel receive buffer and a
            # short message queue, so the server sees it soon.
            host, _, port = self.url.split("//")[1].split("/")[0].partition(":")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._rcvbuf)
            sock.connect((host, int(port)))
            kw.update(sock=sock, max_queue=2)
        self.ws = await websockets.connect(self.url, **kw)
        self._reader = asyncio.create_task(self._read_loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
        await self.ws.close()

    async def finish(self, timeout: float = 30) -> None:  # noqa: ASYNC109
        """Read until the server closes the socket."""
        assert self._reader is not None
        async with asyncio.timeout(timeout):
            await asyncio.shield(self._reader)

    async def _read_loop(self) -> None:
        try:
            async for raw in self.ws:
                ev = json.loads(raw)
                seq = ev.get("server_event_seq")
                if isinstance(seq, int):
                    if seq <= self.last_seq:
                        continue  # a replayed duplicate, as DuplexClient drops it
                    self.last_seq = seq
                self.events.append(ev)
                self._more.set()
                if self._read_every:
                    await asyncio.sleep(self._read_every)
                if isinstance(seq, int):
                    # As DuplexClient: an ack the closing socket cannot take is no error.
                    with contextlib.suppress(websockets.ConnectionClosed):
                        ack = {"type": "session.event_ack", "server_event_seq": seq}
                        await self.ws.send(json.dumps(ack))
        except websockets.ConnectionClosed as closed:
            self.closed = closed
        finally:
            self._more.set()

    async def send(self, event: dict[str, Any]) -> str:
        event = {"event_id": f"evt_{uuid.uuid4().hex}", **event}
        await self.ws.send(json.dumps(event))
        return event["event_id"]

    async def wait(self, type_: str, count: int = 1, timeout: float = 60) -> dict[str, Any]:  # noqa: ASYNC109
        """The ``count``-th event of ``type_`` (from the start)."""
        async with asyncio.timeout(timeout):
            while True:
                got = self.of(type_)
                if len(got) >= count:
                    return got[count - 1]
                if self.closed is not None or (self._reader is not None and self._reader.done()):
                    raise AssertionError(f"closed before {type_} ({self._why()}): {self.types()}")
                self._more.clear()
                await self._more.wait()

    def _why(self) -> str:
        """Why the reading stopped: the socket's close, or the reader's error."""
        if self.closed is not None:
            return f"closed {self.closed.rcvd}"
        reader = self._reader
        if reader is not None and reader.done() and not reader.cancelled():
            return f"the reader failed: {reader.exception()!r}"
        return "the reader ended"

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == type_]

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    async def open(self, **over: Any) -> dict[str, Any]:
        await self.send({"type": "session.update", "session": session_payload(self.model, **over)})
        return await self.wait("session.created")

    async def stream(self, pcm: np.ndarray, *, paced: bool = True, start: int = 0) -> int:
        """80 ms frames of ``pcm``, one every 80 ms (``paced``)."""
        n = math.ceil(pcm.size / FRAME)
        for k in range(n):
            await self.send(frame_event(pcm[k * FRAME : (k + 1) * FRAME], start + k))
            if paced:
                await asyncio.sleep(FRAME / RATE)
        return n

    def audio(self) -> list[bytes]:
        return [base64.b64decode(e["delta"]) for e in self.of("response.output_audio.delta")]


async def undisturbed(
    folder: str, pcm: np.ndarray, params: StageParams | None = None
) -> list[EngineOutput]:
    """The ``moshi_duplex`` engine's frames for ``pcm`` sent as one piece,
    in this process (greedy; ``params``: the stage's, a persona's voice
    and instructions)."""
    from omnix.engines.duplex_engine import DuplexEngine
    from omnix.pipelines.config import DuplexArgs
    from omnix.transport.work import GenerateRequest, InputPiece

    engine = DuplexEngine(DuplexArgs(model=folder, device="cpu", tick_ms=0))
    await engine.start()

    async def pieces() -> AsyncIterator[InputPiece]:
        yield InputPiece(array=pcm, modality="audio")

    try:
        request = GenerateRequest(
            request_id="alone", stage="duplex", params=params or StageParams(), seed=0
        )
        return [o async for o in engine.generate(request, pieces()) if o.array is not None]
    finally:
        await engine.close()


def pcm16(frame: np.ndarray) -> np.ndarray:
    """A frame as omnix writes 16-bit PCM."""
    return (np.clip(frame, -1, 1) * 32767).astype(np.int16)


async def log_events(url: str, sid: str) -> list[Event]:
    """The session's request's events (``/v1/requests/{id}/events``)."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/requests/{sid}/events") as r:
        assert r.status == 200
        body = await r.read()
    return [msgspec.json.decode(f["data"], type=Event) for f in parse_sse(body)]
