"""Schema v13: a realtime session's settings carry its
``parallel_tool_calls`` (None: not set), so a session folded back from the
log, resumed or replayed, calls as the client asked.  Records of v12 (no
such field) read as before: not set."""

from __future__ import annotations

import msgspec
import pytest

from omnix.events.codec import decode_event, encode_event
from omnix.events.sessions import SessionSettings
from omnix.events.types import SCHEMA_VERSION, SessionChanged

SETTINGS_AT = 5  # SessionChanged's settings, in its array


@pytest.mark.parametrize("parallel", [False, True])
def test_parallel_tool_calls_round_trips_and_v12_reads_it_unset(parallel: bool) -> None:
    settings = SessionSettings(model="m", tools='[{"name":"f","type":"function"}]')
    settings = msgspec.structs.replace(settings, parallel_tool_calls=parallel)
    ev = SessionChanged(pos=1, ts_ns=2, session="s", op="configured", settings=settings)
    data = encode_event(ev)
    assert data[0] == SCHEMA_VERSION == 15
    assert decode_event(data) == ev

    # As a v12 writer wrote it: the settings without their last field.
    fields = msgspec.msgpack.decode(data[1:])
    fields[SETTINGS_AT] = fields[SETTINGS_AT][:-1]
    old = decode_event(bytes([12]) + msgspec.msgpack.encode(fields))
    assert isinstance(old, SessionChanged) and old.settings is not None
    assert old.settings.tools == settings.tools and old.settings.parallel_tool_calls is None


def test_unset_is_the_default() -> None:
    assert SessionSettings().parallel_tool_calls is None
