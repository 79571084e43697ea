"""Conversation items: from a client's event, to and from the log, back to the client.

Owns ``entry_from`` (a client's message item, checked, its audio decoded
for the model: a conversation ``Entry``), ``as_event`` / ``from_event``
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
from omnix.http.realtime.protocol import Content, Item, ItemIn
from omnix.http.realtime.respond import new_id


def bad(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


async def entry_from(decoder: MediaDecoder, given: ItemIn, param: str) -> Entry:
    """A client's message item as a conversation entry (audio decoded)."""
    if given.type != "message":
        raise bad(
            f"{param}.type",
            f"{param}.type: omnix takes message items only, not {given.type!r} "
            "(no tools are called).",
            "unsupported_value",
        )
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


def as_event(entry: Entry) -> tuple[SessionItem, tuple[MediaPart, ...]]:
    """The entry as a ``SessionChanged`` records it."""
    item = entry.item
    parts = tuple(ItemPart(type=c.type, text=c.text, transcript=c.transcript) for c in item.content)
    return SessionItem(id=item.id, role=item.role, parts=parts), entry.media


def from_event(item: SessionItem, media: tuple[MediaPart, ...]) -> Entry:
    """An entry as the log recorded it (its input audio as sent is not
    kept: a retrieve after a restart shows none)."""
    content = [Content(type=p.type, text=p.text, transcript=p.transcript) for p in item.parts]
    return Entry(item=Item(id=item.id, role=item.role, content=content), media=media)


def retrieved(entry: Entry) -> Item:
    """An item as ``retrieve`` shows it: with its input audio (base64)."""
    if not entry.pcm:
        return entry.item
    audio = base64.b64encode(entry.pcm).decode()
    content = [
        Content(type=c.type, audio=audio, transcript=c.transcript) if c.type == "input_audio" else c
        for c in entry.item.content
    ]
    return Item(id=entry.id, status=entry.item.status, role=entry.item.role, content=content)
