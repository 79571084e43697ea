"""``omnix bench duplex``'s client: full-duplex sessions over a real WebSocket.

Owns ``talk``: one session on ``/v1/realtime?duplex=1`` (aiohttp's
WebSocket client), as vLLM-Omni's duplex clients open one
(``?autostart=0``, then ``session.update``: 24 kHz 16-bit PCM both ways,
no server VAD), then a microphone's pace: user frame ``k`` (1,920 samples,
80 ms) sent at ``start + k * 80 ms`` on a clock that does not drift with
late sends, ``session.close`` after the last one, and the socket read
until ``session.closed``.  Each frame's latency is from the moment its
``input_audio_buffer.append`` was written to the moment the model's
answer to it (the ``response.output_audio.delta`` whose
``metadata.frame`` is ``k``) was read.  ``speech`` is the audio sent: a
voiced, gliding tone, so that Mimi's codes vary frame to frame.

Does not own the server (``omnix.testing.served``), the figures
(``duplex.py``) nor the protocol's rules (``omnix.http.realtime.duplex``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

RATE = 24000
FRAME = 1920  # 80 ms at 24 kHz
FRAME_S = FRAME / RATE


def speech(frames: int, pitch: float = 140.0) -> np.ndarray:
    """``frames`` frames of a voiced, gliding tone (float32 in [-1, 1])."""
    t = np.arange(frames * FRAME) / RATE
    f0 = pitch + 20 * np.sin(2 * math.pi * 5 * t)
    phase = 2 * math.pi * np.cumsum(f0) / RATE
    voice = sum(np.sin(h * phase) / h for h in range(1, 6))
    return np.asarray(0.2 * voice, dtype=np.float32)


@dataclass
class Talk:
    """One session's record: when each frame went out and its answer came."""

    sent: dict[int, float] = field(default_factory=dict)
    answered: dict[int, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    closed: str = ""  # session.closed's reason ("" if it never came)

    def latencies_ms(self) -> list[float]:
        """Each answered frame's latency; a frame never answered is absent
        (``missing`` counts it)."""
        return [(self.answered[k] - t) * 1000 for k, t in self.sent.items() if k in self.answered]

    @property
    def missing(self) -> int:
        return sum(1 for k in self.sent if k not in self.answered)


def _frames(pcm: np.ndarray) -> list[str]:
    """``pcm`` as base64 16-bit frames (a last partial frame padded)."""
    n = math.ceil(pcm.size / FRAME)
    padded = np.pad(pcm, (0, n * FRAME - pcm.size))
    s16 = (np.clip(padded, -1, 1) * 32767).astype("<i2")
    return [base64.b64encode(s16[k * FRAME : (k + 1) * FRAME].tobytes()).decode() for k in range(n)]


async def talk(
    http: Any,
    url: str,
    model: str,
    pcm: np.ndarray,
    delay_s: float = 0.0,
    timeout_s: float = 120.0,
) -> Talk:
    """One session speaking ``pcm`` in real time, ``delay_s`` after the
    socket is open (to spread sessions' phases over a frame); its record."""
    ws_url = f"{url.replace('http', 'ws', 1)}/v1/realtime?duplex=1&model={model}&autostart=0"
    frames = _frames(pcm)
    rec = Talk()
    async with http.ws_connect(ws_url, max_msg_size=64 << 20) as ws:
        await ws.send_json(
            {
                "type": "session.update",
                "session": {
                    "model": model,
                    "input_audio_format": "pcm16",
                    "output_audio_format": "pcm16",
                    "sample_rate_hz": RATE,
                    "turn_detection": None,
                },
            }
        )
        created = asyncio.get_running_loop().create_future()
        reader = asyncio.create_task(_read(ws, rec, created))
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.wait({created, reader}, return_when=asyncio.FIRST_COMPLETED)
                if not created.done():
                    raise RuntimeError(f"no session.created: {rec.errors or 'socket closed'}")
                await asyncio.sleep(delay_s)
                start = time.perf_counter()
                for k, audio in enumerate(frames):
                    wait = start + k * FRAME_S - time.perf_counter()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    await ws.send_str(
                        json.dumps({"type": "input_audio_buffer.append", "audio": audio})
                    )
                    rec.sent[k] = time.perf_counter()
                await ws.send_json({"type": "session.close"})
                await reader
        finally:
            reader.cancel()
    return rec


async def _read(ws: Any, rec: Talk, created: asyncio.Future[None]) -> None:
    """Every server event until ``session.closed`` (or the socket's end)."""
    import aiohttp

    async for msg in ws:
        if msg.type != aiohttp.WSMsgType.TEXT:
            break
        now = time.perf_counter()
        ev = json.loads(msg.data)
        kind = ev.get("type")
        if kind == "response.output_audio.delta":
            rec.answered.setdefault(int(ev["metadata"]["frame"]), now)
        elif kind == "session.created" and not created.done():
            created.set_result(None)
        elif kind == "error":
            err = ev.get("error") or {}
            rec.errors.append(f"{err.get('code')}: {err.get('message')}")
        elif kind == "session.closed":
            rec.closed = str(ev.get("reason", ""))
            return
