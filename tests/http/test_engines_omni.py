"""The official ``openai`` client against ``tiny-omni`` on real engines
(vLLM thinker and talker, torch codec decoder): chat, whole and streamed,
text and text + audio."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import soundfile as sf

from omnix.http.render import render_response
from omnix.testing.media import audio_part, image_part

from .conftest import real_engine_marks

PIPELINE = "tiny-omni"
pytestmark = real_engine_marks()

USER = [{"role": "user", "content": "Say something."}]


async def test_whole_and_streamed_text_agree(server, client):
    kw = dict(model="tiny-omni", messages=USER, temperature=0.0, seed=7, max_tokens=16)
    whole = await client.chat.completions.create(**kw)
    text = whole.choices[0].message.content
    assert isinstance(text, str) and text
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage is not None and 0 < whole.usage.completion_tokens <= 16
    stream = await client.chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}
    )
    pieces, usage = [], None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert "".join(pieces) == text  # greedy and seeded: the same answer
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


async def test_text_and_audio_whole(server, client):
    resp = await client.chat.completions.create(
        model="tiny-omni",
        messages=USER,
        modalities=["text", "audio"],
        audio={"voice": "default", "format": "wav"},
    )
    msg = resp.choices[0].message
    assert msg.audio is not None and msg.audio.transcript == msg.content
    pcm, rate = sf.read(io.BytesIO(base64.b64decode(msg.audio.data)))
    assert rate == 24000 and len(pcm) > 2400 and np.isfinite(pcm).all()


async def test_text_and_audio_streamed(server, client):
    stream = await client.chat.completions.create(
        model="tiny-omni",
        messages=USER,
        modalities=["text", "audio"],
        audio={"voice": "default", "format": "pcm16"},
        stream=True,
        seed=5,  # sampled random weights could end at once: the answer is pinned
    )
    rid, text, pcm, _ = await _read_stream(stream)
    assert text and len(pcm) > 2400
    # The bytes the client parsed are the log's rendering.
    events = server.omni.log.events_for(rid)
    assert render_response(events, server.omni.blobs).head.status == 200


async def test_vllm_stages_run_their_model_in_the_engine_core_placed_on_its_own_cpus(server):
    """On CPU: no separate model process (cpu_executor "uni"), and with two
    or more CPUs each vLLM worker sits on the frontend CPUs while its engine
    core, which inherited its start-up thread's CPUs, sits on its share."""
    import psutil

    from omnix.events.types import WorkerJoined
    from omnix.stages.worker_cli import parse_cpus

    plan = server.omni.runtime.cpu_plan
    # This server's workers, by the pids its log recorded: the session keeps
    # other servers up beside it, whose workers are this process's children too.
    joined = [e for e in server.omni.log.read() if type(e) is WorkerJoined and e.replica == 0]
    workers = {e.stage: psutil.Process(e.pid) for e in joined}
    for stage in ("thinker",):  # tiny-omni's one vLLM stage
        kids = workers[stage].children(recursive=True)
        # vLLM titles its processes ("VLLM::EngineCore"): forked, only the
        # command line shows it.
        names = [" ".join(k.cmdline()) for k in kids]
        assert any("EngineCore" in n for n in names), names
        assert not any("Worker" in n for n in names), names  # vLLM's model process
        if plan is None:
            continue
        (core,) = [k for k, n in zip(kids, names, strict=True) if "EngineCore" in n]
        assert set(core.cpu_affinity()) == parse_cpus(plan.engines[f"{stage}/0"])
        # Every thread of the worker, also those AsyncLLM started while it
        # spawned the engine core (its ZMQ I/O thread), stays on the frontend.
        for t in workers[stage].threads():
            assert set(psutil.Process(t.id).cpu_affinity()) == parse_cpus(plan.frontend)


# -- audio and image in ----------------------------------------------------------


ASK = {"type": "text", "text": "Describe it."}
AUDIO = audio_part(2.0)
IMAGE = image_part(320, 224)


async def _prompt_tokens(client, content) -> int:
    resp = await client.chat.completions.create(
        model="tiny-omni",
        messages=[{"role": "user", "content": content}],
        temperature=0.0,
        max_tokens=4,
    )
    assert resp.usage is not None
    return resp.usage.prompt_tokens


async def test_the_thinker_receives_audio_and_image_parts(server, client):
    """Each part grows the prompt by the model's placeholder tokens (vLLM
    expands one placeholder into the item's tokens): the media reached the
    thinker, not only a 200."""
    text = await _prompt_tokens(client, [ASK])
    audio = await _prompt_tokens(client, [AUDIO, ASK])
    image = await _prompt_tokens(client, [IMAGE, ASK])
    both = await _prompt_tokens(client, [AUDIO, IMAGE, ASK])
    # A 2 s clip: ~13 audio tokens a second; a 320x224 image: 54 patches.
    assert audio - text > 20
    assert image - text > 50
    assert both - text == (audio - text) + (image - text)


async def test_chat_with_audio_and_image_streams_text_and_audio_back(server, client):
    stream = await client.chat.completions.create(
        model="tiny-omni",
        messages=[{"role": "user", "content": [AUDIO, IMAGE, ASK]}],
        modalities=["text", "audio"],
        audio={"voice": "default", "format": "pcm16"},
        stream=True,
        stream_options={"include_usage": True},
        seed=3,
    )
    rid, text, pcm, usage = await _read_stream(stream)
    assert text and len(pcm) > 2400
    assert usage is not None and usage.prompt_tokens > 80
    (admitted, *_) = server.omni.log.events_for(rid)
    (message,) = admitted.spec.messages
    assert [p.kind for p in message.media] == ["audio", "image"]
    audio_ref, image_ref = (p.blob for p in message.media)
    assert audio_ref.dtype == "<f4" and message.media[0].rate == 16_000
    assert audio_ref.shape == (32_000,)  # 2 s resampled to 16 kHz
    assert image_ref.shape == (224, 320, 3)
    assert audio_ref in server.omni.blobs and image_ref in server.omni.blobs


async def test_the_same_image_sent_twice_is_stored_once(server, client):
    image = image_part(96, 64)
    before = set(server.omni.blobs.digests())
    for _ in range(2):
        await _prompt_tokens(client, [image, {"type": "text", "text": "Again."}])
    assert len(set(server.omni.blobs.digests()) - before) == 1


async def _read_stream(stream: Any) -> tuple[str, str, np.ndarray, Any]:
    """A streamed chat's request id, text, pcm16 audio and usage, as the
    openai client parsed them."""
    text, audio, usage, rid = [], [], None, ""
    async for chunk in stream:
        rid = rid or chunk.id.removeprefix("chatcmpl-")
        usage = chunk.usage or usage
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        if delta.content:
            text.append(delta.content)
        extra = getattr(delta, "audio", None) or (delta.model_extra or {}).get("audio")
        if extra:
            audio.append(extra["data"] if isinstance(extra, dict) else extra.data)
    pcm = np.frombuffer(b"".join(base64.b64decode(a) for a in audio), dtype="<i2")
    return rid, "".join(text), pcm, usage
