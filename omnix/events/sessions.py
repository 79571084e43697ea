"""A realtime session's state as the log records it (schema v7).

Owns the values a ``SessionChanged`` event carries: ``SessionSettings``
(what ``session.update`` set: instructions, output modalities, voice,
output token limit, ``TurnSettings`` of server VAD, ``TranscriptionSettings``
of input transcription, the conversation's id; schema v12 its function
tools and tool choice, v13 its ``parallel_tool_calls``) and ``SessionItem`` (a conversation item a client
created or committed: its id, role and content parts, ``ItemPart``; its
audio is the event's ``media``, the decoded ``MediaPart`` the model reads;
schema v12 a client's ``function_call`` or ``function_call_output``).  An
assistant's items are no ``SessionItem``: its response's ``Admitted``
(``RealtimeOptions``) places them and its chunks are their content (text,
audio, function calls).

The rules of ``types.py`` hold here: these are part of the log, so a
Struct only grows by appending fields with defaults.  Does not own what a
session does (``omnix.http.realtime``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from omnix.events.options import OutputModalities

SessionOp = Literal["opened", "configured", "item_added", "item_deleted", "item_truncated"]
"""What changed: the session was opened (``settings``), its settings
changed (``settings``), an item was added (``item``, after ``previous``),
deleted or truncated (``item_id``, ``audio_end_ms``)."""


class TurnSettings(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Server VAD's parameters (``turn_detection: server_vad``)."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True


class TranscriptionSettings(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Input audio transcription (``audio.input.transcription``): the
    served model name it runs on, the audio's ISO-639-1 ``language`` and
    the ``prompt`` ("" none).  Each committed clip is then a request of its
    own (api ``audio.transcriptions``, ``RealtimeOptions`` naming the
    session and the item), whose text is the item's transcript."""

    model: str = ""
    language: str = ""
    prompt: str = ""


class SessionSettings(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A session's configuration; ``max_output_tokens`` 0 for ``"inf"``,
    ``turns`` None when the client commits turns itself, ``transcription``
    None when input audio is not transcribed."""

    model: str = ""
    conversation: str = ""
    instructions: str = ""
    modalities: OutputModalities = ("text",)
    voice: str = ""
    max_output_tokens: int = 0
    turns: TurnSettings | None = None
    transcription: TranscriptionSettings | None = None
    #: schema v12: the session's function tools as the Realtime API's JSON
    #: array (``[{"type": "function", "name": ...}]``; "" none) and its
    #: ``tool_choice`` as JSON ("" for ``"auto"``)
    tools: str = ""
    tool_choice: str = ""
    #: schema v13: the session's ``parallel_tool_calls`` (None: not set)
    parallel_tool_calls: bool | None = None


class ItemPart(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A content part of an item: ``type`` (``input_text``, ``input_audio``,
    ``text``, ``output_text``, ``output_audio``), its text or transcript."""

    type: str
    text: str | None = None
    transcript: str | None = None


class SessionItem(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A conversation item a client added (its audio, as the model reads
    it, is the event's ``media``)."""

    id: str
    role: str
    parts: tuple[ItemPart, ...] = ()
    #: schema v12: ``message``, or a client's ``function_call`` (``call_id``,
    #: ``name``, ``arguments``) or ``function_call_output`` (``call_id``,
    #: ``output``); those have no role ("") nor parts
    type: str = "message"
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    output: str = ""
