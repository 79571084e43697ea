"""Schema v14: full duplex.  An appended input may be a piece of audio (a
duplex session's user frame: ``InputAppended.modality`` ``audio`` and its
array in ``blob``), and a session's admission records ``DuplexOptions``.
Records of v13 (a text append: no such fields) read as before; retention
counts a frame's blob as it counts a chunk's, and releases it with its
request; a trace carries it."""

from __future__ import annotations

import msgspec
import numpy as np

from omnix.events.blobs import MemoryBlobStore
from omnix.events.codec import decode_event, encode_event
from omnix.events.log import MemoryLog
from omnix.events.options import API_REALTIME_DUPLEX, DuplexOptions, group_of
from omnix.events.retention import Retention, RetentionPolicy
from omnix.events.types import (
    SCHEMA_VERSION,
    Admitted,
    Finished,
    InputAppended,
    RequestSpec,
    Routed,
    StageFinished,
    StageStarted,
    WorkerJoined,
)

OPTS = DuplexOptions(
    response="resp_1",
    item="item_1",
    usage_stage="duplex",
    audio_stage="duplex",
    input_format="pcm16",
    voice="",
)
SPEC = RequestSpec(outputs=("audio",), api=API_REALTIME_DUPLEX, response=OPTS, input_streams=True)


def test_a_frame_and_a_sessions_options_round_trip_and_v13_text_reads_as_before() -> None:
    blobs = MemoryBlobStore()
    ref = blobs.put_array(np.zeros(1920, dtype=np.float32))
    frame = InputAppended(pos=3, ts_ns=4, request_id="d", text="", modality="audio", blob=ref)
    data = encode_event(frame)
    assert data[0] == SCHEMA_VERSION == 15
    assert decode_event(data) == frame
    adm = Admitted(pos=1, ts_ns=2, request_id="d", pipeline="moshi", spec=SPEC)
    back = decode_event(encode_event(adm))
    assert back == adm and isinstance(back, Admitted)
    assert back.spec.response == OPTS and group_of(OPTS) is None

    text = InputAppended(pos=5, ts_ns=6, request_id="t", text="more", last=True)
    fields = msgspec.msgpack.decode(encode_event(text)[1:])
    old = decode_event(bytes([13]) + msgspec.msgpack.encode(fields[:-2]))
    assert old == text and old.modality == "text" and old.blob is None


def test_retention_holds_a_sessions_frames_until_it_is_released() -> None:
    log = MemoryLog()
    blobs = MemoryBlobStore()
    log.append(
        WorkerJoined(worker_id="duplex/0", stage="duplex", replica=0, engine="x", capacity=8)
    )
    ret = Retention(log, RetentionPolicy(window_s=None, max_requests=0, max_bytes=None), blobs)
    frames = [blobs.put_array(np.full(1920, k, dtype=np.float32)) for k in range(3)]
    blobs.take_fresh()  # (put long before: not one a worker is about to refer to)
    log.append(Admitted(request_id="d", pipeline="moshi", spec=SPEC))
    log.append(Routed(request_id="d", stage="duplex", replica=0, seq=0, sources=(), last=False))
    log.append(StageStarted(request_id="d", stage="duplex", replica=0))
    for ref in frames:
        log.append(InputAppended(request_id="d", text="", modality="audio", blob=ref))
    assert ret.blobs_retained_bytes == 3 * 1920 * 4  # in flight: every frame kept
    log.append(InputAppended(request_id="d", text="", last=True))
    log.append(StageFinished(request_id="d", stage="duplex", replica=0, chunks=0))
    log.append(Finished(request_id="d"))
    assert ret.status("d") == "released"  # at once: max_requests=0
    assert ret.blobs_retained_bytes == 0
    assert not any(ref in blobs for ref in frames)
