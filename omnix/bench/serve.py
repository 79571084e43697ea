"""``omnix bench serve``: a load generator a user points at a live server.

Owns: what ``vllm bench serve`` does not measure, against any
OpenAI-compatible server (omnix, vLLM, vLLM-Omni): streamed chat (text),
chat with audio output (``modalities: ["text", "audio"]``), chat with an
audio input part (a short generated WAV), speech (``/v1/audio/speech``,
streamed where the server streams it) and image generation, sent at a
bounded ``--concurrency`` and/or a Poisson ``--request-rate`` (seeded), and
the figures of the run: percentiles of TTFT, TPOT, ITL, TTFP (first audio),
audio RTF and E2EL, throughput, failures with their first messages.  JSON
keys follow ``vllm bench serve`` where it has one (``completed``,
``mean_ttft_ms``, ``p99_e2el_ms``...) and vLLM-Omni's for audio
(``mean_audio_ttfp_ms``, ``mean_audio_rtf``, ``audio_throughput``).

Definitions (per request; the clock starts when the request is sent):

* TTFT: first chunk with non-empty text (``delta.content``).  vLLM's bench
  counts the first chunk with any choice, which omnix sends at admission
  (the role chunk), so it would measure admission, not the first token.
* ITL: gaps between successive text chunks; TPOT: (last text chunk - TTFT)
  / (output tokens - 1), tokens from ``usage`` (``stream_options``), else
  the number of text chunks.
* TTFP: first audio *sample* bytes (past any WAV header); audio seconds
  from the WAV header's rate (``pcm``: ``--sample-rate``); RTF: (last audio
  byte - start) / audio seconds.
* E2EL: until the response ended.

Does not own the server nor any omnix internals: it only speaks HTTP, so it
imports nothing from the product.  A request the server refuses or fails
(e.g. an ``input_audio`` part a server does not take) is counted in
``failed`` with its message; nothing is worked around.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import math
import os
import random
import struct
import sys
import time
import wave
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec
import numpy as np

from omnix.bench.loop import run_on_loop
from omnix.testing.sse import sse_events

Kind = Literal["text", "audio-out", "audio-in", "speech", "image"]
KINDS: tuple[Kind, ...] = ("text", "audio-out", "audio-in", "speech", "image")
SpeechMode = Literal["audio", "sse", "stream", "none"]
#: ``--speech-stream auto`` tries these in order (see ``_probe_speech``).
_PROBE_ORDER: tuple[SpeechMode, ...] = ("audio", "stream", "none")
#: How many distinct error messages the summary keeps.
FIRST_ERRORS = 5

_WORDS = (
    (
        "the quick brown fox jumps over a lazy dog while seven bright stars shine "
        "above quiet rivers and distant mountains where travellers tell old stories "
        "about music, weather, gardens, trains, bridges, lanterns and small cities"
    )
    .replace(",", "")
    .split()
)


# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------


class RequestRecord(msgspec.Struct, kw_only=True):
    """One request as the client saw it (seconds; None where not measured)."""

    index: int
    kind: str
    ok: bool
    error: str = ""
    status: int = 0
    start_s: float = 0.0  # since the run started
    e2el_s: float = 0.0
    ttft_s: float | None = None
    tpot_s: float | None = None
    itl_s: list[float] = []
    ttfp_s: float | None = None
    audio_s: float = 0.0
    audio_rtf: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    images: int = 0


class KindSummary(msgspec.Struct, kw_only=True):
    completed: int = 0
    failed: int = 0
    mean_e2el_ms: float | None = None


class ServeBenchSummary(msgspec.Struct, kw_only=True):
    """What ``--json`` prints.  Latency stats are None without samples."""

    date: str
    base_url: str
    model_id: str
    kind: str
    kinds: list[str]
    num_prompts: int
    request_rate: float | str  # "inf" as vLLM writes it
    max_concurrency: int | None
    seed: int
    speech_stream: str  # the speech mode used ("" when no speech was sent)
    duration: float
    completed: int
    failed: int
    first_errors: list[str]
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    total_audio_duration_s: float
    audio_throughput: float  # audio seconds per second
    total_images: int
    image_throughput: float
    per_kind: dict[str, KindSummary]
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    std_ttft_ms: float | None = None
    p50_ttft_ms: float | None = None
    p90_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    std_tpot_ms: float | None = None
    p50_tpot_ms: float | None = None
    p90_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    std_itl_ms: float | None = None
    p50_itl_ms: float | None = None
    p90_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    mean_e2el_ms: float | None = None
    median_e2el_ms: float | None = None
    std_e2el_ms: float | None = None
    p50_e2el_ms: float | None = None
    p90_e2el_ms: float | None = None
    p99_e2el_ms: float | None = None
    mean_audio_ttfp_ms: float | None = None
    median_audio_ttfp_ms: float | None = None
    std_audio_ttfp_ms: float | None = None
    p50_audio_ttfp_ms: float | None = None
    p90_audio_ttfp_ms: float | None = None
    p99_audio_ttfp_ms: float | None = None
    mean_audio_rtf: float | None = None
    median_audio_rtf: float | None = None
    std_audio_rtf: float | None = None
    p50_audio_rtf: float | None = None
    p90_audio_rtf: float | None = None
    p99_audio_rtf: float | None = None
    mean_audio_duration_s: float | None = None
    median_audio_duration_s: float | None = None
    std_audio_duration_s: float | None = None
    p50_audio_duration_s: float | None = None
    p90_audio_duration_s: float | None = None
    p99_audio_duration_s: float | None = None


class ServeBenchResult(ServeBenchSummary, kw_only=True):
    """What ``--result-file`` saves: the summary plus every request."""

    requests: list[RequestRecord] = []


#: (key stem, what it is in seconds -> reported scale)
_STATS: tuple[tuple[str, float], ...] = (
    ("ttft_ms", 1000.0),
    ("tpot_ms", 1000.0),
    ("itl_ms", 1000.0),
    ("e2el_ms", 1000.0),
    ("audio_ttfp_ms", 1000.0),
    ("audio_rtf", 1.0),
    ("audio_duration_s", 1.0),
)


def _stats(stem: str, values: list[float], scale: float) -> dict[str, float | None]:
    if not values:
        return {}
    arr = np.asarray(values, dtype=np.float64) * scale
    p50, p90, p99 = (float(v) for v in np.percentile(arr, [50, 90, 99]))
    return {
        f"mean_{stem}": float(arr.mean()),
        f"median_{stem}": p50,
        f"std_{stem}": float(arr.std()),
        f"p50_{stem}": p50,
        f"p90_{stem}": p90,
        f"p99_{stem}": p99,
    }


# --------------------------------------------------------------------------
# Parsing what servers send
# --------------------------------------------------------------------------


class _ErrorObj(msgspec.Struct):
    message: str = ""
    type: str = ""
    code: str | int | None = None


class _AudioDelta(msgspec.Struct):
    data: str | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    audio: _AudioDelta | None = None


class _Message(msgspec.Struct):
    content: str | None = None
    audio: _AudioDelta | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    message: _Message | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


class _ChatChunk(msgspec.Struct):
    """A ``chat.completion(.chunk)`` as any server sends it; unknown fields
    are ignored.  ``modality`` is vLLM-Omni's: its audio chunks carry the
    base64 audio in ``delta.content``."""

    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: _ErrorObj | str | None = None
    modality: str | None = None


class _SpeechEvent(msgspec.Struct):
    type: str = ""
    audio: str | None = None
    error: _ErrorObj | str | None = None


class _Image(msgspec.Struct):
    b64_json: str | None = None
    url: str | None = None


class _ImagesBody(msgspec.Struct):
    data: list[_Image] = []


class _ModelCard(msgspec.Struct):
    id: str


class _ModelList(msgspec.Struct):
    data: list[_ModelCard] = []


class _ErrorBody(msgspec.Struct):
    """OpenAI's ``{"error": {...}}``, vLLM's ``{"message": ...}``,
    FastAPI's ``{"detail": ...}``."""

    error: _ErrorObj | str | None = None
    message: str | None = None
    detail: Any = None


_chunk_dec = msgspec.json.Decoder(_ChatChunk)
_speech_dec = msgspec.json.Decoder(_SpeechEvent)
_images_dec = msgspec.json.Decoder(_ImagesBody)
_models_dec = msgspec.json.Decoder(_ModelList)
_error_dec = msgspec.json.Decoder(_ErrorBody)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error_text(err: _ErrorObj | str | None) -> str:
    if isinstance(err, _ErrorObj):
        return err.message or err.type or str(err.code or "")
    return err or ""


def _unreachable(base: str, exc: Any) -> str:
    """``ClientConnectorError`` as "cannot reach URL: Connection refused"."""
    os_error = getattr(exc, "os_error", None)
    errno = getattr(os_error, "errno", None)
    # uvloop's strerror is "Connect call failed (...)": name the errno instead.
    why = os.strerror(errno) if isinstance(errno, int) and errno > 0 else ""
    why = why or getattr(os_error, "strerror", None) or str(os_error or exc)
    return _one_line(f"cannot reach {base}: {why}")


def _http_error(status: int, body: bytes) -> str:
    msg = ""
    try:
        eb = _error_dec.decode(body)
        msg = _error_text(eb.error) or eb.message or (str(eb.detail) if eb.detail else "")
    except msgspec.DecodeError:
        msg = body.decode("utf-8", "replace")
    return _one_line(f"HTTP {status}: {msg}" if msg else f"HTTP {status}")


class AudioMeter:
    """Counts the audio seconds in a byte stream as it arrives.

    A stream that starts with a RIFF/WAVE header is read as WAV (rate,
    channels and sample width from its ``fmt`` chunk; the data chunk's
    size is ignored: streamed WAV headers say 0xFFFFFFFF); a piece that
    starts a new RIFF header starts a new WAV (servers that send each
    chunk as a file of its own).  Anything else is raw 16-bit mono PCM at
    ``sample_rate``."""

    def __init__(self, sample_rate: int) -> None:
        self.default_rate = sample_rate
        self.seconds = 0.0
        self.sample_bytes = 0
        self._head = b""  # header bytes not parsed yet
        self._in_data = False
        self._bytes_per_s = float(sample_rate * 2)

    def feed(self, piece: bytes) -> None:
        if not piece:
            return
        if self._in_data and piece[:4] == b"RIFF" and piece[8:12] == b"WAVE":
            self._in_data = False
            self._head = b""
        if self._in_data:
            self._add(len(piece))
            return
        self._head += piece
        head = self._head
        if len(head) < 12:
            if b"RIFF".startswith(head[:4]):
                return  # wait for the rest of a possible header
        if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            self._bytes_per_s = float(self.default_rate * 2)
            self._in_data = True
            self._head = b""
            self._add(len(head))
            return
        pos = 12
        while pos + 8 <= len(head):
            cid = head[pos : pos + 4]
            (size,) = struct.unpack("<I", head[pos + 4 : pos + 8])
            if cid == b"data":
                self._in_data = True
                self._head = b""
                self._add(len(head) - pos - 8)
                return
            if cid == b"fmt " and pos + 8 + 16 <= len(head):
                _, channels, rate, _, _, bits = struct.unpack("<HHIIHH", head[pos + 8 : pos + 24])
                self._bytes_per_s = float(max(1, rate * channels * max(1, bits // 8)))
            pos += 8 + size + (size & 1)

    def _add(self, n: int) -> None:
        if n > 0:
            self.sample_bytes += n
            self.seconds += n / self._bytes_per_s


# --------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------


class _Failure(Exception):
    """A request failed; the message is the one line reported."""


class _Measure:
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
        self.usage: _Usage | None = None
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

        m = _Measure(self.args.sample_rate)
        rec = RequestRecord(index=index, kind=kind, ok=False, start_s=m.t0 - t_run)
        try:
            if kind == "speech":
                await self._speech(m, prompt, self.speech_mode)
            elif kind == "image":
                await self._image(m, prompt)
            else:
                await self._chat(m, kind, prompt)
            rec.ok = True
        except _Failure as exc:
            rec.error = str(exc)
        except aiohttp.ClientConnectorError as exc:
            rec.error = _unreachable(self.base, exc)
        except aiohttp.ClientPayloadError as exc:
            rec.error = _one_line(f"response cut mid-body: {exc}")
        except TimeoutError:
            rec.error = f"no complete response within {self.args.timeout:g} s"
        except aiohttp.ClientError as exc:
            rec.error = _one_line(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # one odd response must not end the run
            rec.error = _one_line(f"client error: {type(exc).__name__}: {exc}")
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

    async def _chat(self, m: _Measure, kind: Kind, prompt: str) -> None:
        async with self._post("/v1/chat/completions", self._chat_body(kind, prompt)) as r:
            m.status = r.status
            if r.status != 200:
                raise _Failure(_http_error(r.status, await r.read()))
            if r.content_type == "application/json":  # a server that does not stream
                self._chat_chunk(m, _decode(_chunk_dec, await r.read()))
            else:
                async for event in sse_events(r.content):
                    if event.done:
                        break
                    self._chat_chunk(m, _decode(_chunk_dec, event.data.encode()))
        if m.ttft is None:
            raise _Failure("the response carried no text (no non-empty delta.content)")
        if kind == "audio-out" and m.audio.sample_bytes == 0:
            raise _Failure("the response carried no audio (no delta.audio.data)")

    def _chat_chunk(self, m: _Measure, chunk: _ChatChunk) -> None:
        if chunk.error is not None:
            raise _Failure(_one_line(f"error in stream: {_error_text(chunk.error)}"))
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
                m.audio_bytes(_b64(part.content))
                continue
            if part.content:
                m.text(part.content)
            if part.audio is not None and part.audio.data:
                m.audio_bytes(_b64(part.audio.data))

    async def _speech(self, m: _Measure, prompt: str, mode: SpeechMode) -> None:
        async with self._post("/v1/audio/speech", self._speech_body(prompt, mode)) as r:
            m.status = r.status
            if r.status != 200:
                raise _Failure(_http_error(r.status, await r.read()))
            if r.content_type == "text/event-stream":
                async for event in sse_events(r.content):
                    if event.done:
                        break
                    ev = _decode(_speech_dec, event.data.encode())
                    if ev.error is not None or ev.type == "error":
                        raise _Failure(_one_line(f"error in stream: {_error_text(ev.error)}"))
                    if ev.audio:
                        m.audio_bytes(_b64(ev.audio))
            elif r.content_type == "application/json":
                raise _Failure(_one_line(f"expected audio, got JSON: {(await r.read())[:200]!r}"))
            else:
                async for piece in r.content.iter_any():
                    m.audio_bytes(piece)
        if m.audio.sample_bytes == 0:
            raise _Failure("the response carried no audio")

    async def _image(self, m: _Measure, prompt: str) -> None:
        async with self._post("/v1/images/generations", self._image_body(prompt)) as r:
            m.status = r.status
            raw = await r.read()
            if r.status != 200:
                raise _Failure(_http_error(r.status, raw))
        body = _decode(_images_dec, raw)
        m.images = sum(1 for img in body.data if img.b64_json or img.url)
        if not m.images:
            raise _Failure("the response carried no image")

    async def probe_speech(self) -> SpeechMode:
        """The first of audio / stream / none the server does not refuse
        with 400 or 422 (one short request each, not measured)."""
        for mode in _PROBE_ORDER:
            async with self._post("/v1/audio/speech", self._speech_body("Hello.", mode)) as r:
                await r.read()
                if r.status not in (400, 422):
                    return mode
        return "none"


def _decode(decoder: Any, raw: bytes) -> Any:
    try:
        return decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise _Failure(_one_line(f"unreadable response ({exc}): {raw[:120]!r}")) from None


def _b64(data: str) -> bytes:
    try:
        return base64.b64decode(data)
    except ValueError as exc:
        raise _Failure(f"audio data is not base64: {exc}") from None


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


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------


class BenchError(Exception):
    """The run cannot start (unreachable server, no model...): one line."""


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _kinds(args: argparse.Namespace) -> list[Kind]:
    if args.kind != "mix":
        return [args.kind]
    out: list[Kind] = []
    for name in args.mix.split(","):
        name = name.strip()
        if name not in KINDS:
            raise BenchError(f"--mix: unknown kind {name!r} (kinds: {', '.join(KINDS)})")
        out.append(name)
    if not out:
        raise BenchError("--mix names no kind")
    return out


def _prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, words))).capitalize() + "."


class _Progress:
    """tqdm on stderr where installed, else a one-line counter."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled
        self.done = self.failed = 0
        self._bar: Any = None
        self._last = 0.0
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, file=sys.stderr, desc="requests", unit="req")

    def update(self, ok: bool) -> None:
        self.done += 1
        self.failed += not ok
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(1)
            if self.failed:
                self._bar.set_postfix(failed=self.failed, refresh=False)
            return
        now = time.monotonic()
        if now - self._last > 0.2 or self.done == self.total:
            self._last = now
            print(
                f"\r[bench serve] {self.done}/{self.total} requests, {self.failed} failed",
                end="\n" if self.done == self.total else "",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


async def _first_model(session: Any, base: str, headers: dict[str, str]) -> str:
    import aiohttp

    url = base + "/v1/models"
    try:
        async with session.get(url, headers=headers) as r:
            raw = await r.read()
            if r.status != 200:
                raise BenchError(f"GET {url}: {_http_error(r.status, raw)}; pass --model")
    except aiohttp.ClientConnectorError as exc:
        raise BenchError(_unreachable(base, exc)) from None
    except aiohttp.ClientError as exc:
        raise BenchError(_one_line(f"GET {url}: {type(exc).__name__}: {exc}")) from None
    try:
        models = _models_dec.decode(raw)
    except msgspec.DecodeError:
        raise BenchError(f"GET {url}: not a model list; pass --model") from None
    if not models.data:
        raise BenchError(f"GET {url}: the server lists no model; pass --model")
    return models.data[0].id


async def bench(
    args: argparse.Namespace, on_progress: Callable[[RequestRecord], None] | None = None
) -> ServeBenchResult:
    """Run the benchmark ``args`` describes on the running loop."""
    import aiohttp

    base = _base_url(args.base_url)
    kinds = _kinds(args)
    if args.extra_body:
        try:
            if not isinstance(json.loads(args.extra_body), dict):
                raise ValueError("not an object")
        except ValueError as exc:
            raise BenchError(f"--extra-body must be a JSON object: {exc}") from None
    rng = random.Random(args.seed)
    plan = [
        (
            kinds[rng.randrange(len(kinds))] if len(kinds) > 1 else kinds[0],
            _prompt(rng, args.prompt_words),
        )
        for _ in range(args.num_prompts)
    ]
    rate = float(args.request_rate)
    gaps = [rng.expovariate(rate) if math.isfinite(rate) else 0.0 for _ in plan]
    limit = args.concurrency or 0
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    connector = aiohttp.TCPConnector(limit=limit)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        model = args.model or await _first_model(session, base, headers)
        client = Client(session, base, model, args)
        speech = ""
        if "speech" in {k for k, _ in plan}:
            if args.speech_stream == "auto":
                try:
                    client.speech_mode = await client.probe_speech()
                except aiohttp.ClientConnectorError as exc:
                    raise BenchError(_unreachable(base, exc)) from None
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise BenchError(
                        _one_line(f"speech probe: {type(exc).__name__}: {exc}")
                    ) from None
            else:
                client.speech_mode = args.speech_stream
            speech = client.speech_mode
        progress = _Progress(len(plan), not args.no_progress)
        sem = asyncio.Semaphore(limit) if limit else None
        t_run = time.perf_counter()

        async def one(i: int, kind: Kind, prompt: str) -> RequestRecord:
            if sem is None:
                rec = await client.send(i, kind, prompt, t_run)
            else:
                async with sem:
                    rec = await client.send(i, kind, prompt, t_run)
            progress.update(rec.ok)
            if on_progress is not None:
                on_progress(rec)
            return rec

        tasks = []
        try:
            for i, ((kind, prompt), gap) in enumerate(zip(plan, gaps, strict=True)):
                if gap > 0 and i > 0:
                    await asyncio.sleep(gap)
                tasks.append(asyncio.ensure_future(one(i, kind, prompt)))
            records = list(await asyncio.gather(*tasks))
        finally:
            for t in tasks:
                t.cancel()
            progress.close()
        duration = time.perf_counter() - t_run
    return _summarize(args, base, model, kinds, speech, records, duration)


def _first_errors(failed: list[RequestRecord]) -> list[str]:
    """The first distinct messages, each with how many requests got it."""
    counts: dict[tuple[str, str], int] = {}
    for r in failed:
        counts[(r.kind, r.error)] = counts.get((r.kind, r.error), 0) + 1
    return [
        f"{kind} ({n} requests): {msg}" for (kind, msg), n in list(counts.items())[:FIRST_ERRORS]
    ]


def _summarize(
    args: argparse.Namespace,
    base: str,
    model: str,
    kinds: list[Kind],
    speech: str,
    records: list[RequestRecord],
    duration: float,
) -> ServeBenchResult:
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    dur = max(duration, 1e-9)
    total_in = sum(r.prompt_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    audio = sum(r.audio_s for r in ok)
    images = sum(r.images for r in ok)
    samples: dict[str, list[float]] = {
        "ttft_ms": [r.ttft_s for r in ok if r.ttft_s is not None],
        "tpot_ms": [r.tpot_s for r in ok if r.tpot_s is not None],
        "itl_ms": [x for r in ok for x in r.itl_s],
        "e2el_ms": [r.e2el_s for r in ok],
        "audio_ttfp_ms": [r.ttfp_s for r in ok if r.ttfp_s is not None],
        "audio_rtf": [r.audio_rtf for r in ok if r.audio_rtf is not None],
        "audio_duration_s": [r.audio_s for r in ok if r.audio_s > 0],
    }
    stats: dict[str, float | None] = {}
    for stem, scale in _STATS:
        stats.update(_stats(stem, samples[stem], scale))
    per_kind: dict[str, KindSummary] = {}
    for kind in dict.fromkeys(r.kind for r in records):
        mine = [r for r in records if r.kind == kind]
        good = [r.e2el_s for r in mine if r.ok]
        per_kind[kind] = KindSummary(
            completed=len(good),
            failed=len(mine) - len(good),
            mean_e2el_ms=float(np.mean(good)) * 1000.0 if good else None,
        )
    rate = float(args.request_rate)
    res = ServeBenchResult(
        date=datetime.now(UTC).strftime("%Y%m%d-%H%M%S"),
        base_url=base,
        model_id=model,
        kind=args.kind,
        kinds=list(kinds),
        num_prompts=len(records),
        request_rate=rate if math.isfinite(rate) else "inf",
        max_concurrency=args.concurrency or None,
        seed=args.seed,
        speech_stream=speech,
        duration=duration,
        completed=len(ok),
        failed=len(failed),
        first_errors=_first_errors(failed),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=len(ok) / dur,
        output_throughput=total_out / dur,
        total_token_throughput=(total_in + total_out) / dur,
        total_audio_duration_s=audio,
        audio_throughput=audio / dur,
        total_images=images,
        image_throughput=images / dur,
        per_kind=per_kind,
        requests=sorted(records, key=lambda r: r.index),
    )
    for key, value in stats.items():
        setattr(res, key, value)
    return res


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def _table(res: ServeBenchSummary) -> str:
    lines = ["{s:{c}^{n}}".format(s=" omnix bench serve ", n=56, c="=")]

    def row(label: str, value: Any, fmt: str = "") -> None:
        lines.append(f"{label:<42} {format(value, fmt) if value is not None else '-'}")

    row("Server / model:", f"{res.base_url} / {res.model_id}")
    row(
        "Kinds:",
        ", ".join(res.kinds) + (f" (speech: {res.speech_stream})" if res.speech_stream else ""),
    )
    row("Successful requests:", res.completed)
    row("Failed requests:", res.failed)
    row("Maximum request concurrency:", res.max_concurrency)
    row("Request rate (req/s):", res.request_rate)
    row("Benchmark duration (s):", res.duration, ".2f")
    row("Total input tokens:", res.total_input_tokens)
    row("Total generated tokens:", res.total_output_tokens)
    row("Request throughput (req/s):", res.request_throughput, ".2f")
    row("Output token throughput (tok/s):", res.output_throughput, ".2f")
    if res.total_audio_duration_s:
        row("Total audio generated (s):", res.total_audio_duration_s, ".2f")
        row("Audio throughput (audio s/s):", res.audio_throughput, ".2f")
    if res.total_images:
        row("Total images:", res.total_images)
        row("Image throughput (images/s):", res.image_throughput, ".2f")
    for stem, title, unit in (
        ("ttft_ms", "Time to First Token", "TTFT (ms)"),
        ("tpot_ms", "Time per Output Token (excl. 1st)", "TPOT (ms)"),
        ("itl_ms", "Inter-token Latency", "ITL (ms)"),
        ("audio_ttfp_ms", "Time to First Audio (packet)", "TTFP (ms)"),
        ("audio_rtf", "Audio Real-Time Factor", "RTF"),
        ("e2el_ms", "End-to-end Latency", "E2EL (ms)"),
    ):
        if getattr(res, f"mean_{stem}") is None:
            continue
        lines.append("{s:{c}^{n}}".format(s=title, n=56, c="-"))
        for stat in ("mean", "p50", "p90", "p99"):
            row(
                f"{stat.capitalize() if stat == 'mean' else stat.upper()} {unit}:",
                getattr(res, f"{stat}_{stem}"),
                ".3f" if stem == "audio_rtf" else ".2f",
            )
    if len(res.per_kind) > 1:
        lines.append("{s:{c}^{n}}".format(s="Per kind", n=56, c="-"))
        for kind, ks in res.per_kind.items():
            mean = f"{ks.mean_e2el_ms:.2f}" if ks.mean_e2el_ms is not None else "-"
            lines.append(
                f"{kind:<12} completed {ks.completed:<6} failed {ks.failed:<6} mean E2EL (ms) {mean}"
            )
    if res.first_errors:
        lines.append("{s:{c}^{n}}".format(s="First errors", n=56, c="-"))
        lines.extend(res.first_errors)
    lines.append("=" * 56)
    return "\n".join(lines)


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------

_EPILOG = """\
examples:
  omnix bench serve --base-url http://127.0.0.1:8091 --kind audio-out --num-prompts 50 --concurrency 4
  omnix bench serve --base-url http://127.0.0.1:8091 --kind mix --request-rate 2 --seed 1 --json
  omnix bench serve --base-url http://gpu-host:8000 --model Qwen/Qwen3-Omni --kind speech \\
      --result-file result.json

kinds: text (streamed chat), audio-out (streamed chat with modalities text+audio),
audio-in (chat with an input_audio part: a generated WAV), speech (/v1/audio/speech),
image (/v1/images/generations), mix (a seeded random draw among --mix).

Exit status: 0 all requests completed, 1 some failed, 2 the run could not start.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Load a live OpenAI-compatible server (omnix, vLLM, vLLM-Omni) with chat,\n"
        "audio, speech and image requests; report TTFT, TPOT, ITL, TTFP, audio RTF\n"
        "and E2EL percentiles, throughput and failures."
    )
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    # One group per concern, in the order --help lists them.
    _target_flags(parser)
    _load_flags(parser)
    _audio_flags(parser)
    _request_flags(parser)


def _target_flags(parser: argparse.ArgumentParser) -> None:
    """Which server and model, and what kinds of request."""
    parser.add_argument(
        "--base-url",
        required=True,
        help="the server, e.g. http://127.0.0.1:8091 (a trailing /v1 is ignored)",
    )
    parser.add_argument(
        "--model", default="", help="model name (default: the first of GET /v1/models)"
    )
    parser.add_argument(
        "--kind", choices=(*KINDS, "mix"), default="text", help="what to send (default: text)"
    )
    parser.add_argument(
        "--mix",
        default="text,audio-out,speech",
        help="kinds drawn by --kind mix, comma-separated (default: text,audio-out,speech)",
    )


def _load_flags(parser: argparse.ArgumentParser) -> None:
    """How many requests, how fast, and what each generates."""
    parser.add_argument(
        "--num-prompts", type=_positive_int, default=100, help="requests to send (default: 100)"
    )
    parser.add_argument(
        "--concurrency",
        "--max-concurrency",
        dest="concurrency",
        type=_non_negative_int,
        default=8,
        help="requests in flight at most; 0: unbounded (default: 8)",
    )
    parser.add_argument(
        "--request-rate",
        type=_positive_float,
        default=float("inf"),
        help="Poisson arrivals at this many requests/s (default: inf, all at once up to --concurrency)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the prompts, the mix and the arrivals (default: 0)",
    )
    parser.add_argument(
        "--max-tokens",
        type=_non_negative_int,
        default=64,
        help="max_completion_tokens of chat requests; 0: not sent (default: 64)",
    )
    parser.add_argument(
        "--prompt-words",
        type=_positive_int,
        default=16,
        help="words per generated prompt (default: 16)",
    )


def _audio_flags(parser: argparse.ArgumentParser) -> None:
    """The audio asked for and sent."""
    parser.add_argument(
        "--voice", default="alloy", help="voice of audio-out and speech requests (default: alloy)"
    )
    parser.add_argument(
        "--audio-format",
        choices=("wav", "pcm"),
        default="wav",
        help="audio asked for: wav, or raw 16-bit PCM (chat: pcm16) (default: wav)",
    )
    parser.add_argument(
        "--sample-rate",
        type=_positive_int,
        default=24000,
        help="rate of raw PCM audio, to count its seconds (default: 24000)",
    )
    parser.add_argument(
        "--speech-stream",
        choices=("auto", "audio", "sse", "stream", "none"),
        default="auto",
        help="speech: stream_format audio|sse, vLLM-Omni's stream=true, or whole files; auto: the first of audio, stream, none the server does not refuse with 400/422 (default: auto)",
    )
    parser.add_argument(
        "--input-audio-seconds",
        type=_positive_float,
        default=1.0,
        help="length of the generated WAV of audio-in requests (default: 1.0)",
    )


def _request_flags(parser: argparse.ArgumentParser) -> None:
    """Images, extra body, auth, timeouts and where the result goes."""
    parser.add_argument(
        "--image-size", default="", help="size of image requests, e.g. 256x256 (default: not sent)"
    )
    parser.add_argument(
        "--extra-body", default="", help="a JSON object merged into every request body"
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY", ""),
        help="sent as Authorization: Bearer KEY (default: $OPENAI_API_KEY)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=600.0,
        help="seconds a request may take in all (default: 600)",
    )
    parser.add_argument(
        "--result-file",
        default="",
        help="save the full result (summary and every request) as JSON to this path",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _summary_json(res: ServeBenchResult) -> bytes:
    summary = {f: getattr(res, f) for f in ServeBenchSummary.__struct_fields__}
    return msgspec.json.encode(ServeBenchSummary(**summary))


def run(args: argparse.Namespace) -> int:
    try:
        res = run_on_loop(bench(args))
    except BenchError as exc:
        print(f"omnix bench serve: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("omnix bench serve: interrupted", file=sys.stderr)
        return 130
    if args.result_file:
        try:
            with open(args.result_file, "wb") as f:
                f.write(msgspec.json.format(msgspec.json.encode(res), indent=2))
        except OSError as exc:
            print(f"omnix bench serve: cannot write {args.result_file}: {exc}", file=sys.stderr)
            return 2
    if getattr(args, "json", False):
        print(_summary_json(res).decode())
    else:
        print(_table(res))
        if args.result_file:
            print(f"full result saved to {args.result_file}")
    return 0 if res.failed == 0 else 1
