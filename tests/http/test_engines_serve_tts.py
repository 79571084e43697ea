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

import json
from pathlib import Path

import aiohttp
import pytest

from omnix.pipelines.folder import derive_pipeline

from .conftest import engines_missing
from .tts_serving import (
    GREEDY,
    REF_TEXT,
    assert_heard,
    audio_stream,
    clip_samples,
    data_url,
    expected_clone,
    expected_pcm,
    reference_wav,
    refused,
    serve,
    sse_pcm,
    voices,
)

pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(engines_missing() is not None, reason=f"{engines_missing()}"),
    pytest.mark.timeout(900),
]

#: CustomVoice's speakers by codec id (the first is ``default``).
SPEAKERS = ["aiden", "sohee", "ono_anna", "eric", "dylan", "uncle_fu", "ryan", "vivian", "serena"]


async def test_custom_voice_speaks_its_speakers_and_instructions(tiny_models):
    folder = tiny_models.qwen3_tts_custom_voice
    served, client = await serve(folder, "tts-custom")
    try:
        (card,) = (await client.models.list()).data
        assert card.model_extra["stages"] == ["talker", "code2wav"]
        assert await voices(served) == {
            "object": "list", "voices": SPEAKERS, "default": "aiden", "uploaded_voices": []
        }  # fmt: skip
        # Uploads are Base's: elsewhere POST is no method of the path, nor DELETE.
        async with aiohttp.ClientSession() as http:
            form = aiohttp.FormData({"name": "alice", "consent": "c-1"})
            form.add_field("audio_sample", reference_wav(), filename="v.wav")
            async with http.post(served.url + "/v1/audio/voices", data=form) as r:
                assert r.status == 405, await r.text()
                assert set(r.headers["Allow"].split(",")) == {"GET", "HEAD"}
                assert "/openapi.json" in (await r.json())["error"]["message"]
            async with http.delete(served.url + "/v1/audio/voices/alice") as r:
                assert r.status == 405, await r.text()
                assert r.headers["Allow"] == ""
                assert "does not clone voices" in (await r.json())["error"]["message"]

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
        sse = await sse_pcm(
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
        default = await audio_stream(
            client,
            model="tts-custom",
            input=said,
            voice="default",
            instructions=how,
            extra_body={"stream_format": "audio", **GREEDY},
        )
        assert default == sse

        # Refused, naming what the checkpoint can do.
        await refused(client, "voice", "aiden, sohee", voice="alloy")
        await refused(
            client, "language", "english", voice="ryan", extra_body={"language": "Klingon"}
        )
        await refused(
            client, "ref_audio", "CustomVoice", "Base", voice="ryan",
            extra_body={"ref_audio": "data:audio/wav;base64,AAAA", "ref_text": "Hi."},
        )  # fmt: skip
        await refused(
            client,
            "task_type",
            "CustomVoice",
            voice="ryan",
            extra_body={"task_type": "VoiceDesign"},
        )
    finally:
        await client.close()
        await served.close()


async def test_voice_design_speaks_a_described_voice(tiny_models):
    folder = tiny_models.qwen3_tts_voice_design
    served, client = await serve(folder, "tts-design")
    try:
        assert await voices(served) == {
            "object": "list", "voices": [], "default": "", "uploaded_voices": []
        }  # fmt: skip
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
        sse = await sse_pcm(
            client,
            model="tts-design",
            input=text,
            voice="default",
            instructions=voice,
            extra_body={"language": "english", "stream": True, **GREEDY},
        )
        assert sse == whole.content

        await refused(client, "instructions", "VoiceDesign", "describing", voice="default")
        await refused(client, "voice", "no named voice", voice="ryan", instructions=voice)
        await refused(
            client, "ref_audio", "VoiceDesign", voice="default", instructions=voice,
            extra_body={"ref_audio": "data:audio/wav;base64,AAAA"},
        )  # fmt: skip
        await refused(
            client, "language", "english", voice="default", instructions=voice,
            extra_body={"language": "beijing_dialect"},
        )  # fmt: skip
    finally:
        await client.close()
        await served.close()


def test_an_unknown_variant_is_refused_by_name(tiny_models, tmp_path: Path) -> None:
    from omnix.pipelines.folder import FolderError

    other = tmp_path / "other"
    other.mkdir()
    cfg = json.loads((Path(tiny_models.qwen3_tts_custom_voice) / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "tts_model_type": "other"}))
    with pytest.raises(FolderError, match="Qwen3-TTS other is not a variant omnix serves"):
        derive_pipeline(other, gpu=False)


async def test_base_clones_a_voice_from_reference_audio(tiny_models):
    folder = tiny_models.qwen3_tts_base
    served, client = await serve(folder, "tts-base")
    try:
        (card,) = (await client.models.list()).data
        assert card.model_extra["stages"] == ["talker", "code2wav"]
        assert await voices(served) == {
            "object": "list", "voices": [], "default": "", "uploaded_voices": []
        }  # fmt: skip
        wav = reference_wav()
        ref = data_url(wav)

        text = "Clone this voice, please."
        icl = await client.audio.speech.create(
            model="tts-base",
            input=text,
            voice="default",
            response_format="pcm",
            extra_body={"ref_audio": ref, "ref_text": REF_TEXT, "task_type": "Base", **GREEDY},
        )
        assert_heard(icl.content, expected_clone(folder, clip_samples(wav), REF_TEXT, text=text))

        said = "Only the vector."
        want = expected_clone(folder, clip_samples(wav), None, text=said, language="english")
        vector = await sse_pcm(
            client,
            model="tts-base",
            input=said,
            voice="default",
            extra_body={"ref_audio": ref, "language": "english", "stream": True, **GREEDY},
        )
        assert_heard(vector, want)

        # Refused before admission, naming what Base takes.
        await refused(client, "ref_audio", "Base", "ref_audio", "24000 Hz", voice="default")
        await refused(
            client, "ref_audio", "fetches no remote media", "data: URL", voice="default",
            extra_body={"ref_audio": "https://example.com/voice.wav"},
        )  # fmt: skip
        await refused(
            client, "ref_audio", "could not be decoded", voice="default",
            extra_body={"ref_audio": "data:audio/wav;base64,AAAA"},
        )  # fmt: skip
        await refused(
            client, "ref_audio", "base64", voice="default",
            extra_body={"ref_audio": "data:audio/wav;base64,not base64!"},
        )  # fmt: skip
        await refused(
            client, "voice", "no named speakers", voice="ryan", extra_body={"ref_audio": ref}
        )
        await refused(
            client, "instructions", "no instructions", voice="default",
            instructions="Speak softly.", extra_body={"ref_audio": ref},
        )  # fmt: skip
    finally:
        await client.close()
        await served.close()
