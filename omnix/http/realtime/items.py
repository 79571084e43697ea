"""Conversation items: from a client's event, to and from the log, back to the client.

Owns ``entry_from`` (a client's item, checked, its audio decoded for the
model: a conversation ``Entry``; a function call's output must name a call
the conversation holds), ``as_event`` / ``from_event``
(an entry as the ``SessionItem`` and media a ``SessionChanged`` records,
and back), and ``retrieved`` (an item as ``conversation.item.retrieve``
shows it, with the audio the client sent while the session holds it).

Does not own the conversation's order (``conversation.py``) nor decoding
audio (``audio_in.py``, ``omnix.http.media``).
"""

from __future__ import annotations

import base64

from omnix.events.sessions import ItemPart, SessionItem
from omnix.events.types import MediaPart
from omnix.http.core.errors import ApiError
from omnix.http.media.decoder import MediaDecoder
from omnix.http.realtime.audio_in import audio_entry, decode_b64_audio
from omnix.http.realtime.conversation import Entry
from omnix.http.realtime.protocol import (
    AnyItem,
    Content,
    FunctionCallItem,
    FunctionCallOutputItem,
    Item,
    ItemIn,
)
from omnix.http.realtime.respond import new_id


def bad(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


async def entry_from(
    decoder: MediaDecoder, given: ItemIn, param: str, calls: set[str] | None = None
) -> Entry:
    """A client's item as a conversation entry (audio decoded); ``calls``:
    the call ids a ``function_call_output`` may answer."""
    if given.type == "function_call" or given.type == "function_call_output":
        return _call_entry(given, param, calls or set())
    if given.type != "message":
        raise bad(
            f"{param}.type",
            f"{param}.type: an {given.type!r} names an item of the conversation: "
            "give it in a response's input.",
            "unsupported_value",
        )
    _no_call_fields(given, param)
    if given.role is None or given.content is None:
        raise bad(param, f"{param}: a message item needs a role and content.")
    item = Item(id=given.id or new_id("item"), role=given.role)
    texts: list[str] = []
    audio: bytes | None = None
    at = 0
    for i, c in enumerate(given.content):
        where = f"{param}.content[{i}]"
        if c.type in ("input_audio", "audio"):
            if given.role != "user" or audio is not None or not c.audio:
                raise bad(
                    where, f"{where}: one input_audio part (base64 pcm16 at 24 kHz) per user item."
                )
            audio = decode_b64_audio(c.audio, f"{where}.audio")
            at = len("\n".join(texts))
            item.content.append(Content(type="input_audio", transcript=c.transcript))
            continue
        text = c.text if c.text is not None else c.transcript
        if text is None:
            raise bad(where, f"{where}: a {c.type} part needs its text.")
        texts.append(text)
        item.content.append(Content(type=c.type, text=c.text, transcript=c.transcript))
    if audio is None:
        return Entry(item=item)
    return await audio_entry(decoder, item, audio, at)


def _no_call_fields(given: ItemIn, param: str) -> None:
    for name in ("call_id", "name", "arguments", "output"):
        if getattr(given, name) is not None:
            raise bad(
                f"{param}.{name}",
                f"{param}.{name}: a {given.type} item has no {name}; it belongs to "
                "function_call items (call_id, name, arguments) and their outputs "
                "(call_id, output).",
                "unknown_field",
            )


def _call_entry(given: ItemIn, param: str, calls: set[str]) -> Entry:
    """A client's ``function_call`` (a call the assistant made, given as
    history) or ``function_call_output`` (a call's result)."""
    if given.role is not None or given.content is not None:
        field = "role" if given.role is not None else "content"
        raise bad(
            f"{param}.{field}",
            f"{param}.{field}: a {given.type} item has no {field}.",
            "unknown_field",
        )
    item_id = given.id or new_id("item")
    if given.type == "function_call":
        if given.output is not None:
            raise bad(f"{param}.output", f"{param}.output: a function_call has no output.")
        if not given.name or given.arguments is None:
            raise bad(param, f"{param}: a function_call item needs its name and arguments.")
        call = FunctionCallItem(
            id=item_id,
            call_id=given.call_id or new_id("call"),
            name=given.name,
            arguments=given.arguments,
        )
        return Entry(item=call)
    if given.name is not None or given.arguments is not None:
        field = "name" if given.name is not None else "arguments"
        raise bad(
            f"{param}.{field}",
            f"{param}.{field}: a function_call_output has no {field} (its call_id names the call).",
        )
    if given.call_id is None or given.output is None:
        raise bad(param, f"{param}: a function_call_output item needs its call_id and output.")
    if given.call_id not in calls:
        raise bad(
            f"{param}.call_id",
            f"{param}.call_id: no function call {given.call_id!r} in this conversation; give "
            "the call_id of a function_call item the model made (response.output_item.done).",
            "call_not_found",
        )
    return Entry(
        item=FunctionCallOutputItem(id=item_id, call_id=given.call_id, output=given.output)
    )


def as_event(entry: Entry) -> tuple[SessionItem, tuple[MediaPart, ...]]:
    """The entry as a ``SessionChanged`` records it."""
    item = entry.item
    if isinstance(item, FunctionCallItem):
        call = SessionItem(
            id=item.id,
            role="",
            type=item.type,
            call_id=item.call_id,
            name=item.name,
            arguments=item.arguments,
        )
        return call, ()
    if isinstance(item, FunctionCallOutputItem):
        out = SessionItem(
            id=item.id, role="", type=item.type, call_id=item.call_id, output=item.output
        )
        return out, ()
    parts = tuple(ItemPart(type=c.type, text=c.text, transcript=c.transcript) for c in item.content)
    return SessionItem(id=item.id, role=item.role, parts=parts), entry.media


def from_event(item: SessionItem, media: tuple[MediaPart, ...]) -> Entry:
    """An entry as the log recorded it (its input audio as sent is not
    kept: a retrieve after a restart shows none)."""
    if item.type == "function_call":
        call = FunctionCallItem(
            id=item.id, call_id=item.call_id, name=item.name, arguments=item.arguments
        )
        return Entry(item=call)
    if item.type == "function_call_output":
        return Entry(
            item=FunctionCallOutputItem(id=item.id, call_id=item.call_id, output=item.output)
        )
    content = [Content(type=p.type, text=p.text, transcript=p.transcript) for p in item.parts]
    return Entry(item=Item(id=item.id, role=item.role, content=content), media=media)


def retrieved(entry: Entry) -> AnyItem:
    """An item as ``retrieve`` shows it: with its input audio (base64)."""
    if not entry.pcm or not isinstance(entry.item, Item):
        return entry.item
    audio = base64.b64encode(entry.pcm).decode()
    content = [
        Content(type=c.type, audio=audio, transcript=c.transcript) if c.type == "input_audio" else c
        for c in entry.item.content
    ]
    return Item(id=entry.id, status=entry.item.status, role=entry.item.role, content=content)
