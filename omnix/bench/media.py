"""``omnix bench media``: what media input costs, and that it never stalls text.

Owns one measurement, over HTTP on loopback, with the client in its own
process: streamed chat completions whose time to first token (TTFT) is
taken

* for text-only requests running alone (``ttft_ms_text_alone``);
* for the same text requests while chats with one ``--image-mb`` PNG each
  arrive at a steady ``--media-rate`` per second
  (``ttft_ms_text_beside_media``; their ratio is ``beside_over_alone``:
  decoding runs in the server's media pool, so it stays near 1 while the
  machine has a core to spare; ``--media-rate 0`` sends them back to back,
  which on a small machine measures CPU saturation rather than the loop);
* for requests of the same text with one image, and with one
  ``--audio-s`` WAV clip, one at a time (``ttft_ms_image``,
  ``ttft_ms_audio``); what they add over text alone, per MB of upload, is
  the admission cost (``admission_ms_per_mb``: base64 and JSON parsing,
  decoding, resampling, hashing and storing the blob).

The default pipeline is one scripted stage that takes audio and images
(``--delay-ms`` per chunk stands in for an engine's time to its first
token), so the figures are the server's own.  ``--pipeline tiny-omni``
runs the real engines instead (its thinker's processor then adds its own
cost to the media TTFTs; keep ``--image-mb`` small, the tiny model's
context is 2,048 tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

from omnix.bench.loop import run_on_loop
from omnix.bench.pipeline_arg import load_pipeline_arg
from omnix.pipelines.config import MediaLimits, PipelineConfig, ScriptedArgs, StageConfig
from omnix.pipelines.validate import validate_pipeline
from omnix.testing.sse import chat_delta_text, sse_events
from omnix.usage import count, int_in

PROMPT = "Describe what you were given in one short sentence."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--requests", type=count, default=60, help="text requests per phase (default 60)"
    )
    parser.add_argument(
        "--media-requests",
        type=int_in(0, what="a count"),
        default=10,
        help="image and audio requests each, alone",
    )
    parser.add_argument(
        "--image-mb", type=float, default=5.0, help="size of each PNG sent (default 5 MB)"
    )
    parser.add_argument(
        "--audio-s", type=float, default=30.0, help="seconds of each WAV clip (16 kHz)"
    )
    parser.add_argument(
        "--media-rate",
        type=float,
        default=2.0,
        help="images per second sent beside the text (default 2, 10 MB/s); 0: back to back, one at a time",
    )
    parser.add_argument("--delay-ms", type=float, default=20.0, help="scripted stage: ms per chunk")
    parser.add_argument(
        "--pipeline",
        default="",
        metavar="NAME|PATH",
        help="serve this pipeline on its real engines instead",
    )


def _scripted(delay_ms: float) -> PipelineConfig:
    cfg = PipelineConfig(
        name="bench-media",
        stages=(
            StageConfig(
                name="thinker",
                engine=ScriptedArgs(chunks_per_piece=4, delay_ms=delay_ms, capacity=64),
                max_queue=10_000,
                media=MediaLimits(audio=True, image=True, max_pixels=4096 * 4096),
            ),
        ),
        outputs={"text": "thinker"},
    )
    validate_pipeline(cfg)
    return cfg


# -- the client (its own process) ------------------------------------------------


def _png(mb: float) -> bytes:
    """A PNG of noise (it does not compress) of about ``mb`` MB."""
    import numpy as np
    from PIL import Image

    side = max(8, int((mb * 1e6 / 3) ** 0.5))
    pixels = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _wav(seconds: float) -> bytes:
    from omnix.testing.media import wav_bytes

    return wav_bytes(seconds, rate=16_000)


def _body(part: dict[str, Any] | None, stream: bool = True) -> bytes:
    content: Any = PROMPT if part is None else [{"type": "text", "text": PROMPT}, part]
    return json.dumps(
        {"messages": [{"role": "user", "content": content}], "stream": stream, "max_tokens": 8}
    ).encode()


class _Client:
    """One aiohttp session posting chats to ``url``; errors are collected."""

    def __init__(self, session: Any, url: str) -> None:
        self.session = session
        self.url = url
        self.headers = {"Content-Type": "application/json"}
        self.errors: list[str] = []
        self.sent = 0  # media requests sent beside the text

    async def ttft(self, body: bytes) -> float | None:
        t0 = time.perf_counter()
        async with self.session.post(self.url, data=body, headers=self.headers) as r:
            if r.status != 200:
                self.errors.append(f"{r.status}: {(await r.text())[:200]}")
                return None
            first = None
            async for event in sse_events(r.content):
                if first is None and chat_delta_text(event.data):
                    first = time.perf_counter() - t0
            return first

    async def series(self, body: bytes, n: int) -> list[float]:
        """TTFTs (ms) of ``n`` requests, one at a time."""
        out = []
        for _ in range(n):
            t = await self.ttft(body)
            if t is not None:
                out.append(t * 1000)
        return out

    async def one_media(self, body: bytes) -> None:
        async with self.session.post(self.url, data=body, headers=self.headers) as r:
            await r.read()
            if r.status != 200:
                self.errors.append(f"media {r.status}")
        self.sent += 1

    async def media_stream(self, body: bytes, rate: float, stop: asyncio.Event) -> None:
        # A steady rate: each image leaves on schedule, however long the
        # previous one takes (back to back when the rate is 0).
        pending: set[asyncio.Task[None]] = set()
        start = time.perf_counter()
        k = 0
        while not stop.is_set():
            if rate <= 0:
                await self.one_media(body)
                continue
            task = asyncio.create_task(self.one_media(body))
            pending.add(task)
            task.add_done_callback(pending.discard)
            k += 1
            await asyncio.sleep(max(0.0, start + k / rate - time.perf_counter()))
        await asyncio.gather(*pending)

    async def beside_media(
        self, text: bytes, n: int, media: bytes, rate: float
    ) -> tuple[list[float], float]:
        """TTFTs of ``n`` text requests while media requests arrive at
        ``rate`` per second; and the media rate achieved."""
        stop = asyncio.Event()
        stream = asyncio.create_task(self.media_stream(media, rate, stop))
        await asyncio.sleep(1.0)  # the media stream is steady before text starts
        t0 = time.perf_counter()
        beside = await self.series(text, n)
        media_rate = self.sent / (time.perf_counter() - t0 + 1.0)
        stop.set()
        await stream
        return beside, media_rate


async def _client(url: str, args: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    png = _png(args["image_mb"])
    wav = _wav(args["audio_s"])
    image_part = {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()},
    }
    audio_part = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"},
    }
    text, image, audio = _body(None), _body(image_part), _body(audio_part)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        c = _Client(session, url)
        await c.series(text, 5)  # warm up connections and code paths
        await c.series(image, 1)
        await c.series(audio, 1)
        alone = await c.series(text, args["requests"])
        images = await c.series(image, args["media_requests"])
        audios = await c.series(audio, args["media_requests"])
        media = _body(image_part, stream=False)
        beside, media_rate = await c.beside_media(text, args["requests"], media, args["media_rate"])
    return {
        "alone": alone,
        "beside": beside,
        "image": images,
        "audio": audios,
        "image_mb": len(png) / 1e6,
        "audio_mb": len(wav) / 1e6,
        "media_per_s": media_rate,
        "errors": c.errors,
    }


def _client_main(url: str, args: dict[str, Any], out: Any) -> None:
    out.put(asyncio.run(_client(url, args)))


# -- the server (this process) ---------------------------------------------------


def _p50(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 2) if xs else None


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from omnix.testing.serving import serve_scripted

    real = bool(args.pipeline)
    cfg = load_pipeline_arg(args.pipeline) if real else _scripted(args.delay_ms)
    async with serve_scripted(cfg, processes=real) as server:
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        client_args = {
            "requests": args.requests,
            "media_requests": args.media_requests,
            "image_mb": args.image_mb,
            "audio_s": args.audio_s,
            "media_rate": args.media_rate,
        }
        proc = ctx.Process(
            target=_client_main,
            args=(server.url + "/v1/chat/completions", client_args, out),
            daemon=True,
        )
        proc.start()
        # Wait on a thread: the server keeps serving on this loop.
        res = await asyncio.to_thread(out.get, True, 3600)
        await asyncio.to_thread(proc.join, 10)
    alone, beside = _p50(res["alone"]), _p50(res["beside"])
    image, audio = _p50(res["image"]), _p50(res["audio"])
    per_mb = None
    if alone is not None and image is not None:
        per_mb = round((image - alone) / res["image_mb"], 2)
    return {
        "ttft_ms_text_alone": alone,
        "ttft_ms_text_beside_media": beside,
        "admission_ms_per_mb": per_mb,
        "beside_over_alone": round(beside / alone, 3) if alone and beside else None,
        "ttft_ms_image": image,
        "ttft_ms_audio": audio,
        "audio_admission_ms_per_mb": (
            round((audio - alone) / res["audio_mb"], 2)
            if alone is not None and audio is not None
            else None
        ),
        "image_mb": round(res["image_mb"], 2),
        "audio_mb": round(res["audio_mb"], 2),
        "media_requests_per_s_beside": round(res["media_per_s"], 2),
        "requests": args.requests,
        "pipeline": cfg.name,
        "errors": len(res["errors"]),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def run(args: argparse.Namespace) -> int:
    res = run_on_loop(_bench(args))
    if not getattr(args, "json", False):
        print(
            f"text TTFT p50 {res['ttft_ms_text_alone']} ms alone, {res['ttft_ms_text_beside_media']} ms "
            f"beside {res['media_requests_per_s_beside']} x {res['image_mb']} MB images/s "
            f"(x{res['beside_over_alone']})"
        )
        print(
            f"with one image: {res['ttft_ms_image']} ms ({res['admission_ms_per_mb']} ms per MB); "
            f"with {res['audio_mb']} MB of audio: {res['ttft_ms_audio']} ms; pipeline {res['pipeline']}; "
            f"load {res['load_avg_1m']}"
        )
    print(json.dumps(res))
    if res["errors"]:
        print(f"{res['errors']} requests failed", file=sys.stderr)
        return 1
    return 0
