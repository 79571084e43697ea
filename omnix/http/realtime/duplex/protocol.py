"""The duplex vocabulary's client events, as omnix takes them, and its errors.

Owns: the client events of vLLM-Omni's ``/v1/realtime?duplex=1`` (OpenAI
Realtime's names plus ``session.heartbeat``, ``session.event_ack``,
``session.close``, ``session.resume``, ``barge_in``, ``turn.signal``,
``input.cancel``, ``input.text.append``, ``playback.ack``, and the aliases
vLLM-Omni's translator takes: ``input.commit``, ``close``,
``close_session``, ``input_text.append``, ``push_text``, ``signal_turn``,
``audio.playback_ack``) as Structs (``CLIENT_EVENTS``), ``parse`` (one
text message to its event), ``DuplexError`` (what the session refuses:
an ``error`` event whose ``error.type`` is OpenAI's class for the code,
``ERROR_TYPES``) and the framing of a server event (``server_event``,
with the ``server_event_seq`` of the events a client may have replayed).

Fields are vLLM-Omni's: a field this module does not name is ignored
(its clients send hints omnix has no use for: ``duration_ms``,
``audio_end_ms``, ``is_speech``, ``video_frames``...), a named one of the
wrong type is an ``error`` naming it.  Does not own what the events do
(``session.py``) nor the session object (``config.py``).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

#: OpenAI's ``error.type`` of each code that is not an ``invalid_request_error``.
ERROR_TYPES: Final[dict[str, str]] = {
    "resource_exhausted": "rate_limit_error",
    "input_backpressure": "rate_limit_error",
    "output_backpressure": "rate_limit_error",
    "session_failed": "server_error",
    "server_unavailable": "server_error",
}


class DuplexError(Exception):
    """A client event the session does not do, and why: answered with one
    ``error`` event (``code``, ``message``, the field ``param``), the
    session going on as it was."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param

    @property
    def type(self) -> str:
        return ERROR_TYPES.get(self.code, "invalid_request_error")


class _Event(msgspec.Struct, kw_only=True):
    event_id: str | None = None


class SessionUpdateEvent(_Event, kw_only=True):
    """The first opens the session (``config.py`` reads the object)."""

    session: dict[str, Any] | None = None


class HeartbeatEvent(_Event, kw_only=True):
    pass


class EventAckEvent(_Event, kw_only=True):
    server_event_seq: int = 0


class CloseEvent(_Event, kw_only=True):
    reason: str | None = None


class ResumeEvent(_Event, kw_only=True):
    session_id: str = ""
    resume_token: str | None = None
    incarnation: int | None = None
    last_received_server_event_seq: int | None = None


class AppendEvent(_Event, kw_only=True):
    """User audio (base64) in the session's input format, or this event's
    (``format`` / ``input_audio_format``) at ``sample_rate_hz``."""

    audio: str
    format: str | None = None
    input_audio_format: str | None = None
    sample_rate_hz: int | None = None


class CommitEvent(_Event, kw_only=True):
    final: bool | None = None
    response_create: bool | None = None


class ClearEvent(_Event, kw_only=True):
    pass


class InputCancelEvent(_Event, kw_only=True):
    pass


class TextAppendEvent(_Event, kw_only=True):
    text: str = ""


class BargeInEvent(_Event, kw_only=True):
    pass


class TurnSignalEvent(_Event, kw_only=True):
    event: str = ""
    payload: dict[str, Any] | None = None


class PlaybackAckEvent(_Event, kw_only=True):
    played_ms: float
    committed_ms: float | None = None
    response_id: str | None = None
    item_id: str | None = None
    truncate: bool = False


class ResponseCreateEvent(_Event, kw_only=True):
    response: dict[str, Any] | None = None


class ResponseCancelEvent(_Event, kw_only=True):
    response_id: str | None = None


class NotInDuplexEvent(_Event, kw_only=True):
    """An event of the vocabulary a full-duplex session has no use for
    (conversation items, a WebRTC output buffer): refused by name."""

    type: str = ""


ClientEvent = (
    SessionUpdateEvent
    | HeartbeatEvent
    | EventAckEvent
    | CloseEvent
    | ResumeEvent
    | AppendEvent
    | CommitEvent
    | ClearEvent
    | InputCancelEvent
    | TextAppendEvent
    | BargeInEvent
    | TurnSignalEvent
    | PlaybackAckEvent
    | ResponseCreateEvent
    | ResponseCancelEvent
    | NotInDuplexEvent
)

CLIENT_EVENTS: Final[dict[str, type[ClientEvent]]] = {
    "session.update": SessionUpdateEvent,
    "session.heartbeat": HeartbeatEvent,
    "session.event_ack": EventAckEvent,
    "session.close": CloseEvent,
    "close": CloseEvent,
    "close_session": CloseEvent,
    "session.resume": ResumeEvent,
    "input_audio_buffer.append": AppendEvent,
    "input_audio_buffer.commit": CommitEvent,
    "input.commit": CommitEvent,
    "input_audio_buffer.clear": ClearEvent,
    "input.cancel": InputCancelEvent,
    "input.text.append": TextAppendEvent,
    "input_text.append": TextAppendEvent,
    "push_text": TextAppendEvent,
    "barge_in": BargeInEvent,
    "turn.signal": TurnSignalEvent,
    "signal_turn": TurnSignalEvent,
    "playback.ack": PlaybackAckEvent,
    "audio.playback_ack": PlaybackAckEvent,
    "response.create": ResponseCreateEvent,
    "response.cancel": ResponseCancelEvent,
    "output_audio_buffer.clear": NotInDuplexEvent,
    "conversation.item.create": NotInDuplexEvent,
    "conversation.item.retrieve": NotInDuplexEvent,
    "conversation.item.delete": NotInDuplexEvent,
    "conversation.item.truncate": NotInDuplexEvent,
}


class BadEvent(Exception):
    """A message that is no client event: its error, and the client's
    ``event_id`` when one could be read."""

    def __init__(self, error: DuplexError, event_id: str | None) -> None:
        super().__init__(error.message)
        self.error = error
        self.event_id = event_id


def parse(text: str, max_bytes: int) -> ClientEvent:
    """The client event of one text message (``BadEvent`` otherwise)."""
    if len(text) > max_bytes:
        raise BadEvent(
            DuplexError(
                "event_too_large",
                f"the event is {len(text)} bytes; this server takes at most {max_bytes} per "
                "event. Send audio in smaller appends (80 ms frames).",
            ),
            None,
        )
    try:
        obj: Any = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise BadEvent(
            DuplexError("invalid_json", f"the message is not JSON ({exc})."), None
        ) from None
    if not isinstance(obj, dict):
        raise BadEvent(DuplexError("bad_event", "a client event is a JSON object."), None)
    event_id = obj.get("event_id") if isinstance(obj.get("event_id"), str) else None
    kind = obj.get("type")
    cls = CLIENT_EVENTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise BadEvent(
            DuplexError(
                "unknown_event",
                f"unknown duplex event type {kind!r}; send one of {', '.join(CLIENT_EVENTS)}.",
                "type",
            ),
            event_id,
        )
    try:
        return msgspec.convert(obj, cls)
    except msgspec.ValidationError as exc:
        _, at, path = str(exc).rpartition(" - at `$.")
        param = path.rstrip("`") if at else None
        raise BadEvent(DuplexError("bad_event", f"{kind}: {exc}.", param), event_id) from None


_enc = msgspec.json.Encoder()


def server_event(type_: str, event_id: str, seq: int | None = None, **fields: Any) -> bytes:
    """One server event as a WebSocket text message's JSON; ``seq``: its
    ``server_event_seq`` (the events a resumed client may have again)."""
    head: dict[str, Any] = {"type": type_, "event_id": event_id}
    if seq is not None:
        head["server_event_seq"] = seq
    return _enc.encode({**head, **fields})


def error_event(
    event_id: str, err: DuplexError, client_event_id: str | None, **extra: Any
) -> bytes:
    """OpenAI's ``error`` event (vLLM-Omni's codes); ``client_event_id``:
    the client event it answers."""
    error: dict[str, Any] = {"type": err.type, "code": err.code, "message": err.message}
    if err.param:
        error["param"] = err.param
    if client_event_id:
        error["event_id"] = client_event_id
    return server_event("error", event_id, error={**error, **extra})
