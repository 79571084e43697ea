"""``omnix bench tts``'s omnix side: a real ``omnix serve PATH``, streamed speech.

Owns: starting ``omnix serve`` of the Qwen3-TTS folder (a subprocess with
its worker processes, ``omnix.testing.served``), the oracle request (the
first text, streamed, then its talker codes read back from
``/v1/requests/{id}/events``: what the server generated, not a copy made
in this process) and one measured wave of ``c`` concurrent streamed
``/v1/audio/speech`` requests, each timed by ``omnix bench serve``'s
client (``serve_client.Client``: time to the first PCM bytes, end to end,
audio seconds).  Does not own the figures (``tts.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from omnix.bench.serve_client import Client
from omnix.bench.serve_results import RequestRecord
from omnix.testing.served import ServeProcess
from omnix.testing.sse import sse_events

SAMPLE_RATE = 24000
GROUPS = 16


def extra_body(voice_args: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """The speech body's fields beside input and voice: greedy, at most
    ``max_tokens`` talker codes (``max_tokens - 1`` frames, as qwen-tts's
    ``max_new_tokens``)."""
    talker = {"temperature": 0.0, "max_tokens": max_tokens}
    return {**voice_args, "sampling_params_list": {"talker": talker}}


class Served:
    """A ready server and the client the measured requests go through."""

    def __init__(self, proc: ServeProcess, session: Any, client: Client) -> None:
        self.proc = proc
        self.session = session
        self.client = client

    async def wave(self, texts: list[str]) -> tuple[float, list[RequestRecord]]:
        """All of ``texts`` at once: (wall seconds, each request's record)."""
        t0 = time.perf_counter()
        recs = await asyncio.gather(
            *(self.client.send(i, "speech", t, t0) for i, t in enumerate(texts))
        )
        wall = time.perf_counter() - t0
        failed = [r.error for r in recs if not r.ok]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(recs)} speech requests failed: {failed[0]}")
        return wall, list(recs)

    async def codes(self, text: str) -> tuple[list[list[int]], int]:
        """One streamed request, then the talker's codes in the server's
        event log: (frames of 16 codes, PCM samples heard)."""
        c = self.client
        body = {**c._speech_body(text, "sse"), **c.extra}
        url = c.base + "/v1/audio/speech"
        samples = 0
        async with self.session.post(url, json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"POST {url}: {r.status} {(await r.read())[:300]!r}")
            rid = r.headers["X-Request-Id"]
            async for ev in sse_events(r.content):
                if ev.done:
                    break
                audio = json.loads(ev.data).get("audio")
                if audio:
                    samples += len(base64.b64decode(audio)) // 2
        flat: list[int] = []
        async with self.session.get(
            f"{c.base}/v1/requests/{rid}/events", params={"format": "object"}
        ) as r:
            async for ev in sse_events(r.content):
                e = json.loads(ev.data)
                if e.get("type") == "chunk" and e.get("stage") == "talker":
                    flat.extend(e.get("token_ids") or ())
        return [flat[i : i + GROUPS] for i in range(0, len(flat), GROUPS)], samples


@asynccontextmanager
async def serve(
    folder: Path, voice: str, extra: dict[str, Any], start_s: float, request_s: float
) -> AsyncIterator[Served]:
    """``omnix serve FOLDER`` ready, with a client that streams speech as
    SSE (``stream_format: "sse"``, PCM) in ``voice`` with ``extra``."""
    import aiohttp

    proc = await ServeProcess.start(str(folder), "--served-model-name", "tts")
    try:
        url = await proc.ready(timeout=start_s)
        args = argparse.Namespace(
            extra_body=json.dumps(extra), input_audio_seconds=0.0, sample_rate=SAMPLE_RATE,
            voice=voice, audio_format="pcm", api_key="", timeout=request_s, max_tokens=0,
            image_size="",
        )  # fmt: skip
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=request_s)
        ) as session:
            client = Client(session, url, "tts", args)
            client.speech_mode = "sse"
            yield Served(proc, session, client)
    finally:
        await proc.stop(grace_s=30)
