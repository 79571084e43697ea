"""``POST /v1/audio/transcriptions``.

Two servers, each started once for the module: a scripted echo pipeline
that takes audio (the form, its refusals, the rendered shapes and their
replay from the log: fast, no model), and ``tiny-asr`` on its real vLLM
engine (the Qwen3-Omni thinker) for the official ``openai`` client end to
end.  The real-engine tests are marked ``engines``.
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
import soundfile as sf

from omnix.events.options import TranscriptionOptions
from omnix.events.types import Admitted, Chunk
from omnix.http.app import HttpServer
from omnix.http.options import HttpOptions
from omnix.http.render import API_TRANSCRIPTION, render_response
from omnix.pipelines.validate import parse_pipeline
from omnix.replay.client import client_bytes
from omnix.testing.media import wav_bytes
from omnix.testing.serving import serve_scripted
from omnix.trace import read_trace

from .conftest import engines_missing, parse_sse

PIPELINE = "tiny-asr"  # the conftest ``server`` fixture's (real engines)
pytestmark = pytest.mark.asyncio(loop_scope="session")

_missing = engines_missing()
real_engines = [
    pytest.mark.engines,
    pytest.mark.skipif(_missing is not None, reason=f"real engines unavailable: {_missing}"),
]

# Echoes the last message's text: the transcript is the instruction the
# route wrote, so what the route asked shows in the response.
ECHO = """
name = "asr-echo"
[[stages]]
name = "thinker"
engine = { kind = "scripted", echo = true }
sampling = { temperature = 0.0 }
media = { audio = true, image = false, max_audio_seconds = 10.0, max_part_bytes = 400000 }
[outputs]
text = "thinker"
"""
TEXT_ONLY = """
name = "text-only"
[[stages]]
name = "thinker"
engine = { kind = "scripted", echo = true }
[outputs]
text = "thinker"
"""

ROUTE = "/v1/audio/transcriptions"
CLIP = wav_bytes(1.0)  # 22.05 kHz, resampled to 16 kHz by the decoder


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def echo() -> AsyncIterator[HttpServer]:
    async with serve_scripted(parse_pipeline(ECHO), HttpOptions(max_body=1 << 20)) as server:
        yield server


@pytest_asyncio.fixture(loop_scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


def form(file: bytes | None = CLIP, filename: str = "clip.wav", **fields: str) -> aiohttp.FormData:
    f = aiohttp.FormData(default_to_multipart=True)
    if file is not None:
        f.add_field("file", file, filename=filename, content_type="application/octet-stream")
    for k, v in fields.items():
        f.add_field(k, v)
    return f


async def post(http, server, data) -> tuple[int, dict[str, str], bytes]:
    async with http.post(server.url + ROUTE, data=data) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.read()


def replayed(server, rid: str) -> bytes:
    return render_response(server.omni.log.events_for(rid), server.omni.blobs).body


# -- the form and its refusals (scripted) ------------------------------------------


async def test_json_is_openai_transcription_rendered_from_the_log(echo, http):
    status, headers, body = await post(http, echo, form(model="asr-echo"))
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    rid = headers["x-request-id"]
    out = json.loads(body)
    assert out == {
        "text": "Transcribe the audio into text.",
        "usage": {"type": "tokens", "input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
        "request_ids": [rid],
    }
    assert replayed(echo, rid) == body
    (admitted, *_) = echo.omni.log.events_for(rid)
    assert isinstance(admitted, Admitted)
    spec = admitted.spec
    assert spec.api == API_TRANSCRIPTION == "audio.transcriptions"
    (message,) = spec.messages
    assert message.role == "user" and message.content == "Transcribe the audio into text."
    (part,) = message.media
    assert part.kind == "audio" and part.at == 0 and part.rate == 16_000
    assert part.blob.dtype == "<f4" and abs(part.blob.shape[0] - 16_000) <= 16
    assert part.blob in echo.omni.blobs
    opts = spec.response
    assert isinstance(opts, TranscriptionOptions)
    assert opts.response_format == "json" and opts.stream is False


async def test_language_and_prompt_go_into_the_instruction(echo, http):
    status, _, body = await post(http, echo, form(language="fr", prompt="Zoë, Anaïs."))
    assert status == 200, body
    assert json.loads(body)["text"] == (
        "Transcribe the French audio into text. "
        "The text before it, or words it may contain: Zoë, Anaïs."
    )


@pytest.mark.parametrize("filename", ["voice.mp3", "recording", "clip.WAV"])
async def test_the_bytes_say_the_format_over_the_file_name(echo, http, filename):
    status, _, body = await post(http, echo, form(CLIP, filename))
    assert status == 200, body


async def test_text_format_is_the_bare_transcript(echo, http):
    status, headers, body = await post(http, echo, form(response_format="text"))
    assert status == 200, body
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert body == b"Transcribe the audio into text."
    assert replayed(echo, headers["x-request-id"]) == body


async def test_verbose_json_has_one_segment_covering_the_clip(echo, http):
    clip = wav_bytes(2.5)
    data = form(clip, response_format="verbose_json", language="en", temperature="0.25")
    status, headers, body = await post(http, echo, data)
    assert status == 200, body
    rid = headers["x-request-id"]
    out = json.loads(body)
    (admitted, *_) = echo.omni.log.events_for(rid)
    samples = admitted.spec.messages[0].media[0].blob.shape[0]
    seconds = samples / 16_000
    assert abs(seconds - 2.5) < 0.01
    text = "Transcribe the English audio into text."
    assert out == {
        "task": "transcribe",
        "language": "english",
        "duration": seconds,
        "text": text,
        "segments": [
            {
                "id": 0, "seek": 0, "start": 0.0, "end": seconds, "text": text, "tokens": [],
                "temperature": 0.25, "avg_logprob": 0.0, "compression_ratio": 0.0,
                "no_speech_prob": 0.0,
            }
        ],
        "usage": {"type": "duration", "seconds": seconds},
        "request_ids": [rid],
    }  # fmt: skip
    assert replayed(echo, rid) == body


async def test_stream_is_transcript_events_with_ids_and_resumes(echo, http):
    status, headers, body = await post(http, echo, form(stream="true"))
    assert status == 200, body
    assert headers["content-type"] == "text/event-stream"
    rid = headers["x-request-id"]
    frames = parse_sse(body)
    assert [json.loads(f["data"]) for f in frames] == [
        {"type": "transcript.text.delta", "delta": "Transcribe the audio into text."},
        {
            "type": "transcript.text.done",
            "text": "Transcribe the audio into text.",
            "usage": {"type": "tokens", "input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
        },
    ]
    assert all(f["id"] for f in frames)
    assert replayed(echo, rid) == body
    # The stream again from after its first event: the rest of the same bytes.
    first = body[: body.index(b"\n\n") + 2]
    url = f"{echo.url}/v1/requests/{rid}/stream"
    async with http.get(url, headers={"Last-Event-ID": frames[0]["id"]}) as r:
        assert r.status == 200
        assert first + await r.read() == body


async def test_a_downloaded_trace_replays_to_the_clients_bytes(echo, http):
    status, headers, body = await post(http, echo, form(response_format="verbose_json"))
    assert status == 200, body
    rid = headers["x-request-id"]
    async with http.get(f"{echo.url}/v1/requests/{rid}/trace") as r:
        assert r.status == 200
        trace = read_trace(await r.read())
    assert client_bytes(trace, rid) == body


def _error(body: bytes) -> dict:
    return json.loads(body)["error"]


BAD = [
    # (name, form data, status, param, code, words in the message)
    ("no file", form(None, model="asr-echo"), 400, "file", "invalid_value", "no file field"),
    ("empty file", form(b""), 400, "file", "invalid_value", "empty"),
    ("file as text", None, 400, "file", "invalid_value", "uploaded file"),
    ("unknown field", form(voice="alloy"), 400, "voice", "unknown_field", "Unknown form field"),
    ("twice", None, 400, "language", "invalid_value", "more than once"),
    ("srt", form(response_format="srt"), 400, "response_format", "unsupported_value", "timestamps"),
    ("vtt", form(response_format="vtt"), 400, "response_format", "unsupported_value", "vtt"),
    ("bad format", form(response_format="xml"), 400, "response_format", "invalid_value", "xml"),
    (
        "timestamps",
        None,
        400,
        "timestamp_granularities[]",
        "unsupported_parameter",
        "timestamps",
    ),
    ("include", None, 400, "include[]", "unsupported_parameter", "log probabilities"),
    ("temperature", form(temperature="hot"), 400, "temperature", "invalid_value", "form field"),
    ("prompt", form(prompt="x" * 1001), 400, "prompt", "invalid_value", "1000"),
    ("temperature range", form(temperature="1.5"), 400, "temperature", "invalid_value", "1.0"),
    ("stream value", form(stream="maybe"), 400, "stream", "invalid_value", "bool"),
    ("language", form(language="english"), 400, "language", "invalid_value", "ISO-639-1"),
    ("language code", form(language="qq"), 400, "language", "invalid_value", "ISO-639-1"),
    (
        "stream text",
        form(stream="true", response_format="text"),
        400,
        "stream",
        "unsupported_value",
        "no streamed form",
    ),
    ("model", form(model="whisper-1"), 404, "model", "model_not_found", "whisper-1"),
    (
        "not audio",
        form(b"hello, not audio" * 10, "clip.bin"),
        400,
        "file",
        "unsupported_media_format",
        "file",
    ),
    ("broken wav", form(CLIP[:60]), 400, "file", "invalid_media", "file"),
    ("too long", form(wav_bytes(12.0, rate=8000)), 400, "file", "audio_too_long", "at most 10 s"),
    ("too big", form(b"RIFF" + bytes(500_000)), 400, "file", "media_too_large", "file is"),
]


def _special(name: str) -> aiohttp.FormData:
    f = form()
    if name == "file as text":
        f = aiohttp.FormData(default_to_multipart=True)
        f.add_field("file", "not a file")
    elif name == "twice":
        f.add_field("language", "en")
        f.add_field("language", "fr")
    elif name == "timestamps":
        f.add_field("timestamp_granularities[]", "word")
    elif name == "include":
        f.add_field("include[]", "logprobs")
    return f


@pytest.mark.parametrize(
    ("name", "data", "status", "param", "code", "says"), BAD, ids=[b[0] for b in BAD]
)
async def test_bad_form_is_refused_naming_the_field_and_admits_nothing(
    echo, http, name, data, status, param, code, says
):
    before = len(echo.omni.log)
    blobs = set(echo.omni.blobs.digests())
    status_, _, body = await post(http, echo, data if data is not None else _special(name))
    assert status_ == status, body
    err = _error(body)
    assert (err["param"], err["code"]) == (param, code), err
    assert says in err["message"], err["message"]
    assert len(echo.omni.log) == before
    assert set(echo.omni.blobs.digests()) == blobs


async def test_a_body_that_is_not_multipart_is_refused(echo, http):
    before = len(echo.omni.log)
    broken = {"Content-Type": "multipart/form-data; boundary=xyz"}
    for kwargs in (
        {"json": {"file": "x"}},
        {"data": {"file": "x"}},
        {"data": b""},
        {"data": b"--xyz\r\nnot a part", "headers": broken},
        {"data": b"x", "headers": {"Content-Type": "multipart/form-data"}},  # no boundary
    ):
        async with http.post(echo.url + ROUTE, **kwargs) as r:
            assert r.status == 400, await r.text()
            err = _error(await r.read())
            assert err["code"] == "invalid_form" and "multipart/form-data" in err["message"]
    assert len(echo.omni.log) == before


async def test_a_body_over_the_server_limit_is_413(echo, http):
    status, _, body = await post(http, echo, form(bytes(2 << 20)))
    assert status == 413, body


async def test_a_pipeline_without_audio_input_cannot_transcribe(http):
    async with serve_scripted(parse_pipeline(TEXT_ONLY)) as server:
        before = len(server.omni.log)
        status, _, body = await post(http, server, form())
        assert status == 400, body
        err = _error(body)
        assert (err["param"], err["code"]) == ("file", "unsupported_input")
        assert "tiny-asr" in err["message"]
        assert len(server.omni.log) == before


# -- tiny-asr on its real engine: the openai client ------------------------------------


def _wav(seconds: float) -> tuple[str, bytes, str]:
    return ("clip.wav", wav_bytes(seconds), "audio/wav")


@pytest.mark.engines
@pytest.mark.skipif(_missing is not None, reason=f"real engines unavailable: {_missing}")
async def test_openai_client_transcribes_in_every_format(server, client):
    whole = await client.audio.transcriptions.create(file=_wav(1.0), model="tiny-asr")
    assert isinstance(whole.text, str) and whole.text
    usage = whole.usage
    assert usage is not None and usage.type == "tokens"
    assert (
        usage.output_tokens > 0 and usage.total_tokens == usage.input_tokens + usage.output_tokens
    )

    # Greedy by default: the same clip, the same transcript, in any format.
    text = await client.audio.transcriptions.create(
        file=_wav(1.0), model="tiny-asr", response_format="text"
    )
    assert text == whole.text
    verbose = await client.audio.transcriptions.create(
        file=_wav(1.0), model="tiny-asr", response_format="verbose_json"
    )
    assert verbose.text == whole.text and verbose.language == "unknown"  # not detected
    assert abs(verbose.duration - 1.0) < 0.01
    (segment,) = verbose.segments or []
    assert segment.start == 0.0 and segment.end == verbose.duration and segment.text == whole.text
    assert len(segment.tokens) == usage.output_tokens and segment.temperature == 0.0


@pytest.mark.engines
@pytest.mark.skipif(_missing is not None, reason=f"real engines unavailable: {_missing}")
async def test_openai_client_streams_deltas_then_done(server, client):
    whole = await client.audio.transcriptions.create(file=_wav(1.0), model="tiny-asr")
    stream = await client.audio.transcriptions.create(file=_wav(1.0), model="tiny-asr", stream=True)
    kinds, deltas, done = [], [], None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "transcript.text.delta":
            deltas.append(event.delta)
        else:
            done = event
    assert kinds[-1] == "transcript.text.done" and set(kinds[:-1]) == {"transcript.text.delta"}
    assert len(deltas) > 1
    assert done is not None and "".join(deltas) == done.text == whole.text
    assert done.usage is not None and whole.usage is not None
    assert done.usage.input_tokens == whole.usage.input_tokens
    assert done.usage.output_tokens == whole.usage.output_tokens


@pytest.mark.engines
@pytest.mark.skipif(_missing is not None, reason=f"real engines unavailable: {_missing}")
async def test_input_tokens_grow_with_the_clip(server, client):
    """The thinker received the audio: its placeholder expands into about
    13 tokens a second of audio, so a 4 s clip costs ~39 more input
    tokens than a 1 s one, not a 200 with the clip dropped."""

    async def input_tokens(seconds: float) -> int:
        r = await client.audio.transcriptions.create(file=_wav(seconds), model="tiny-asr")
        assert r.usage is not None and r.usage.type == "tokens"
        return r.usage.input_tokens

    short, long = await input_tokens(1.0), await input_tokens(4.0)
    assert 30 <= long - short <= 60, (short, long)


@pytest.mark.engines
@pytest.mark.skipif(_missing is not None, reason=f"real engines unavailable: {_missing}")
async def test_the_bytes_received_are_the_logs_rendering(server):
    """A raw multipart post (flac this time): what the client got is what
    the log renders, and the transcript is the decode of the logged ids."""
    buf = io.BytesIO()
    sf.write(buf, np.zeros(16_000, np.float32), 16_000, format="FLAC")
    data = aiohttp.FormData(default_to_multipart=True)
    data.add_field("file", buf.getvalue(), filename="silence.flac", content_type="audio/flac")
    data.add_field("stream", "true")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        status, headers, body = await post(http, server, data)
    assert status == 200, body
    rid = headers["x-request-id"]
    assert replayed(server, rid) == body
    events = server.omni.log.events_for(rid)
    ids = [t for e in events if isinstance(e, Chunk) for t in e.token_ids]
    done = json.loads(parse_sse(body)[-1]["data"])
    assert done["type"] == "transcript.text.done" and done["usage"]["output_tokens"] == len(ids)
