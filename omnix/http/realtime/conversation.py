"""A realtime session's conversation: its items, in order, and what the model reads of them.

Owns ``Conversation``: the items a session holds (a user's committed audio
or created message, a system message, each response's assistant item),
inserted after a given item or at the end, deleted, found by id; each
with what the model reads of it (``Entry.message``: a ``ChatMessage``
with its audio as a decoded ``MediaPart``) and the blob that audio needs
stored; and ``messages``, the context a response is given (the session's
instructions first).  A truncated assistant item keeps no transcript:
the model must not read what the user did not hear (as OpenAI does).

Does not own decoding audio (``omnix.http.media``), the client events
(``session.py``) nor the log.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from omnix.events.types import ChatMessage, MediaPart
from omnix.http.common.plan import DecodedBlob
from omnix.http.core.errors import ApiError
from omnix.http.realtime.protocol import Content, Item

#: The most items one conversation holds; more is refused.
MAX_ITEMS: Final = 4096


@dataclass(slots=True)
class Entry:
    """One conversation item: as shown to the client, and as the model reads it."""

    item: Item
    media: tuple[MediaPart, ...] = ()
    blobs: tuple[DecodedBlob, ...] = ()
    #: the item's input audio as the client sent it (pcm16, 24 kHz), for
    #: ``conversation.item.retrieve``
    pcm: bytes = b""
    #: an assistant item's audio, in milliseconds (``truncate`` bounds)
    audio_ms: int = 0
    truncated: bool = False

    @property
    def id(self) -> str:
        return self.item.id

    def transcribed(self, text: str) -> None:
        """The transcript of the item's input audio (input transcription);
        the model still reads the audio, not this."""
        for c in self.item.content:
            if c.type == "input_audio":
                c.transcript = text
                return

    def message(self) -> ChatMessage:
        item = self.item
        texts = []
        for c in item.content:
            if c.type in ("input_text", "text", "output_text"):
                texts.append(c.text or "")
            elif c.type in ("output_audio", "audio") and not self.truncated:
                texts.append(c.transcript or "")
        # Audio stands after the text the client put before it (offset 0:
        # a committed buffer is audio alone).
        return ChatMessage(
            role=item.role, content="\n".join(t for t in texts if t), media=self.media
        )


@dataclass(slots=True)
class Conversation:
    """The items of one session's conversation, in order."""

    id: str
    entries: list[Entry] = field(default_factory=list)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def last_id(self) -> str:
        return self.entries[-1].id if self.entries else ""

    def find(self, item_id: str, param: str = "item_id") -> Entry:
        for e in self.entries:
            if e.id == item_id:
                return e
        raise ApiError(
            400,
            f"{param}: no item {item_id!r} in this session's conversation.",
            param=param,
            code="item_not_found",
        )

    def has(self, item_id: str) -> bool:
        return any(e.id == item_id for e in self.entries)

    def insert(self, entry: Entry, previous: str | None = None) -> str:
        """Put ``entry`` after the item ``previous`` (None: at the end;
        ``"root"``: first); returns the id of the item before it ("" none)."""
        if len(self.entries) >= MAX_ITEMS:
            raise ApiError(
                400,
                f"this session's conversation holds {MAX_ITEMS} items, the most it may; "
                "delete some (conversation.item.delete) or start a new session.",
                code="conversation_full",
            )
        if self.has(entry.id):
            raise ApiError(
                400,
                f"item.id: an item {entry.id!r} is already in the conversation; "
                "give a new id, or none.",
                param="item.id",
                code="duplicate_item_id",
            )
        if previous is None:
            before = self.last_id
            self.entries.append(entry)
        elif previous == "root":
            before = ""
            self.entries.insert(0, entry)
        else:
            at = self.entries.index(self.find(previous, "previous_item_id"))
            before = previous
            self.entries.insert(at + 1, entry)
        return before

    def delete(self, item_id: str) -> None:
        self.entries.remove(self.find(item_id))

    def messages(
        self, instructions: str, entries: list[Entry] | None = None, max_audio: int | None = None
    ) -> tuple[ChatMessage, ...]:
        """What a response reads: the instructions as a system message,
        then each item (``entries``: a response's own ``input`` instead of
        the conversation).  ``max_audio``: the audio clips one prompt may
        hold (the pipeline's ``max_audio_parts``): the newest items keep
        theirs, older ones are read without it (a model such as tiny-omni's
        thinker takes one clip a prompt; the items stay in the conversation)."""
        msgs = [e.message() for e in (self.entries if entries is None else entries)]
        if max_audio is not None:
            left = max_audio
            for i in range(len(msgs) - 1, -1, -1):
                n = len(msgs[i].media)
                if n > left:
                    msgs[i] = ChatMessage(role=msgs[i].role, content=msgs[i].content)
                left = max(0, left - n)
        out = [ChatMessage(role="system", content=instructions)] if instructions else []
        out += [m for m in msgs if m.content or m.media]
        return tuple(out)


def text_item(item_id: str, role: str, text: str) -> Item:
    kind = "output_text" if role == "assistant" else "input_text"
    return Item(id=item_id, role=role, content=[Content(type=kind, text=text)])
