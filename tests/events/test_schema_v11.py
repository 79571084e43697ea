"""Schema v11: speech instructions.  A stage's parameters carry a Qwen3-TTS
talker's instruction (or VoiceDesign's description of the voice) and the
language spoken; an admission of v10 (neither field) reads with none."""

from __future__ import annotations

import msgspec

from omnix.events.codec import decode_event, encode_event
from omnix.events.types import SCHEMA_VERSION, Admitted, RequestSpec, StageParams


def test_speech_instructions_round_trip_and_v10_params_read_without_them() -> None:
    params = StageParams(voice="vivian", instructions="whisper, slowly", language="english")
    spec = RequestSpec(prompt="hello", stage_params={"talker": params})
    ev = Admitted(pos=1, ts_ns=2, request_id="r", pipeline="p", spec=spec)
    data = encode_event(ev)
    assert data[0] == SCHEMA_VERSION == 15
    assert decode_event(data) == ev

    # A v10 writer's StageParams ended before the two fields.
    v10 = msgspec.msgpack.encode(StageParams(voice="vivian"))
    old = msgspec.msgpack.decode(v10, type=StageParams)
    assert old.voice == "vivian"
    assert old.instructions is None and old.language is None
