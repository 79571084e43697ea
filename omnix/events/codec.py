"""Binary encoding of events: one schema-versioned msgpack form everywhere.

Owns: turning an ``Event`` into bytes and back, for the disk log, traces and
the wire.  Does not own framing (record headers, checksums: ``disklog.py``;
ZMQ frames: ``omnix.transport``).

The encoded form is ``[version_byte] + msgpack(event)``.  The leading byte is
``SCHEMA_VERSION`` of the writer; a reader accepts any version up to its own
(fields are only ever appended with defaults, so an old record decodes into
the new type with defaults filled in) and refuses a newer one with an error
that says to upgrade.  Never pickle.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

import msgspec

from omnix.events.types import SCHEMA_VERSION, Event

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Event)
_VERSION_PREFIX = bytes([SCHEMA_VERSION])


class SchemaError(ValueError):
    """An encoded event this reader cannot understand."""


def encode_event(ev: Event) -> bytes:
    return _VERSION_PREFIX + _encoder.encode(ev)


def encode_event_into(ev: Event, buf: bytearray) -> None:
    """Append the encoded event to ``buf`` (no intermediate bytes object)."""
    buf.append(SCHEMA_VERSION)
    _encoder.encode_into(ev, buf, len(buf))


def decode_event(data: bytes | memoryview) -> Event:
    if not data:
        raise SchemaError("empty event record")
    version = data[0]
    if version > SCHEMA_VERSION or version == 0:
        raise SchemaError(
            f"event schema version {version} is not readable by this omnix "
            f"(reads versions 1..{SCHEMA_VERSION}); upgrade omnix to read this log"
        )
    try:
        # Slicing the bytes (a small copy) is cheaper than a memoryview
        # slice for event-sized records; a memoryview input stays a view.
        return _decoder.decode(data[1:])
    except msgspec.DecodeError as exc:
        raise SchemaError(f"malformed event record: {exc}") from exc


def encode_events(events: list[Event]) -> bytes:
    """Encode a list of events as one msgpack array (traces, fixtures)."""
    return _VERSION_PREFIX + _encoder.encode(events)


_list_decoder = msgspec.msgpack.Decoder(list[Event])


def decode_events(data: bytes) -> list[Event]:
    if not data or data[0] > SCHEMA_VERSION or data[0] == 0:
        raise SchemaError("not an omnix event list, or written by a newer omnix")
    return _list_decoder.decode(memoryview(data)[1:])


def _array_head(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + struct.pack(">H", n)
    return b"\xdd" + struct.pack(">I", n)


def encode_batches(events: Iterable[Event], limit: int) -> Iterator[tuple[int, bytes]]:
    """Consecutive events as ``encode_events`` lists of at most about
    ``limit`` bytes each (an event bigger than ``limit`` alone is one list):
    yields (events in it, its bytes).  Each event is encoded once."""
    body = bytearray()
    n = 0
    scratch = bytearray()
    for ev in events:
        scratch.clear()
        _encoder.encode_into(ev, scratch)
        if n and len(body) + len(scratch) + 6 > limit:
            yield n, _VERSION_PREFIX + _array_head(n) + body
            body.clear()
            n = 0
        body += scratch
        n += 1
    if n:
        yield n, _VERSION_PREFIX + _array_head(n) + body
