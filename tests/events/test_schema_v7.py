"""Schema v7: a ``/v1/realtime`` response's options (``RealtimeOptions``)
and the cancel reason ``interrupted`` are in the log; records of v6 and
older read as before (v7 appended a member to a union and a value to a
literal, so their bytes are the same)."""

from __future__ import annotations

from omnix.events.codec import decode_event, decode_events, encode_event, encode_events
from omnix.events.options import API_REALTIME, ChatOptions, RealtimeOptions, group_of
from omnix.events.types import (
    SCHEMA_VERSION,
    Admitted,
    Cancelled,
    CancelRequested,
    ChatMessage,
    RequestSpec,
)

OPTS = RealtimeOptions(
    render=1,
    session="sess_1",
    item="item_2",
    previous_item="item_1",
    conversation="conv_1",
    modalities=("audio",),
    usage_stage="thinker",
    text_stage="thinker",
    audio_stage="code2wav",
    voice="ethan",
    max_output_tokens=64,
    metadata={"k": "v"},
)


def _admitted(response: object) -> Admitted:
    spec = RequestSpec(
        messages=(ChatMessage(role="user", content="hi"),),
        outputs=("text", "audio"),
        api=API_REALTIME,
        response=response,  # type: ignore[arg-type]
    )
    return Admitted(pos=0, ts_ns=10, request_id="resp_1", pipeline="p", spec=spec)


def test_a_realtime_response_round_trips() -> None:
    adm = _admitted(OPTS)
    data = encode_event(adm)
    assert data[0] == SCHEMA_VERSION == 15
    back = decode_event(data)
    assert back == adm
    assert isinstance(back, Admitted) and isinstance(back.spec.response, RealtimeOptions)
    assert group_of(back.spec.response) is None


def test_an_interrupted_cancel_round_trips() -> None:
    evs = [
        CancelRequested(pos=1, ts_ns=11, request_id="resp_1", reason="interrupted"),
        Cancelled(pos=2, ts_ns=12, request_id="resp_1", reason="interrupted", cause=1),
    ]
    assert decode_events(encode_events(evs)) == evs


def test_a_v6_record_reads_as_before() -> None:
    adm = _admitted(ChatOptions(render=3, stream=True, text_stage="thinker"))
    data = bytearray(encode_event(adm))
    data[0] = 6
    assert decode_event(bytes(data)) == adm


def test_input_appended_round_trips_and_keeps_to_the_rules() -> None:
    import pytest

    from omnix.events.log import MemoryLog
    from omnix.events.transitions import IllegalTransition
    from omnix.events.types import InputAppended

    log = MemoryLog()
    spec = RequestSpec(prompt="Hello.", outputs=("audio",), input_streams=True)
    log.append(Admitted(request_id="r", pipeline="p", spec=spec))
    assert log.state.requests["r"].input_open
    ev = log.append(InputAppended(request_id="r", text="More."))
    assert decode_event(encode_event(ev)) == ev
    log.append(InputAppended(request_id="r", text="", last=True))
    assert not log.state.requests["r"].input_open
    with pytest.raises(IllegalTransition, match="takes no more input"):
        log.append(InputAppended(request_id="r", text="late"))
    log.append(Admitted(request_id="s", pipeline="p", spec=RequestSpec(prompt="x")))
    with pytest.raises(IllegalTransition, match="takes no more input"):
        log.append(InputAppended(request_id="s", text="x"))


def test_a_state_without_streamed_input_hashes_as_before() -> None:
    """``input_open`` enters a state's digest only when set, so traces of
    earlier omnix verify (tests/replay holds them)."""
    import msgspec

    from omnix.events.log import MemoryLog
    from omnix.events.reducer import state_bytes

    log = MemoryLog()
    log.append(Admitted(request_id="r", pipeline="p", spec=RequestSpec(prompt="x")))
    rs = log.state.requests["r"]
    assert state_bytes(rs) == msgspec.msgpack.encode(msgspec.structs.astuple(rs)[:-1])
