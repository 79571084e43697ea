"""The oracle: tiny-omni served by omnix equals transformers' own Qwen3-Omni.

The same conversations (text only, with audio in, with an image in), two
speakers, greedy everywhere with the reference's repetition penalty: the
official ``openai`` client asks omnix for text and audio, and transformers'
``Qwen3OmniMoeForConditionalGeneration.generate(..., return_audio=True)``
runs on the same checkpoint.  Equal: the thinker's prompt and generated
ids, the talker's codes in all sixteen code groups, and the waveform
(sample for sample) with the reference's chunked decode at the stage's
chunk and context sizes.  Read from omnix's log, where each stage's
outputs are.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import pytest_asyncio
import soundfile as sf

from omnix.events.types import Chunk
from omnix.replay.drive import drive
from omnix.testing.media import audio_part, image_part, video_part
from omnix.trace import export_trace, read_trace

from .conftest import real_engine_marks

PIPELINE = "tiny-omni"
pytestmark = real_engine_marks()

THINKER_TOKENS = 24
MEDIA_IDS: set[int] = set()  # filled from the checkpoint by the reference fixture
TALKER_TOKENS = 48
TEXT = "Describe what you get."


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def reference(server):
    from omnix.models.paths import resolve_model
    from omnix.testing.speech_oracle import Reference

    # The server loads its prompt tokenizer in a thread as it starts;
    # transformers' lazy module is not safe to import from two threads at
    # once ("cannot import name 'AutoProcessor'" now and then).
    await server.state.tokens.tokenizer()
    ref = Reference(resolve_model("omni"))
    th = ref.model.config.thinker_config
    MEDIA_IDS.update({th.audio_token_id, th.image_token_id, th.video_token_id})
    return ref


def _media(kind: str) -> tuple[list[dict], list[np.ndarray], list]:
    """The chat parts and the same media as the reference takes them (a
    video: its frames as vLLM's loader decodes them, its sound track as
    omnix decodes it at admission)."""
    from PIL import Image

    if kind == "video":
        from omnix.engines.vllm_prompt import _load_video
        from omnix.http.media.video import check_video
        from omnix.pipelines.config import MediaLimits

        part = video_part(2.0)
        data = base64.b64decode(part["video_url"]["url"].split(",", 1)[1])
        limits = MediaLimits(audio=True, video=True, max_video_frames=8)
        track = check_video("video", data, limits).track
        frames, _ = _load_video(np.frombuffer(data, np.uint8), 2.0, 8)
        return [part], [track], [frames]
    if kind == "audio":
        part = audio_part(seconds=1.5, rate=16000)
        wav, rate = sf.read(
            io.BytesIO(base64.b64decode(part["input_audio"]["data"])), dtype="float32"
        )
        assert rate == 16000
        return [part], [wav], []
    if kind == "image":
        part = image_part(96, 64)
        data = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
        return [part], [], [Image.open(io.BytesIO(data)).convert("RGB")]
    return [], [], []


def _stage_chunks(server, rid: str, stage: str) -> list[Chunk]:
    return [ev for ev in server.omni.log.events_for(rid) if type(ev) is Chunk and ev.stage == stage]


@pytest.mark.parametrize(
    ("kind", "voice"),
    [
        ("text", "chelsie"),
        ("text", "ethan"),
        ("audio", "aiden"),
        ("image", "ethan"),
        ("video", "chelsie"),
    ],
)
async def test_greedy_speech_equals_transformers(server, client, reference, kind, voice):
    parts, audio, images = _media(kind)
    resp = await client.chat.completions.create(
        model=PIPELINE,
        messages=[{"role": "user", "content": [*parts, {"type": "text", "text": TEXT}]}],
        modalities=["text", "audio"],
        audio={"voice": voice, "format": "wav"},
        temperature=0.0,
        max_tokens=THINKER_TOKENS,
        extra_body={
            "sampling_params_list": {
                "talker": {"temperature": 0.0, "max_tokens": TALKER_TOKENS},
            }
        },
    )
    rid = resp.id.removeprefix("chatcmpl-")
    videos = images if kind == "video" else []
    want = reference.speak(
        TEXT,
        speaker=voice,
        audio=audio,
        images=[] if kind == "video" else images,
        videos=videos,
        use_audio_in_video=kind == "video",
        thinker_max_tokens=THINKER_TOKENS,
        talker_max_tokens=TALKER_TOKENS,
    )
    thinker = _stage_chunks(server, rid, "thinker")
    context, text = thinker[0], thinker[1:]
    assert context.modality == "hidden"
    assert list(context.token_ids) == want.prompt_ids
    assert [t for c in text for t in c.token_ids] == want.thinker_ids
    frames = [c.token_ids for c in _stage_chunks(server, rid, "talker") if c.token_ids]
    codes = np.asarray(frames, dtype=np.int64)
    assert codes.shape == want.codes.shape and codes.shape[1] == 16
    np.testing.assert_array_equal(codes, want.codes)
    blobs = server.omni.blobs
    wav = np.concatenate(
        [blobs.get_array(c.blob) for c in _stage_chunks(server, rid, "code2wav") if c.blob]
    )
    np.testing.assert_array_equal(wav, want.waveform)
    # And the client got that waveform (as 16-bit PCM) with the text.
    msg = resp.choices[0].message
    pcm, rate = sf.read(io.BytesIO(base64.b64decode(msg.audio.data)), dtype="float32")
    assert rate == 24000 and len(pcm) == len(want.waveform)
    assert np.abs(pcm - np.clip(want.waveform, -1, 1)).max() < 1 / 16000
    assert np.abs(want.waveform).max() > 0.05  # audible, not silence
    # The trace carries the hidden states and codes; it drives exactly.
    trace = read_trace(
        export_trace(server.omni.log, server.omni.blobs, server.omni.pipeline, [rid])
    )
    assert drive(trace).ok
    context_blob = context.blob
    if kind == "text":
        assert context_blob is None  # nothing to read through the hidden projection
    else:
        assert context_blob is not None
        rows = trace.blobs.get_array(context_blob)  # in the trace, not only the server
        assert rows.shape[0] == sum(t in MEDIA_IDS for t in want.prompt_ids)


async def test_the_speakers_are_listed_and_an_unknown_voice_is_refused(server, client):
    import openai

    before = len(server.omni.log.state.requests)
    got = await client.get("/audio/voices", cast_to=object)
    assert got["voices"] == ["chelsie", "ethan", "aiden"] and got["default"] == "chelsie"
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(
            model=PIPELINE,
            messages=[{"role": "user", "content": "hi"}],
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "wav"},
        )
    assert err.value.status_code == 400
    assert "chelsie, ethan, aiden" in str(err.value)
    assert len(server.omni.log.state.requests) == before  # refused before admission


@pytest.mark.parametrize("stream", [False, True])
async def test_a_one_token_answer_with_audio_is_answered_200(server, client, stream):
    """The thinker says one token (max_tokens 1): there is no text position
    for the talker's prefill (transformers' own generate raises there); the
    talker ends with no frames and the client gets its one token, 200,
    never a retried 500."""
    kwargs = {
        "model": PIPELINE,
        "messages": [{"role": "user", "content": "hi"}],
        "modalities": ["text", "audio"],
        "audio": {"voice": "chelsie", "format": "wav"},
        "temperature": 0.0,
        "max_tokens": 1,
    }
    if stream:
        text, done = "", None
        async for chunk in await client.chat.completions.create(stream=True, **kwargs):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                done = chunk.choices[0].finish_reason or done
        assert done == "length"
        rid = chunk.id.removeprefix("chatcmpl-")
    else:
        resp = await client.chat.completions.create(**kwargs)
        assert resp.choices[0].finish_reason == "length"
        rid = resp.id.removeprefix("chatcmpl-")
    state = server.omni.state(rid)
    assert state.status == "finished"
    assert state.stage("talker").attempt == 1
    assert not [c for c in _stage_chunks(server, rid, "talker") if c.token_ids]
