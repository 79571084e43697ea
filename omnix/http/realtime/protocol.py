"""The OpenAI Realtime API's messages (GA names), as omnix takes and sends them.

Owns: the client events a session takes (``CLIENT_EVENTS``: the type of
each ``type``), their parts (the session's configuration as
``session.update`` sets it, a response's overrides, conversation items),
the objects the server sends back (``SessionObject``, ``Item``,
``ResponseObject``, ``Usage``, ``ErrorEvent``) and the framing of a server
event (``server_event``; ``LogFrames``: the ids of those rendered from the
log).  Fields the API defines and omnix does not take are refused by the
session with an ``error`` event naming them.

Does not own what the events do (``session.py``) nor the events a
response renders from the log (``render.py``).
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

# Client events' Structs refuse unknown fields (one rule with the HTTP
# routes: ``unknown_field``).

Modality = Literal["text", "audio"]
Role = Literal["user", "assistant", "system"]

#: OpenAI's function names: letters, digits, ``_`` and ``-``, at most 64.
FunctionName = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


# -- function tools ------------------------------------------------------------


class FunctionTool(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """A function the model may call (``tools[]``): its name, what it is
    for, a JSON Schema of its arguments (checked as one: ``tools.py``).
    ``type`` other than ``function`` (an MCP server) is refused."""

    name: FunctionName
    type: str = "function"
    description: str | None = None
    parameters: dict[str, Any] | None = None


class FunctionChoice(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``tool_choice`` naming the function the response must call."""

    name: str
    type: str = "function"


#: ``tool_choice``: ``"auto"``, ``"none"``, ``"required"`` or a named function.
ToolChoice = str | FunctionChoice


# -- the session's configuration (session.update) ---------------------------


class AudioFormat(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``{"type": "audio/pcm", "rate": 24000}``: the only format omnix
    speaks (16-bit little-endian mono PCM at 24 kHz)."""

    type: str = "audio/pcm"
    rate: int | None = 24000


class TurnDetection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    type: str = "server_vad"
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: int | None = None
    eagerness: str | None = None


class Transcription(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``audio.input.transcription``: the model (a name the server serves;
    omitted, the first), the audio's ISO-639-1 language, a prompt.  The
    rest is refused."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    delay: str | None = None
    keywords: list[str] | None = None
    languages: list[str] | None = None


class AudioInput(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    format: AudioFormat | UnsetType = UNSET
    noise_reduction: dict[str, Any] | UnsetType | None = UNSET
    transcription: Transcription | UnsetType | None = UNSET
    turn_detection: TurnDetection | UnsetType | None = UNSET


class AudioOutput(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    format: AudioFormat | UnsetType = UNSET
    voice: str | UnsetType = UNSET
    speed: float | UnsetType = UNSET


class AudioConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    input: AudioInput | UnsetType = UNSET
    output: AudioOutput | UnsetType = UNSET


class SessionUpdate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What a ``session.update`` may set (UNSET: keep)."""

    type: str | UnsetType = UNSET
    model: str | UnsetType = UNSET
    instructions: str | UnsetType = UNSET
    output_modalities: list[Modality] | UnsetType = UNSET
    audio: AudioConfig | UnsetType = UNSET
    max_output_tokens: int | Literal["inf"] | UnsetType | None = UNSET
    tools: list[FunctionTool] | UnsetType | None = UNSET
    tool_choice: ToolChoice | UnsetType | None = UNSET
    parallel_tool_calls: bool | UnsetType | None = UNSET
    tracing: Any | UnsetType = UNSET
    truncation: Any | UnsetType = UNSET
    include: list[str] | UnsetType | None = UNSET
    prompt: Any | UnsetType = UNSET


# -- conversation items --------------------------------------------------------


class ContentIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    type: Literal["input_text", "input_audio", "text", "output_text", "output_audio", "audio"]
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None


class ItemIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """An item a client creates (``conversation.item.create``, a
    response's ``input``): a message, a function call the assistant made
    (``call_id``, ``name``, ``arguments``) or its output (``call_id``,
    ``output``); or a reference to one (``item_reference``)."""

    type: Literal["message", "item_reference", "function_call", "function_call_output"] = "message"
    id: str | None = None
    object: str | None = None
    status: str | None = None
    role: Role | None = None
    content: list[ContentIn] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


class Content(msgspec.Struct, omit_defaults=True):
    type: str
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None


class Item(msgspec.Struct, kw_only=True):
    """A conversation item as the server shows it."""

    id: str
    type: str = "message"
    object: str = "realtime.item"
    status: str = "completed"
    role: str = "user"
    content: list[Content] = []


class FunctionCallItem(msgspec.Struct, kw_only=True):
    """A function call the assistant made (``call_id``: what its output
    names), as the server shows it."""

    id: str
    type: str = "function_call"
    object: str = "realtime.item"
    status: str = "completed"
    call_id: str
    name: str
    arguments: str = ""


class FunctionCallOutputItem(msgspec.Struct, kw_only=True):
    """A function call's output, as the client gave it."""

    id: str
    type: str = "function_call_output"
    object: str = "realtime.item"
    status: str = "completed"
    call_id: str
    output: str


#: Any conversation item.
AnyItem = Item | FunctionCallItem | FunctionCallOutputItem


# -- responses -----------------------------------------------------------------


class ResponseAudioOut(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    format: AudioFormat | UnsetType = UNSET
    voice: str | UnsetType = UNSET


class ResponseAudio(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    output: ResponseAudioOut | UnsetType = UNSET


class ResponseParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A ``response.create``'s overrides of the session's configuration."""

    # null: the session's (LiveKit's realtime plugin sends it so).
    instructions: str | UnsetType | None = UNSET
    output_modalities: list[Modality] | UnsetType = UNSET
    max_output_tokens: int | Literal["inf"] | UnsetType = UNSET
    audio: ResponseAudio | UnsetType = UNSET
    conversation: str | UnsetType = UNSET
    input: list[ItemIn] | UnsetType = UNSET
    metadata: dict[str, str] | UnsetType | None = UNSET
    tools: list[FunctionTool] | UnsetType | None = UNSET
    tool_choice: ToolChoice | UnsetType | None = UNSET
    parallel_tool_calls: bool | UnsetType | None = UNSET
    prompt: Any | UnsetType = UNSET


# -- client events -----------------------------------------------------------------


class _Event(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    type: str
    event_id: str | None = None


class SessionUpdateEvent(_Event, forbid_unknown_fields=True, kw_only=True):
    session: SessionUpdate


class AppendEvent(_Event, forbid_unknown_fields=True, kw_only=True):
    audio: str


class CommitEvent(_Event, forbid_unknown_fields=True, kw_only=True):
    pass


class ClearEvent(_Event, forbid_unknown_fields=True, kw_only=True):
    pass


class ItemCreateEvent(_Event, forbid_unknown_fields=True, kw_only=True):
    item: ItemIn
    previous_item_id: str | None = None


class ItemDeleteEvent(_Event, forbid_unknown_fields=True, kw_only=True):
    item_id: str


class ItemRetrieveEvent(_Event, forbid_unknown_fields=True, kw_only=True):
    item_id: str


class ItemTruncateEvent(_Event, forbid_unknown_fields=True, kw_only=True):
    item_id: str
    content_index: int
    audio_end_ms: int


class ResponseCreateEvent(_Event, forbid_unknown_fields=True, kw_only=True):
    response: ResponseParams | None = None


class ResponseCancelEvent(_Event, forbid_unknown_fields=True, kw_only=True):
    response_id: str | None = None


ClientEvent = (
    SessionUpdateEvent
    | AppendEvent
    | CommitEvent
    | ClearEvent
    | ItemCreateEvent
    | ItemDeleteEvent
    | ItemRetrieveEvent
    | ItemTruncateEvent
    | ResponseCreateEvent
    | ResponseCancelEvent
)

#: The client events a session takes, by ``type``.
CLIENT_EVENTS: Final[dict[str, type[ClientEvent]]] = {
    "session.update": SessionUpdateEvent,
    "input_audio_buffer.append": AppendEvent,
    "input_audio_buffer.commit": CommitEvent,
    "input_audio_buffer.clear": ClearEvent,
    "conversation.item.create": ItemCreateEvent,
    "conversation.item.delete": ItemDeleteEvent,
    "conversation.item.retrieve": ItemRetrieveEvent,
    "conversation.item.truncate": ItemTruncateEvent,
    "response.create": ResponseCreateEvent,
    "response.cancel": ResponseCancelEvent,
}

#: Client events of the API that omnix does not take (a WebRTC or SIP
#: call's), and why.
NOT_TAKEN: Final[dict[str, str]] = {
    "output_audio_buffer.clear": "it is for WebRTC and SIP connections; this is a WebSocket",
    "session.close": "close the WebSocket instead",
}


# -- server objects ---------------------------------------------------------------


class AudioFormatOut(msgspec.Struct):
    type: str = "audio/pcm"
    rate: int = 24000


class TurnDetectionOut(msgspec.Struct, kw_only=True):
    type: str = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = None


class TranscriptionOut(msgspec.Struct, kw_only=True):
    model: str
    language: str | None = None
    prompt: str | None = None


class AudioInputOut(msgspec.Struct, kw_only=True):
    format: AudioFormatOut = msgspec.field(default_factory=AudioFormatOut)
    noise_reduction: None = None
    transcription: TranscriptionOut | None = None
    turn_detection: TurnDetectionOut | None = None


class AudioOutputOut(msgspec.Struct, kw_only=True):
    format: AudioFormatOut = msgspec.field(default_factory=AudioFormatOut)
    voice: str = "default"
    speed: float = 1.0


class AudioOut(msgspec.Struct, kw_only=True):
    input: AudioInputOut = msgspec.field(default_factory=AudioInputOut)
    output: AudioOutputOut = msgspec.field(default_factory=AudioOutputOut)


class SessionObject(msgspec.Struct, kw_only=True):
    """The session's configuration, as ``session.created`` and
    ``session.updated`` send it."""

    id: str
    object: str = "realtime.session"
    type: str = "realtime"
    model: str
    output_modalities: list[str]
    instructions: str = ""
    audio: AudioOut = msgspec.field(default_factory=AudioOut)
    max_output_tokens: int | str = "inf"
    tools: list[FunctionTool] = []
    tool_choice: ToolChoice = "auto"
    #: None: not set (the model's default: any number of calls)
    parallel_tool_calls: bool | None = None
    tracing: None = None
    truncation: str = "auto"
    include: None = None
    prompt: None = None
    expires_at: int = 0


class UsageDetails(msgspec.Struct, kw_only=True):
    text_tokens: int = 0
    audio_tokens: int = 0


class Usage(msgspec.Struct, kw_only=True):
    total_tokens: int
    input_tokens: int
    output_tokens: int
    input_token_details: UsageDetails
    output_token_details: UsageDetails


class ErrorDetail(msgspec.Struct, kw_only=True):
    type: str
    code: str | None
    message: str
    param: str | None = None
    event_id: str | None = None


class ResponseAudioConfig(msgspec.Struct, kw_only=True):
    output: AudioOutputOut


class ResponseObject(msgspec.Struct, kw_only=True):
    id: str
    object: str = "realtime.response"
    status: str = "in_progress"
    status_details: dict[str, Any] | None = None
    output: list[AnyItem] = []
    conversation_id: str | None = None
    output_modalities: list[str]
    max_output_tokens: int | str = "inf"
    audio: ResponseAudioConfig | None = None
    usage: Usage | None = None
    metadata: dict[str, str] | None = None


_enc = msgspec.json.Encoder()


def server_event(type_: str, event_id: str, **fields: Any) -> bytes:
    """One server event as the JSON text of a WebSocket message."""
    return _enc.encode({"type": type_, "event_id": event_id, **fields})


class LogFrames:
    """Server events rendered from log events, their ids derived from the
    log: ``event_<pos>`` for the first a log event makes, then
    ``event_<pos>_<k>``, so a replay renders the same messages.  ``at``
    each log event before its frames; ``ids``: the ids of the frames made
    since."""

    def __init__(self) -> None:
        self._pos = -1
        self._k = 0
        self.ids: list[str] = []

    def at(self, pos: int) -> None:
        self._pos, self._k = pos, 0
        self.ids = []

    def event(self, type_: str, **fields: Any) -> bytes:
        eid = f"event_{self._pos}" if self._k == 0 else f"event_{self._pos}_{self._k}"
        self._k += 1
        self.ids.append(eid)
        return server_event(type_, eid, **fields)


def error_event(
    event_id: str,
    message: str,
    *,
    code: str | None,
    type_: str = "invalid_request_error",
    param: str | None = None,
    client_event_id: str | None = None,
) -> bytes:
    """OpenAI's ``error`` event; ``client_event_id``: the client event that
    caused it."""
    detail = ErrorDetail(
        type=type_, code=code, message=message, param=param, event_id=client_event_id
    )
    return server_event("error", event_id, error=detail)
