"""Rendering as a pure function of events (no server): the same events give
the same bytes, whatever the clock or the process; failures, cancels and
refusals render as OpenAI-style errors; encoders are deterministic."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import numpy as np
import pytest

from omnix.events.blobs import MemoryBlobStore
from omnix.events.clock import ManualClock
from omnix.events.log import MemoryLog
from omnix.events.options import AudioFormat, ChatOptions, Group, SpeechOptions, StreamFormat
from omnix.events.types import (
    Admitted,
    Cancelled,
    CancelRequested,
    Chunk,
    Failed,
    Finished,
    Rejected,
    RequestSpec,
    Routed,
    StageFinished,
    StageStarted,
)
from omnix.http.common.audio import AUDIO_FORMATS, StreamEncoder, encode_audio
from omnix.http.render import (
    API_CHAT,
    API_SPEECH,
    RENDER_VERSION,
    StreamRenderer,
    render_response,
    render_stream,
)
from omnix.http.requests.views import as_object, state_json

from .conftest import parse_sse


def chat_spec(**opts: Any) -> RequestSpec:
    options = ChatOptions(
        **{
            "render": RENDER_VERSION,
            "stream": True,
            "text_stage": "thinker",
            "usage_stage": "thinker",
            **opts,
        }
    )
    return RequestSpec(prompt="hi", api=API_CHAT, model="m", seed=1, response=options)


def speech_spec(fmt: AudioFormat, stream_format: StreamFormat) -> RequestSpec:
    options = SpeechOptions(
        render=RENDER_VERSION,
        stream=bool(stream_format),
        stream_format=stream_format,
        audio_stage="voice",
        audio_format=fmt,
        sample_rate=16000,
        usage_stage="voice",
    )
    return RequestSpec(
        prompt="hi", outputs=("audio",), api=API_SPEECH, model="m", seed=1, response=options
    )


def run(
    spec: RequestSpec,
    end: str = "finished",
    *,
    stage: str = "thinker",
    n: int = 3,
    t0: int = 10**18,
):
    """The events of one request on one stage, through a real log."""
    log = MemoryLog(ManualClock(t0))
    blobs = MemoryBlobStore()
    rid = "req-1"
    log.append(Admitted(request_id=rid, pipeline="p", spec=spec))
    log.append(Routed(request_id=rid, stage=stage, replica=0, seq=0, sources=(0,), last=True))
    log.append(StageStarted(request_id=rid, stage=stage, replica=0))
    for i in range(n):
        if spec.outputs == ("audio",):
            ref = blobs.put_array(np.sin(np.arange(400, dtype=np.float32) * (i + 1) / 10))
            log.append(
                Chunk(request_id=rid, stage=stage, replica=0, index=i, modality="audio", blob=ref)
            )
        else:
            log.append(
                Chunk(
                    request_id=rid, stage=stage, replica=0, index=i, modality="text", text=f"w{i} "
                )
            )
    if end == "finished":
        log.append(
            StageFinished(
                request_id=rid, stage=stage, replica=0, chunks=n, prompt_tokens=2, output_tokens=n
            )
        )
        log.append(Finished(request_id=rid, cause=log.next_pos - 1))
    elif end == "failed":
        log.append(Failed(request_id=rid, reason="stage_error", message="boom", stage=stage))
    elif end == "cancelled":
        ask = log.append(CancelRequested(request_id=rid, reason="deadline"))
        log.append(
            StageFinished(request_id=rid, stage=stage, replica=0, chunks=n, finish_reason="aborted")
        )
        log.append(Cancelled(request_id=rid, reason="deadline", cause=ask.pos))
    return log.events_for(rid), blobs


def test_same_events_same_bytes_and_stream_pieces_join_to_the_body():
    events, blobs = run(chat_spec(include_usage=True))
    a = render_response(events, blobs)
    b = render_response(list(events), blobs)
    assert a == b
    assert b"".join(render_stream(events, blobs)) == a.body
    assert a.head.streamed and a.head.header("x-request-id") == "req-1"
    frames = parse_sse(a.body)
    first = json.loads(frames[0]["data"])
    assert (
        first["created"] == 10**18 // 10**9
        and first["id"] == "chatcmpl-req-1"
        and first["model"] == "m"
    )
    assert json.loads(frames[-2]["data"])["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 3,
        "total_tokens": 5,
    }


def test_rendering_depends_on_the_admission_time_not_the_clock():
    a, blobs = run(chat_spec(), t0=10**18)
    b, _ = run(chat_spec(), t0=2 * 10**18)
    assert render_response(a, blobs).body != render_response(b, blobs).body
    c, _ = run(chat_spec(), t0=10**18)
    assert render_response(a, blobs).body == render_response(c, blobs).body


def test_incremental_rendering_matches_the_whole():
    events, blobs = run(chat_spec())
    r = StreamRenderer(blobs)
    pieces = []
    for ev in events:
        pieces.extend(r.feed(ev))
        if ev is events[0]:
            assert r.head is not None and r.head.status == 200  # headers at admission
    assert r.done and b"".join(pieces) == render_response(events, blobs).body
    assert r.feed(events[-1]) == []  # nothing after the end


@pytest.mark.parametrize(
    ("end", "status", "code"),
    [("failed", 500, "stage_error"), ("cancelled", 504, "deadline_exceeded")],
)
def test_a_failed_or_cancelled_stream_ends_with_an_error_and_done(end, status, code):
    events, blobs = run(chat_spec(), end)
    frames = parse_sse(render_response(events, blobs).body)
    assert frames[-1] == {"data": "[DONE]"}
    err = json.loads(frames[-2]["data"])["error"]
    assert err["code"] == code and "req-1" in err["message"]
    # Not streamed: the error is the response.
    whole = render_response(run(chat_spec(stream=False), end)[0], blobs)
    assert whole.head.status == status
    assert json.loads(whole.body)["error"]["code"] == code


def test_a_refusal_renders_429_or_503_with_retry_after():
    for reason, status, retry in [("overloaded", 429, "1"), ("not_ready", 503, "5")]:
        ev = Rejected(
            request_id="r",
            pipeline="p",
            spec=chat_spec(),
            reason=reason,
            message="full",
            pos=0,
            ts_ns=1,
        )
        r = render_response([ev], MemoryBlobStore())
        assert r.head.status == status and r.head.header("Retry-After") == retry
        body = json.loads(r.body)["error"]
        assert body["code"] == reason and body["type"] == (
            "rate_limit_error" if status == 429 else "service_unavailable_error"
        )


def test_a_failed_raw_audio_stream_is_cut_not_completed():
    events, blobs = run(speech_spec("wav", "audio"), "failed", stage="voice")
    r = render_response(events, blobs)
    assert r.aborted and r.head.status == 200 and len(r.body) > 44
    ok = render_response(run(speech_spec("wav", "audio"), stage="voice")[0], blobs)
    assert not ok.aborted and ok.body.startswith(r.body[:44])


@pytest.mark.parametrize("fmt", AUDIO_FORMATS)
def test_speech_renders_deterministically_in_every_format(fmt):
    for stream_format in ("", "audio", "sse"):
        e1, b1 = run(speech_spec(fmt, stream_format), stage="voice")
        e2, b2 = run(speech_spec(fmt, stream_format), stage="voice")
        r1, r2 = render_response(e1, b1), render_response(e2, b2)
        assert r1 == r2 and len(r1.body) > 0


def test_encoders_are_deterministic_and_streams_are_files():
    x = (np.sin(np.arange(24000) * 0.05) * 0.5).astype(np.float32)
    for fmt in AUDIO_FORMATS:
        assert encode_audio(x, 24000, fmt) == encode_audio(x, 24000, fmt)
        e1, e2 = StreamEncoder(fmt, 24000), StreamEncoder(fmt, 24000)
        s1 = b"".join([*(e1.write(c) for c in np.array_split(x, 7)), e1.finish()])
        s2 = b"".join([*(e2.write(c) for c in np.array_split(x, 7)), e2.finish()])
        assert s1 == s2 and len(s1) > 100


def test_events_and_states_as_objects():
    events, _ = run(chat_spec())
    obj = as_object(events[0])
    assert (
        obj["type"] == "admitted"
        and obj["request_id"] == "req-1"
        and obj["spec"]["response"]["stream"] is True
    )
    assert msgspec.json.decode(msgspec.json.encode(obj))["pos"] == 0
    log = MemoryLog(ManualClock(1))
    for ev in events:
        log.append(msgspec.structs.replace(ev, pos=-1))
    state = json.loads(state_json(log.state.requests["req-1"]))
    assert state["status"] == "finished" and state["stages"][0]["chunks"] == 3


def test_a_batch_renders_one_choice_per_member_and_needs_them_all():
    def member(i: int):
        spec = chat_spec(stream=False, group=Group(id="g", index=i, size=2))
        events, blobs = run(spec)
        return [msgspec.structs.replace(e, request_id=f"g-{i}") for e in events], blobs

    (e0, blobs), (e1, _) = member(0), member(1)
    with pytest.raises(ValueError, match="members"):
        render_response(e0, blobs)
    r = render_response([*e1, *e0], blobs)  # any order: members sort by index
    body = json.loads(r.body)
    assert r.head.header("X-Request-Id") == "g-0,g-1"
    assert body["id"] == "chatcmpl-g" and body["request_ids"] == ["g-0", "g-1"]
    assert [c["message"]["content"] for c in body["choices"]] == ["w0 w1 w2 "] * 2
    assert body["usage"]["total_tokens"] == 10
