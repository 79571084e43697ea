"""Schema v9: ``StageFailed.retry``, False when an engine refused the
request's own input.  A v8 record (no such field) reads as a failure that
may continue elsewhere, as before."""

from __future__ import annotations

import msgspec

from omnix.events.codec import decode_event, encode_event
from omnix.events.types import SCHEMA_VERSION, StageFailed


def test_a_refused_input_round_trips_and_a_v8_failure_reads_as_retryable() -> None:
    ev = StageFailed(
        pos=4,
        ts_ns=9,
        request_id="r",
        stage="talker",
        replica=1,
        message="ValueError: x",
        retry=False,
    )
    data = encode_event(ev)
    assert data[0] == SCHEMA_VERSION == 15
    assert decode_event(data) == ev
    # The v8 layout: the same array without the appended field.
    fields = msgspec.msgpack.decode(data[1:])
    v8 = bytes([8]) + msgspec.msgpack.encode(fields[:-1])
    old = decode_event(v8)
    assert isinstance(old, StageFailed) and old.retry is True and old.message == "ValueError: x"
