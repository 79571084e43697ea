"""What the served Qwen3-TTS tests share: serving a tiny folder as a user
runs it, the greedy bound, the audio omnix's in-process talker and decoder
give for a request (the expectation), a reference clip to clone, and the
clients' calls (whole, SSE, audio bytes, a refusal, the voices)."""

from __future__ import annotations

import base64
import io
import json

import aiohttp
import numpy as np
import openai
import pytest

from omnix.pipelines.config import Qwen3TTSDecoderArgs
from omnix.pipelines.folder import derive_pipeline
from omnix.testing.served import ServeProcess

from .conftest import parse_sse

START_S = 300
#: The random-weight talker never ends by itself: 24 codes bound it (23
#: frames, as qwen-tts's generate(max_new_tokens=24) gives).
MAX_TOKENS = 24
GREEDY = {"sampling_params_list": {"talker": {"temperature": 0.0, "max_tokens": MAX_TOKENS}}}
#: Base: the voice of a gliding tone and a tremolo bell (16-bit PCM), with
#: its transcript (in-context cloning) or alone (the speaker vector).
REF_TEXT = "A sweeping tone, then a bell."


def _decoder(folder: str) -> Qwen3TTSDecoderArgs:
    decoder = derive_pipeline(folder, gpu=False).stage("code2wav").engine
    assert isinstance(decoder, Qwen3TTSDecoderArgs)
    return decoder


def expected_pcm(folder: str, **request) -> np.ndarray:
    """omnix's in-process greedy audio for ``request`` (``SpeechRequest``'s
    fields), decoded with the chunks the derived decoder stage streams."""
    from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker, SpeechRequest
    from omnix.engines.speech_decoder import SpeechCodec

    decoder = _decoder(folder)
    codes = Qwen3TTSTalker.load(folder).generate(
        SpeechRequest(**request), max_new_tokens=MAX_TOKENS
    )
    pcm = SpeechCodec.load(folder).decode(
        codes, decoder.chunk_frames, decoder.context_frames, decoder.first_chunk_frames
    )
    return pcm.numpy()


def speaker_vector(folder: str, samples: np.ndarray) -> np.ndarray:
    """omnix's in-process speaker vector of ``samples`` (24 kHz)."""
    import torch

    from omnix.engines.qwen3_tts_clone import VoiceCloner

    wav = torch.from_numpy(np.array(samples, dtype=np.float32))
    return VoiceCloner.load(folder).speaker_vector(wav).numpy()


def expected_clone(
    folder: str,
    samples: np.ndarray,
    ref_text: str | None,
    speaker: np.ndarray | None = None,
    **request,
) -> np.ndarray:
    """omnix's in-process greedy audio of a voice cloned from ``samples``
    (24 kHz; ``speaker``: its speaker vector, else the cloner's): the
    cloner, the talker, and the decoder as the served stage decodes it
    (after the reference codes when cloned in context)."""
    import torch

    from omnix.engines.qwen3_tts_clone import VoiceCloner
    from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker, SpeechRequest
    from omnix.engines.speech_decoder import SpeechCodec

    wav = torch.from_numpy(np.array(samples, dtype=np.float32))
    vector = None if speaker is None else torch.from_numpy(np.array(speaker, dtype=np.float32))
    voice = VoiceCloner.load(folder).clone(wav, 24000, ref_text, speaker=vector)
    codes = Qwen3TTSTalker.load(folder).generate(
        SpeechRequest(clone=voice, **request), max_new_tokens=MAX_TOKENS
    )
    codec = SpeechCodec.load(folder)
    if voice.codes is not None:
        return codec.decode_after(voice.codes, codes).numpy()
    decoder = _decoder(folder)
    pcm = codec.decode(
        codes, decoder.chunk_frames, decoder.context_frames, decoder.first_chunk_frames
    )
    return pcm.numpy()


def assert_heard(pcm16: bytes, want: np.ndarray) -> None:
    got = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768
    assert len(got) == len(want) == (MAX_TOKENS - 1) * 1920
    assert np.abs(got - np.clip(want, -1, 1)).max() < 1 / 16000  # 16-bit PCM
    assert np.abs(want).max() > 0.05  # audible, not silence


def reference_wav(rate: int = 24000, channels: int = 1, seconds: float = 1.3) -> bytes:
    """A clip to clone: a gliding tone and a tremolo bell, 16-bit WAV."""
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    x = 0.4 * np.sin(2 * np.pi * 220 * t * (1 + 0.3 * t))
    x += 0.2 * np.sin(2 * np.pi * 523 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    out = io.BytesIO()
    sf.write(out, np.stack([x] * channels, axis=1), rate, subtype="PCM_16", format="WAV")
    return out.getvalue()


def clip_samples(wav: bytes) -> np.ndarray:
    """``wav`` as the server decodes reference audio: 24 kHz float32 mono
    (PyAV, resampled when at another rate)."""
    from omnix.http.audio.cloning import MAX_BYTES, MAX_SECONDS
    from omnix.http.media.sound import decode_audio
    from omnix.pipelines.config import MediaLimits

    limits = MediaLimits(
        audio=True, max_part_bytes=MAX_BYTES, max_audio_seconds=MAX_SECONDS, sample_rate=24000
    )
    return decode_audio("ref_audio", wav, "wav", 24000, limits)


def data_url(wav: bytes) -> str:
    return "data:audio/wav;base64," + base64.b64encode(wav).decode()


async def serve(folder: str, name: str, *args: str) -> tuple[ServeProcess, openai.AsyncOpenAI]:
    served = await ServeProcess.start(folder, "--served-model-name", name, *args)
    await served.ready(timeout=START_S)
    client = openai.AsyncOpenAI(
        base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=300
    )
    return served, client


async def sse_pcm(client: openai.AsyncOpenAI, **kw) -> bytes:
    async with client.audio.speech.with_streaming_response.create(
        response_format="pcm", **kw
    ) as streamed:
        assert streamed.headers["content-type"] == "text/event-stream"
        raw = b"".join([piece async for piece in streamed.iter_bytes()])
    events = [json.loads(f["data"]) for f in parse_sse(raw)]
    assert events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["output_tokens"] == MAX_TOKENS - 1
    assert len(events) > 2  # the first chunk came apart from the rest
    return b"".join(base64.b64decode(e["audio"]) for e in events[:-1])


async def audio_stream(client: openai.AsyncOpenAI, **kw) -> bytes:
    async with client.audio.speech.with_streaming_response.create(
        response_format="pcm", **kw
    ) as streamed:
        return b"".join([piece async for piece in streamed.iter_bytes()])


async def refused(client: openai.AsyncOpenAI, param: str, *needles: str, **kw) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model="", input="Hello.", response_format="pcm", **kw)
    body = err.value.body
    assert isinstance(body, dict) and body.get("param") == param, body
    for needle in needles:
        assert needle in str(body.get("message")), body


async def voices(served: ServeProcess) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.get(served.url + "/v1/audio/voices") as r:
            assert r.status == 200
            got: dict = await r.json()
            return got
