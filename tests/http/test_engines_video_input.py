"""Video input to the Qwen3-Omni thinker (``tiny-omni`` on real engines)
through the official ``openai`` client: a ``video_url`` part reaches the
thinker (vLLM decodes the file, omnix's torchvision-free processor makes
its patches), its sound track is heard with it (``use_audio_in_video``),
and the talker, fed the thinker's hidden states at the video's positions
and its grids, speaks the answer."""

from __future__ import annotations

import base64
import io

import msgspec
import numpy as np
import soundfile as sf

from omnix.events.types import Chunk
from omnix.testing.media import video_part

from .conftest import real_engine_marks

PIPELINE = "tiny-omni"
pytestmark = real_engine_marks()


def _ask(part: dict) -> list[dict]:
    return [{"role": "user", "content": [part, {"type": "text", "text": "What happens?"}]}]


def _grids(server, rid: str) -> dict:
    """The thinker's context for its talker: its media grids."""
    (hidden,) = [
        e
        for e in server.omni.log.events_for(rid)
        if isinstance(e, Chunk) and e.modality == "hidden"
    ]
    return msgspec.json.decode(hidden.text or "{}")


async def test_a_video_with_sound_is_seen_heard_and_answered_aloud(server, client):
    text_only = await client.chat.completions.create(
        model="tiny-omni", messages=_ask({"type": "text", "text": "x"}), max_tokens=4
    )
    resp = await client.chat.completions.with_raw_response.create(
        model="tiny-omni",
        messages=_ask(video_part(2.0)),
        modalities=["text", "audio"],
        audio={"voice": "default", "format": "wav"},
        temperature=0.0,
        max_tokens=8,
    )
    rid = resp.headers["x-request-id"]
    out = resp.parse()
    msg = out.choices[0].message
    assert msg.content and msg.audio is not None
    pcm, rate = sf.read(io.BytesIO(base64.b64decode(msg.audio.data)))
    assert rate == 24000 and len(pcm) > 0 and np.isfinite(pcm).all()
    # 2 s at 2 frames a second: 4 frames, 2 temporal patches of at least
    # 128 tokens (the processor's video size), and ~26 tokens of sound.
    extra = out.usage.prompt_tokens - text_only.usage.prompt_tokens
    assert extra > 2 * 128 + 20, out.usage
    grids = _grids(server, rid)
    assert grids["use_audio_in_video"] is True
    assert len(grids["video_grid_thw"]) == 1 and grids["video_grid_thw"][0][0] == 2
    assert len(grids["audio_seqlens"]) == 1


async def test_a_silent_video_is_seen(server, client):
    resp = await client.chat.completions.with_raw_response.create(
        model="tiny-omni",
        messages=_ask(video_part(1.0, audio=False)),
        modalities=["text", "audio"],
        audio={"voice": "default", "format": "wav"},
        max_tokens=4,
    )
    rid = resp.headers["x-request-id"]
    assert resp.parse().choices[0].message.audio is not None
    grids = _grids(server, rid)
    assert "use_audio_in_video" not in grids and len(grids["video_grid_thw"]) == 1


async def test_the_same_video_sent_again_is_heard_and_spoken_again(server, client):
    """A video seen before, under another text: vLLM's processor cache and
    prefix cache hold what the first request left there, and neither may
    keep the second from its sound track or the talker from its hidden
    states at the video's positions."""
    part = video_part(1.5)
    for text in ("Describe it.", "What happens next?", "Describe it."):
        out = await client.chat.completions.create(
            model="tiny-omni",
            messages=[{"role": "user", "content": [part, {"type": "text", "text": text}]}],
            modalities=["text", "audio"],
            audio={"voice": "default", "format": "wav"},
            temperature=0.0,
            max_tokens=4,
        )
        assert out.choices[0].message.audio is not None, text
