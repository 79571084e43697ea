"""``omnix bench serve``'s requests: building each one, sending it and timing it.

Owns: the kinds of request (``Kind``: streamed chat, chat with audio out,
chat with an input_audio part, speech, images) and their bodies, the
speech stream modes and their probe, ``Client.send`` (one request to one
``RequestRecord``: its failure, if any, as one line) and ``Measure``, the
clock readings of one request (TTFT, ITL, TTFP, audio seconds).  Does not
own parsing bodies (``serve_wire``), counting audio (``audio_meter``) nor
the run's pacing (``serve_run``).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import time
import wave
from typing import Any, Literal

import numpy as np

from omnix.bench.audio_meter import AudioMeter
from omnix.bench.serve_results import RequestRecord
from omnix.bench.serve_wire import (
    ChatChunk,
    RequestFailed,
    Usage,
    b64_audio,
    chunk_decoder,
    decode_body,
    error_text,
    http_error,
    images_decoder,
    one_line,
    speech_decoder,
    unreachable,
)
from omnix.testing.sse import sse_events

Kind = Literal["text", "audio-out", "audio-in", "speech", "image"]
KINDS: tuple[Kind, ...] = ("text", "audio-out", "audio-in", "speech", "image")
SpeechMode = Literal["audio", "sse", "stream", "none"]
#: ``--speech-stream auto`` tries these in order (see ``Client.probe_speech``).
_PROBE_ORDER: tuple[SpeechMode, ...] = ("audio", "stream", "none")


class Measure:
    """The clock readings of one request."""

    def __init__(self, sample_rate: int) -> None:
        self.t0 = time.perf_counter()
        self.ttft: float | None = None
        self.last_text = 0.0
        self.itl: list[float] = []
        self.text_chunks = 0
        self.ttfp: float | None = None
        self.last_audio = 0.0
        self.audio = AudioMeter(sample_rate)
        self.usage: Usage | None = None
        self.images = 0
        self.status = 0

    def text(self, content: str) -> None:
        if not content:
            return
        now = time.perf_counter() - self.t0
        if self.ttft is None:
            self.ttft = now
        else:
            self.itl.append(now - self.last_text)
        self.last_text = now
        self.text_chunks += 1

    def audio_bytes(self, data: bytes) -> None:
        before = self.audio.sample_bytes
        self.audio.feed(data)
        if self.audio.sample_bytes > before:
            now = time.perf_counter() - self.t0
            if self.ttfp is None:
                self.ttfp = now
            self.last_audio = now


class Client:
    """Builds and sends the requests of one run."""

    def __init__(self, session: Any, base_url: str, model: str, args: argparse.Namespace) -> None:
        self.session = session
        self.base = base_url
        self.model = model
        self.args = args
        self.extra: dict[str, Any] = json.loads(args.extra_body) if args.extra_body else {}
        self.speech_mode: SpeechMode = "none"
        self._input_wav = base64.b64encode(_sine_wav(args.input_audio_seconds)).decode("ascii")

    # -- bodies ---------------------------------------------------------------
    def _chat_body(self, kind: Kind, prompt: str) -> dict[str, Any]:
        content: Any = prompt
        if kind == "audio-in":
            content = [
                {"type": "text", "text": prompt},
                {"type": "input_audio", "input_audio": {"data": self._input_wav, "format": "wav"}},
            ]
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.args.max_tokens:
            body["max_completion_tokens"] = self.args.max_tokens
        if kind == "audio-out":
            fmt = "pcm16" if self.args.audio_format == "pcm" else "wav"
            body["modalities"] = ["text", "audio"]
            body["audio"] = {"format": fmt, "voice": self.args.voice}
        return {**body, **self.extra}

    def _speech_body(self, prompt: str, mode: SpeechMode) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "input": prompt,
            "voice": self.args.voice,
            "response_format": self.args.audio_format,
        }
        if mode in ("audio", "sse"):
            body["stream_format"] = mode
        elif mode == "stream":
            body["stream"] = True
        return {**body, **self.extra}

    def _image_body(self, prompt: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "n": 1}
        body["response_format"] = "b64_json"
        if self.args.image_size:
            body["size"] = self.args.image_size
        return {**body, **self.extra}

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.args.api_key:
            headers["Authorization"] = f"Bearer {self.args.api_key}"
        return headers

    # -- one request ------------------------------------------------------------
    async def send(self, index: int, kind: Kind, prompt: str, t_run: float) -> RequestRecord:
        import aiohttp

        m = Measure(self.args.sample_rate)
        rec = RequestRecord(index=index, kind=kind, ok=False, start_s=m.t0 - t_run)
        try:
            if kind == "speech":
                await self._speech(m, prompt, self.speech_mode)
            elif kind == "image":
                await self._image(m, prompt)
            else:
                await self._chat(m, kind, prompt)
            rec.ok = True
        except RequestFailed as exc:
            rec.error = str(exc)
        except aiohttp.ClientConnectorError as exc:
            rec.error = unreachable(self.base, exc)
        except aiohttp.ClientPayloadError as exc:
            rec.error = one_line(f"response cut mid-body: {exc}")
        except TimeoutError:
            rec.error = f"no complete response within {self.args.timeout:g} s"
        except aiohttp.ClientError as exc:
            rec.error = one_line(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # one odd response must not end the run
            rec.error = one_line(f"client error: {type(exc).__name__}: {exc}")
        rec.e2el_s = time.perf_counter() - m.t0
        rec.status = m.status
        rec.ttft_s = m.ttft
        rec.itl_s = m.itl
        rec.ttfp_s = m.ttfp
        rec.audio_s = m.audio.seconds
        rec.images = m.images
        if m.usage is not None:
            rec.prompt_tokens = m.usage.prompt_tokens or m.usage.input_tokens or 0
            rec.output_tokens = m.usage.completion_tokens or m.usage.output_tokens or 0
        if kind != "speech" and kind != "image" and not rec.output_tokens:
            rec.output_tokens = m.text_chunks
        if m.ttft is not None and rec.output_tokens > 1:
            rec.tpot_s = (m.last_text - m.ttft) / (rec.output_tokens - 1)
        if rec.audio_s > 0:
            rec.audio_rtf = m.last_audio / rec.audio_s
        return rec

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        return self.session.post(
            self.base + path, data=json.dumps(body).encode(), headers=self._headers()
        )

    async def _chat(self, m: Measure, kind: Kind, prompt: str) -> None:
        async with self._post("/v1/chat/completions", self._chat_body(kind, prompt)) as r:
            m.status = r.status
            if r.status != 200:
                raise RequestFailed(http_error(r.status, await r.read()))
            if r.content_type == "application/json":  # a server that does not stream
                self._chat_chunk(m, decode_body(chunk_decoder, await r.read()))
            else:
                async for event in sse_events(r.content):
                    if event.done:
                        break
                    self._chat_chunk(m, decode_body(chunk_decoder, event.data.encode()))
        if m.ttft is None:
            raise RequestFailed("the response carried no text (no non-empty delta.content)")
        if kind == "audio-out" and m.audio.sample_bytes == 0:
            raise RequestFailed("the response carried no audio (no delta.audio.data)")

    def _chat_chunk(self, m: Measure, chunk: ChatChunk) -> None:
        if chunk.error is not None:
            raise RequestFailed(one_line(f"error in stream: {error_text(chunk.error)}"))
        u = chunk.usage
        # vLLM-Omni puts usage (completion 0) on audio chunks too: keep the largest.
        if u is not None and (u.completion_tokens or 0) >= (
            (m.usage.completion_tokens or 0) if m.usage is not None else 0
        ):
            if u.completion_tokens or u.prompt_tokens:
                m.usage = u
        for choice in (chunk.choices or ())[:1]:
            part = choice.delta or choice.message
            if part is None:
                continue
            if chunk.modality == "audio" and part.content:
                m.audio_bytes(b64_audio(part.content))
                continue
            if part.content:
                m.text(part.content)
            if part.audio is not None and part.audio.data:
                m.audio_bytes(b64_audio(part.audio.data))

    async def _speech(self, m: Measure, prompt: str, mode: SpeechMode) -> None:
        async with self._post("/v1/audio/speech", self._speech_body(prompt, mode)) as r:
            m.status = r.status
            if r.status != 200:
                raise RequestFailed(http_error(r.status, await r.read()))
            if r.content_type == "text/event-stream":
                async for event in sse_events(r.content):
                    if event.done:
                        break
                    ev = decode_body(speech_decoder, event.data.encode())
                    if ev.error is not None or ev.type == "error":
                        raise RequestFailed(one_line(f"error in stream: {error_text(ev.error)}"))
                    if ev.audio:
                        m.audio_bytes(b64_audio(ev.audio))
            elif r.content_type == "application/json":
                raise RequestFailed(
                    one_line(f"expected audio, got JSON: {(await r.read())[:200]!r}")
                )
            else:
                async for piece in r.content.iter_any():
                    m.audio_bytes(piece)
        if m.audio.sample_bytes == 0:
            raise RequestFailed("the response carried no audio")

    async def _image(self, m: Measure, prompt: str) -> None:
        async with self._post("/v1/images/generations", self._image_body(prompt)) as r:
            m.status = r.status
            raw = await r.read()
            if r.status != 200:
                raise RequestFailed(http_error(r.status, raw))
        body = decode_body(images_decoder, raw)
        m.images = sum(1 for img in body.data if img.b64_json or img.url)
        if not m.images:
            raise RequestFailed("the response carried no image")

    async def probe_speech(self) -> SpeechMode:
        """The first of audio / stream / none the server does not refuse
        with 400 or 422 (one short request each, not measured)."""
        for mode in _PROBE_ORDER:
            async with self._post("/v1/audio/speech", self._speech_body("Hello.", mode)) as r:
                await r.read()
                if r.status not in (400, 422):
                    return mode
        return "none"


def _sine_wav(seconds: float, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    samples = (0.3 * np.sin(2 * np.pi * 440.0 * t) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return buf.getvalue()
