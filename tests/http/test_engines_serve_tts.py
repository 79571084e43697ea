"""``omnix serve PATH`` of the tiny Qwen3-TTS CustomVoice, VoiceDesign and
Base folders, as a user runs it (a subprocess with real worker processes),
answered by the official ``openai`` client: the greedy audio of a named
speaker, an instruction, the default voice, a designed voice and a voice
cloned from reference audio (in context, and from its speaker vector alone), whole,
streamed as SSE and as audio bytes, each equal to what omnix's in-process
talker and decoder (held to qwen-tts by tests/engines/test_qwen3_tts.py)
give for the same request, cut as the served decoder stage cuts it; the
voices listed; and the 400s, before admission, for what a checkpoint
cannot do."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import aiohttp
import numpy as np
import openai
import pytest

from omnix.pipelines.config import Qwen3TTSDecoderArgs
from omnix.pipelines.folder import derive_pipeline
from omnix.testing.served import ServeProcess
from tests.model_fixtures import session_models

from .conftest import engines_missing, parse_sse

pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(engines_missing() is not None, reason=f"{engines_missing()}"),
    pytest.mark.timeout(900),
]

START_S = 300
#: The random-weight talker never ends by itself: 24 codes bound it (23
#: frames, as qwen-tts's generate(max_new_tokens=24) gives).
MAX_TOKENS = 24
GREEDY = {"sampling_params_list": {"talker": {"temperature": 0.0, "max_tokens": MAX_TOKENS}}}
#: CustomVoice's speakers by codec id (the first is ``default``).
SPEAKERS = ["aiden", "sohee", "ono_anna", "eric", "dylan", "uncle_fu", "ryan", "vivian", "serena"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return session_models(tmp_path_factory)


def expected_pcm(folder: str, **request) -> np.ndarray:
    """omnix's in-process greedy audio for ``request`` (``SpeechRequest``'s
    fields), decoded with the chunks the derived decoder stage streams."""
    from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker, SpeechRequest
    from omnix.engines.speech_decoder import SpeechCodec

    decoder = derive_pipeline(folder, gpu=False).stage("code2wav").engine
    assert isinstance(decoder, Qwen3TTSDecoderArgs)
    codes = Qwen3TTSTalker.load(folder).generate(
        SpeechRequest(**request), max_new_tokens=MAX_TOKENS
    )
    pcm = SpeechCodec.load(folder).decode(
        codes, decoder.chunk_frames, decoder.context_frames, decoder.first_chunk_frames
    )
    return pcm.numpy()


def assert_heard(pcm16: bytes, want: np.ndarray) -> None:
    got = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768
    assert len(got) == len(want) == (MAX_TOKENS - 1) * 1920
    assert np.abs(got - np.clip(want, -1, 1)).max() < 1 / 16000  # 16-bit PCM
    assert np.abs(want).max() > 0.05  # audible, not silence


async def _serve(folder: str, name: str) -> tuple[ServeProcess, openai.AsyncOpenAI]:
    served = await ServeProcess.start(folder, "--served-model-name", name)
    await served.ready(timeout=START_S)
    client = openai.AsyncOpenAI(
        base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=300
    )
    return served, client


async def _sse(client: openai.AsyncOpenAI, **kw) -> bytes:
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


async def _audio_stream(client: openai.AsyncOpenAI, **kw) -> bytes:
    async with client.audio.speech.with_streaming_response.create(
        response_format="pcm", **kw
    ) as streamed:
        return b"".join([piece async for piece in streamed.iter_bytes()])


async def _refused(client: openai.AsyncOpenAI, param: str, *needles: str, **kw) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model="", input="Hello.", response_format="pcm", **kw)
    body = err.value.body
    assert isinstance(body, dict) and body.get("param") == param, body
    for needle in needles:
        assert needle in str(body.get("message")), body


async def _voices(served: ServeProcess) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.get(served.url + "/v1/audio/voices") as r:
            assert r.status == 200
            got: dict = await r.json()
            return got


async def test_custom_voice_speaks_its_speakers_and_instructions(tiny):
    folder = tiny.qwen3_tts_custom_voice
    served, client = await _serve(folder, "tts-custom")
    try:
        (card,) = (await client.models.list()).data
        assert card.model_extra["stages"] == ["talker", "code2wav"]
        assert await _voices(served) == {"object": "list", "voices": SPEAKERS, "default": "aiden"}

        text = "Hello there, how are you today?"
        whole = await client.audio.speech.create(
            model="tts-custom",
            input=text,
            voice="Ryan",
            response_format="pcm",
            extra_body={"language": "English", "task_type": "CustomVoice", **GREEDY},
        )
        assert_heard(
            whole.content, expected_pcm(folder, text=text, speaker="ryan", language="English")
        )

        said = "Speak softly, please."
        how = "Very happy, and a little fast."
        sse = await _sse(
            client,
            model="tts-custom",
            input=said,
            voice="aiden",
            instructions=how,
            extra_body={"stream_format": "sse", **GREEDY},
        )
        want = expected_pcm(folder, text=said, speaker="aiden", instruct=how)
        assert_heard(sse, want)
        # The default voice is the first listed; streamed as audio bytes.
        default = await _audio_stream(
            client,
            model="tts-custom",
            input=said,
            voice="default",
            instructions=how,
            extra_body={"stream_format": "audio", **GREEDY},
        )
        assert default == sse

        # Refused, naming what the checkpoint can do.
        await _refused(client, "voice", "aiden, sohee", voice="alloy")
        await _refused(
            client, "language", "english", voice="ryan", extra_body={"language": "Klingon"}
        )
        await _refused(
            client, "ref_audio", "CustomVoice", "Base", voice="ryan",
            extra_body={"ref_audio": "data:audio/wav;base64,AAAA", "ref_text": "Hi."},
        )  # fmt: skip
        await _refused(
            client,
            "task_type",
            "CustomVoice",
            voice="ryan",
            extra_body={"task_type": "VoiceDesign"},
        )
    finally:
        await client.close()
        await served.close()


async def test_voice_design_speaks_a_described_voice(tiny):
    folder = tiny.qwen3_tts_voice_design
    served, client = await _serve(folder, "tts-design")
    try:
        assert await _voices(served) == {"object": "list", "voices": [], "default": ""}
        text = "The quick brown fox."
        voice = "A warm, low female voice, speaking slowly."
        want = expected_pcm(folder, text=text, instruct=voice, language="english")
        whole = await client.audio.speech.create(
            model="tts-design",
            input=text,
            voice="default",
            instructions=voice,
            response_format="pcm",
            extra_body={"language": "english", **GREEDY},
        )
        assert_heard(whole.content, want)
        sse = await _sse(
            client,
            model="tts-design",
            input=text,
            voice="default",
            instructions=voice,
            extra_body={"language": "english", "stream": True, **GREEDY},
        )
        assert sse == whole.content

        await _refused(client, "instructions", "VoiceDesign", "describing", voice="default")
        await _refused(client, "voice", "no named voice", voice="ryan", instructions=voice)
        await _refused(
            client, "ref_audio", "VoiceDesign", voice="default", instructions=voice,
            extra_body={"ref_audio": "data:audio/wav;base64,AAAA"},
        )  # fmt: skip
        await _refused(
            client, "language", "english", voice="default", instructions=voice,
            extra_body={"language": "beijing_dialect"},
        )  # fmt: skip
    finally:
        await client.close()
        await served.close()


def test_an_unknown_variant_is_refused_by_name(tiny, tmp_path: Path) -> None:
    from omnix.pipelines.folder import FolderError

    other = tmp_path / "other"
    other.mkdir()
    cfg = json.loads((Path(tiny.qwen3_tts_custom_voice) / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "tts_model_type": "other"}))
    with pytest.raises(FolderError, match="Qwen3-TTS other is not a variant omnix serves"):
        derive_pipeline(other, gpu=False)


#: Base: the voice of a gliding tone and a tremolo bell (16-bit PCM), with
#: its transcript (in-context cloning) or alone (the speaker vector).
REF_TEXT = "A sweeping tone, then a bell."


def _reference_wav(rate: int = 24000, channels: int = 1) -> bytes:
    import io

    import soundfile as sf

    t = np.arange(int(1.3 * rate)) / rate
    x = 0.4 * np.sin(2 * np.pi * 220 * t * (1 + 0.3 * t))
    x += 0.2 * np.sin(2 * np.pi * 523 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    out = io.BytesIO()
    sf.write(out, np.stack([x] * channels, axis=1), rate, subtype="PCM_16", format="WAV")
    return out.getvalue()


def _data_url(wav: bytes) -> str:
    return "data:audio/wav;base64," + base64.b64encode(wav).decode()


def expected_clone(folder: str, wav: bytes, ref_text: str | None, **request) -> np.ndarray:
    """omnix's in-process greedy audio of a voice cloned from ``wav``: the
    cloner, the talker, and the decoder as the served stage decodes it
    (after the reference codes when cloned in context)."""
    import io

    from omnix.engines.qwen3_tts_clone import VoiceCloner, read_wav
    from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker, SpeechRequest
    from omnix.engines.speech_decoder import SpeechCodec

    samples, rate = read_wav(io.BytesIO(wav))
    voice = VoiceCloner.load(folder).clone(samples, rate, ref_text)
    codes = Qwen3TTSTalker.load(folder).generate(
        SpeechRequest(clone=voice, **request), max_new_tokens=MAX_TOKENS
    )
    codec = SpeechCodec.load(folder)
    if voice.codes is not None:
        return codec.decode_after(voice.codes, codes).numpy()
    decoder = derive_pipeline(folder, gpu=False).stage("code2wav").engine
    assert isinstance(decoder, Qwen3TTSDecoderArgs)
    pcm = codec.decode(
        codes, decoder.chunk_frames, decoder.context_frames, decoder.first_chunk_frames
    )
    return pcm.numpy()


async def test_base_clones_a_voice_from_reference_audio(tiny):
    folder = tiny.qwen3_tts_base
    served, client = await _serve(folder, "tts-base")
    try:
        (card,) = (await client.models.list()).data
        assert card.model_extra["stages"] == ["talker", "code2wav"]
        assert await _voices(served) == {"object": "list", "voices": [], "default": ""}
        wav = _reference_wav()
        ref = _data_url(wav)

        text = "Clone this voice, please."
        icl = await client.audio.speech.create(
            model="tts-base",
            input=text,
            voice="default",
            response_format="pcm",
            extra_body={"ref_audio": ref, "ref_text": REF_TEXT, "task_type": "Base", **GREEDY},
        )
        assert_heard(icl.content, expected_clone(folder, wav, REF_TEXT, text=text))

        said = "Only the vector."
        want = expected_clone(folder, wav, None, text=said, language="english")
        vector = await _sse(
            client,
            model="tts-base",
            input=said,
            voice="default",
            extra_body={"ref_audio": ref, "language": "english", "stream": True, **GREEDY},
        )
        assert_heard(vector, want)

        # Refused before admission, naming what Base takes.
        await _refused(client, "ref_audio", "Base", "ref_audio", "24000 Hz", voice="default")
        await _refused(
            client, "ref_audio", "not fetched", "data URL", voice="default",
            extra_body={"ref_audio": "https://example.com/voice.wav"},
        )  # fmt: skip
        await _refused(
            client, "ref_audio", "16000 Hz", "24000 Hz", voice="default",
            extra_body={"ref_audio": _data_url(_reference_wav(16000))},
        )  # fmt: skip
        await _refused(
            client, "ref_audio", "could not be decoded", voice="default",
            extra_body={"ref_audio": "data:audio/wav;base64,AAAA"},
        )  # fmt: skip
        await _refused(
            client, "ref_audio", "base64", voice="default",
            extra_body={"ref_audio": "data:audio/wav;base64,not base64!"},
        )  # fmt: skip
        await _refused(
            client, "voice", "no named voice", voice="ryan", extra_body={"ref_audio": ref}
        )
        await _refused(
            client, "instructions", "no instructions", voice="default",
            instructions="Speak softly.", extra_body={"ref_audio": ref},
        )  # fmt: skip
    finally:
        await client.close()
        await served.close()
