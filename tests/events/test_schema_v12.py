"""Schema v12: realtime function calls.  A session's settings carry its
tools and tool choice (JSON), a conversation item a client's
``function_call`` or ``function_call_output``.  Records of v11 (none of
these fields) read as before: no tools, a message item."""

from __future__ import annotations

import msgspec

from omnix.events.codec import decode_event, encode_event
from omnix.events.sessions import ItemPart, SessionItem, SessionSettings
from omnix.events.types import SCHEMA_VERSION, SessionChanged


def _v11(ev: SessionChanged, at: int, drop: int) -> SessionChanged:
    """``ev`` as a v11 writer wrote it: its field at ``at`` (an array)
    without its last ``drop`` entries."""
    fields = msgspec.msgpack.decode(encode_event(ev)[1:])
    fields[at] = fields[at][:-drop]
    old = decode_event(bytes([10]) + msgspec.msgpack.encode(fields))
    assert isinstance(old, SessionChanged)
    return old


def test_tools_and_call_items_round_trip_and_v11_reads_without_them() -> None:
    settings = SessionSettings(
        model="m",
        instructions="hi",
        tools='[{"name":"get_weather","type":"function"}]',
        tool_choice='{"name":"get_weather","type":"function"}',
    )
    ev = SessionChanged(pos=1, ts_ns=2, session="s", op="configured", settings=settings)
    data = encode_event(ev)
    assert data[0] == SCHEMA_VERSION == 15
    assert decode_event(data) == ev
    old = _v11(ev, 5, 3)  # (and v13's parallel_tool_calls)
    assert old.settings is not None and old.settings.instructions == "hi"
    assert (old.settings.tools, old.settings.tool_choice) == ("", "")

    for item in (
        SessionItem(id="i1", role="", type="function_call", call_id="c", name="f", arguments="{}"),
        SessionItem(id="i2", role="", type="function_call_output", call_id="c", output="42"),
    ):
        ev = SessionChanged(pos=3, ts_ns=4, session="s", op="item_added", item=item, previous="i0")
        assert decode_event(encode_event(ev)) == ev
    msg = SessionItem(id="i3", role="user", parts=(ItemPart("input_text", "q"),))
    ev = SessionChanged(pos=5, ts_ns=6, session="s", op="item_added", item=msg)
    old = _v11(ev, 6, 5)
    assert old.item is not None and old.item.type == "message" and old.item.parts == msg.parts
