"""Events and request states as the request routes send them.

Owns: one event of ``/v1/requests/{id}/events`` as SSE (``event_sse``:
``id`` its log position, ``event`` its type tag, ``data`` the event as
msgspec JSON, a tagged array; ``event_object_sse``: ``data`` as an object
with field names), any Struct as nested objects with field names
(``as_object``), and a folded state as JSON (``state_json``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from omnix.events.reducer import RequestState
from omnix.events.types import Event, event_tag

_enc = msgspec.json.Encoder()


def event_sse(ev: Event) -> bytes:
    """One event of ``/v1/requests/{id}/events``: ``id`` is its log
    position (what Last-Event-ID resumes after), ``event`` its type tag,
    ``data`` the event as msgspec JSON (a tagged array; decode it with
    ``msgspec.json.decode(data, type=omnix.events.types.Event)``)."""
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (ev.pos, event_tag(ev).encode(), _enc.encode(ev))


def event_object_sse(ev: Event) -> bytes:
    """Like ``event_sse`` with ``data`` as a JSON object (``?format=object``)."""
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (
        ev.pos,
        event_tag(ev).encode(),
        _enc.encode(as_object(ev)),
    )


def as_object(value: Any) -> Any:
    """A Struct (array-like or not) as nested dicts with field names, tagged
    structs with their ``type``; other values as msgspec would encode them."""
    if isinstance(value, msgspec.Struct):
        cfg = value.__struct_config__
        out: dict[str, Any] = {}
        if cfg.tag is not None:
            out[cfg.tag_field or "type"] = cfg.tag
        for name in value.__struct_fields__:
            out[name] = as_object(getattr(value, name))
        return out
    if isinstance(value, (list, tuple)):
        return [as_object(v) for v in value]
    if isinstance(value, dict):
        return {k: as_object(v) for k, v in value.items()}
    return value


def state_json(rs: RequestState) -> bytes:
    """GET /v1/requests/{id}: the folded state as a JSON object."""
    return _enc.encode(as_object(rs))
