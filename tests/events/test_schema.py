"""Schema compatibility: version-1 records stay readable forever, and a
record from a newer omnix is refused with an error that says to upgrade.

The expected events below are spelled out here on purpose rather than
imported from ``fixtures/make_fixture.py``: the committed bytes and this
list together are the contract.  When a field is appended to a type (with a
default, and ``SCHEMA_VERSION`` bumped), both sides of ``==`` get the
default, so this test keeps passing unchanged.
"""

from __future__ import annotations

import shutil
import struct
import zlib
from pathlib import Path

import msgspec
import pytest

from omnix.events.codec import SchemaError, decode_event, decode_events, encode_event, encode_events
from omnix.events.disklog import (
    FORMAT_VERSION,
    HEADER_SIZE,
    DiskLog,
    LogConfig,
    LogFormatError,
    iter_log,
)
from omnix.events.types import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    Admitted,
    BlobRef,
    Cancelled,
    CancelRequested,
    ChatMessage,
    Chunk,
    DeadlineExpired,
    Failed,
    Finished,
    InputAppended,
    Progress,
    Rejected,
    Released,
    RequestSpec,
    Routed,
    Scaled,
    SessionChanged,
    StageFailed,
    StageFinished,
    StageParams,
    StageStarted,
    TokenLogprob,
    WorkerJoined,
    WorkerLost,
)

FIXTURES = Path(__file__).parent / "fixtures"
T0 = 1_700_000_000_000_000_000


def _spec(prompt: str) -> RequestSpec:
    return RequestSpec(
        prompt=prompt,
        messages=(ChatMessage("system", "be brief"), ChatMessage("user", prompt)),
        outputs=("text", "audio"),
        stage_params={
            "thinker": StageParams(
                temperature=0.7,
                top_p=0.9,
                top_k=40,
                max_tokens=64,
                seed=11,
                stop=("</s>",),
                num_inference_steps=20,
                guidance_scale=4.5,
                width=512,
                height=256,
                voice="ethan",
                speed=1.25,
            )
        },
        seed=1234,
        deadline_ms=30_000,
        api="chat.completions",
        model="qwen3-omni-tiny",
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        options={"stream": "true", "audio_format": "wav"},
    )


def _t(pos: int) -> dict[str, int]:
    return {"pos": pos, "ts_ns": T0 + pos * 1_000}


EXPECTED_V1 = [
    WorkerJoined(
        **_t(0),
        worker_id="thinker/0",
        stage="thinker",
        replica=0,
        engine="vllm",
        capacity=8,
        pid=4242,
    ),
    WorkerJoined(
        **_t(1),
        worker_id="talker/1",
        stage="talker",
        replica=1,
        engine="vllm",
        capacity=4,
        pid=4243,
    ),
    Admitted(**_t(2), request_id="req-a", pipeline="qwen3-omni", spec=_spec("hello")),
    Routed(
        **_t(3),
        request_id="req-a",
        stage="thinker",
        replica=0,
        seq=0,
        sources=(2,),
        last=True,
        cause=2,
    ),
    StageStarted(**_t(4), request_id="req-a", stage="thinker", replica=0),
    Progress(**_t(5), request_id="req-a", stage="thinker", replica=0, step=1, total=4),
    Chunk(
        **_t(6),
        request_id="req-a",
        stage="thinker",
        replica=0,
        index=0,
        modality="audio",
        text="Hel",
        token_ids=(9906, 75),
        blob=BlobRef("6d1b0c8e5e2f4a3b9c7d1e0f2a3b4c5d", 1280, "<f4", (2, 160), "audio/pcm"),
    ),
    StageFinished(
        **_t(7),
        request_id="req-a",
        stage="thinker",
        replica=0,
        chunks=1,
        finish_reason="length",
        prompt_tokens=12,
        output_tokens=2,
    ),
    Finished(**_t(8), request_id="req-a", cause=7),
    Rejected(
        **_t(9),
        request_id="req-b",
        pipeline="qwen3-omni",
        spec=_spec("busy?"),
        reason="overloaded",
        message="queue full",
    ),
    Admitted(**_t(10), request_id="req-c", pipeline="qwen3-omni", spec=_spec("slow")),
    Routed(
        **_t(11),
        request_id="req-c",
        stage="talker",
        replica=1,
        seq=0,
        sources=(10,),
        last=True,
        cause=10,
    ),
    DeadlineExpired(**_t(12), request_id="req-c", scope="request"),
    CancelRequested(**_t(13), request_id="req-c", reason="deadline", cause=12),
    StageFinished(
        **_t(14),
        request_id="req-c",
        stage="talker",
        replica=1,
        chunks=0,
        finish_reason="aborted",
        prompt_tokens=3,
        output_tokens=1,
    ),
    Cancelled(**_t(15), request_id="req-c", reason="deadline", cause=13),
    Admitted(**_t(16), request_id="req-d", pipeline="qwen3-omni", spec=_spec("boom")),
    Routed(
        **_t(17),
        request_id="req-d",
        stage="thinker",
        replica=0,
        seq=0,
        sources=(16,),
        last=True,
        cause=16,
    ),
    StageFailed(
        **_t(18),
        request_id="req-d",
        stage="thinker",
        replica=0,
        message="CUDA error: out of memory",
    ),
    Failed(
        **_t(19),
        request_id="req-d",
        reason="stage_error",
        message="thinker failed",
        stage="thinker",
        cause=18,
    ),
    WorkerLost(
        **_t(20), worker_id="talker/1", stage="talker", replica=1, reason="missed heartbeats"
    ),
]


def test_fixture_covers_every_event_type() -> None:
    # Released came with schema v4, SessionChanged and InputAppended with v7,
    # Scaled with v8: they have no v1 form (test_released_round_trips,
    # test_schema_v7.py, test_schema_v8.py).
    later = {Released, SessionChanged, InputAppended, Scaled}
    assert {type(e) for e in EXPECTED_V1} == set(EVENT_TYPES) - later


def test_released_round_trips() -> None:
    ev = Released(pos=7, ts_ns=123, request_ids=("req-a", "req-b"), reason="count")
    data = encode_event(ev)
    assert data[0] == SCHEMA_VERSION == 15
    assert decode_event(data) == ev
    assert decode_events(encode_events([ev])) == [ev]


def test_v5_sampling_params_and_chunk_logprobs_round_trip() -> None:
    """Schema v5: StageParams' sampling extras and Chunk.logprobs."""
    params = StageParams(
        min_tokens=2,
        min_p=0.1,
        repetition_penalty=1.1,
        frequency_penalty=0.5,
        presence_penalty=-0.5,
        stop_token_ids=(1, 2),
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        ignore_eos=True,
        logit_bias={42: -100.0},
        logprobs=3,
        json_schema='{"type":"object"}',
        json_object=None,
    )
    adm = Admitted(
        pos=0,
        ts_ns=T0,
        request_id="r",
        pipeline="p",
        spec=RequestSpec(prompt="x", stage_params={"thinker": params}),
    )
    lp = TokenLogprob(token="hi", logprob=-0.25, top=(("hi", -0.25), ("yo", -2.0)))
    chunk = Chunk(
        pos=1,
        ts_ns=T0,
        request_id="r",
        stage="thinker",
        replica=0,
        index=0,
        modality="text",
        text="hi",
        token_ids=(7,),
        logprobs=(lp,),
    )
    assert decode_events(encode_events([adm, chunk])) == [adm, chunk]
    # Without them, a chunk encodes as before (the default is trailing).
    plain = msgspec.structs.replace(chunk, logprobs=())
    assert decode_event(encode_event(plain)) == plain


def test_v7_media_fields_round_trip() -> None:
    """Schema v7: edit and video media, diffusion fields, a partial image
    on a Progress event, video options, a client's deletion."""
    from omnix.events.options import ImageOptions, VideoOptions
    from omnix.events.types import MediaPart

    ref = BlobRef(digest="a" * 32, nbytes=12, dtype="uint8", shape=(2, 2, 3))
    spec = RequestSpec(
        prompt="x",
        messages=(
            ChatMessage(
                "user",
                "x",
                media=(
                    MediaPart(kind="image", blob=ref),
                    MediaPart(kind="mask", blob=ref),
                    MediaPart(kind="video", blob=ref, fps=2.5),
                ),
            ),
        ),
        outputs=("video",),
        stage_params={"v": StageParams(strength=0.5, partial_images=2, num_frames=9, fps=16)},
        response=VideoOptions(video_stage="v", seconds="1", size="32x32", fps=16, num_frames=17),
    )
    adm = Admitted(pos=0, ts_ns=T0, request_id="r", pipeline="p", spec=spec)
    edit = msgspec.structs.replace(
        adm, spec=msgspec.structs.replace(spec, response=ImageOptions(edit=True, size="8x8"))
    )
    prog = Progress(
        pos=1, ts_ns=T0, request_id="r", stage="v", replica=0, step=1, total=2, blob=ref
    )
    gone = Released(pos=2, ts_ns=T0, request_ids=("r",), reason="deleted")
    events = [adm, edit, prog, gone]
    assert decode_events(encode_events(events)) == events
    # A Progress without a partial image encodes as before (the default trails).
    plain = msgspec.structs.replace(prog, blob=None)
    assert decode_event(encode_event(plain)) == plain


def test_v1_event_list_fixture_decodes() -> None:
    data = (FIXTURES / "events_v1.bin").read_bytes()
    assert data[0] == 1, "the fixture is schema version 1"
    got = decode_events(data)
    assert got == EXPECTED_V1
    # Field spot checks, in case both sides ever drift together.
    chunk = got[6]
    assert isinstance(chunk, Chunk)
    assert chunk.blob is not None and chunk.blob.shape == (2, 160) and chunk.blob.dtype == "<f4"
    adm = got[2]
    assert isinstance(adm, Admitted)
    assert adm.spec.stage_params["thinker"].stop == ("</s>",)
    assert adm.spec.options == {"stream": "true", "audio_format": "wav"}


def test_v1_single_records_decode() -> None:
    # Each event also round-trips through the single-record form.
    for ev in EXPECTED_V1:
        assert decode_event(encode_event(ev)) == ev


def test_v1_disk_segment_fixture_opens(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "log_v1", tmp_path / "log")
    assert list(iter_log(tmp_path / "log")) == EXPECTED_V1
    with DiskLog(tmp_path / "log") as log:
        assert log.recovery.truncated_bytes == 0
        assert list(log.read()) == EXPECTED_V1
        statuses = {rid: rs.status for rid, rs in log.state.requests.items()}
        assert statuses == {
            "req-a": "finished",
            "req-b": "rejected",
            "req-c": "cancelled",
            "req-d": "failed",
        }
        assert not log.state.workers["talker/1"].alive
        assert [e.pos for e in log.events_for("req-c")] == [10, 11, 12, 13, 14, 15]


def test_future_schema_version_is_refused() -> None:
    data = bytearray(encode_event(EXPECTED_V1[2]))
    data[0] = SCHEMA_VERSION + 1
    with pytest.raises(SchemaError, match=r"version \d+ is not readable.*upgrade omnix"):
        decode_event(bytes(data))
    listed = bytearray((FIXTURES / "events_v1.bin").read_bytes())
    listed[0] = SCHEMA_VERSION + 1
    with pytest.raises(SchemaError, match="newer omnix"):
        decode_events(bytes(listed))
    with pytest.raises(SchemaError, match="version 0"):
        decode_event(b"\x00" + bytes(data[1:]))


def test_future_schema_record_in_a_log_is_refused_not_truncated(tmp_path: Path) -> None:
    root = tmp_path / "log"
    with DiskLog(root, LogConfig(fsync="none")) as log:
        for ev in EXPECTED_V1[:3]:
            log.append(ev)
    seg = root / "00000000000000000000.seg"
    size = seg.stat().st_size
    # A well-formed record (valid checksum) whose payload says "version N+1".
    payload = bytes([SCHEMA_VERSION + 1]) + encode_event(EXPECTED_V1[3])[1:]
    with seg.open("ab") as f:
        f.write(struct.pack("<II", len(payload), zlib.crc32(payload)) + payload)
    with pytest.raises(
        SchemaError, match=r"00000000000000000000\.seg at byte \d+ \(position 3\).*upgrade"
    ):
        DiskLog(root)
    assert seg.stat().st_size == size + 8 + len(payload), "a newer record must never be cut off"


def test_future_segment_format_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "log"
    with DiskLog(root, LogConfig(fsync="none")) as log:
        log.append(EXPECTED_V1[0])
    seg = root / "00000000000000000000.seg"
    raw = bytearray(seg.read_bytes())
    struct.pack_into("<H", raw, 8, FORMAT_VERSION + 1)
    struct.pack_into("<I", raw, HEADER_SIZE - 4, zlib.crc32(bytes(raw[: HEADER_SIZE - 4])))
    seg.write_bytes(bytes(raw))
    with pytest.raises(LogFormatError, match=r"format version 2 is not readable.*upgrade omnix"):
        DiskLog(root)
