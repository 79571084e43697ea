"""A realtime session's conversation: its items, in order, and what the model reads of them.

Owns ``Conversation``: the items a session holds (a user's committed audio
or created message, a system message, each response's assistant items:
its message and its function calls; a function call's output),
inserted after a given item or at the end, deleted, found by id; each
with what the model reads of it (``Entry.message``: a ``ChatMessage``
with its audio as a decoded ``MediaPart``) and the blob that audio needs
stored; and ``messages``, the context a response is given (the session's
instructions first; a function call is read as an assistant message's
``tool_calls``, its output as a ``tool`` message, as chat's history gives
them).  A truncated assistant item keeps no transcript: the model must not
read what the user did not hear (as OpenAI does); an unfinished call
(its response cancelled mid-arguments) is not read either.

Does not own decoding audio (``omnix.http.media``), the client events
(``session.py``) nor the log.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

import msgspec

from omnix.events.types import ChatMessage, MediaPart, ToolCall
from omnix.http.common.plan import DecodedBlob
from omnix.http.core.errors import ApiError
from omnix.http.realtime.protocol import (
    AnyItem,
    Content,
    FunctionCallItem,
    FunctionCallOutputItem,
    Item,
)

#: The most items one conversation holds; more is refused.
MAX_ITEMS: Final = 4096


@dataclass(slots=True)
class Entry:
    """One conversation item: as shown to the client, and as the model reads it."""

    item: AnyItem
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
        if not isinstance(self.item, Item):
            return
        for c in self.item.content:
            if c.type == "input_audio":
                c.transcript = text
                return

    def message(self) -> ChatMessage | None:
        """What the model reads of the item (None: nothing)."""
        item = self.item
        if isinstance(item, FunctionCallItem):
            if item.status != "completed":
                return None
            call = ToolCall(id=item.call_id, name=item.name, arguments=item.arguments)
            return ChatMessage(role="assistant", content="", tool_calls=(call,))
        if isinstance(item, FunctionCallOutputItem):
            return ChatMessage(role="tool", content=item.output, tool_call_id=item.call_id)
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

    def replace(self, item_id: str, entries: list[Entry]) -> None:
        """The item ``item_id`` (a response's, as admitted) replaced by
        ``entries`` (the items the response made), where it stood; nothing
        when the client deleted it meanwhile."""
        for i, e in enumerate(self.entries):
            if e.id == item_id:
                self.entries[i : i + 1] = [x for x in entries if x is e or not self.has(x.id)]
                return

    def call_ids(self) -> set[str]:
        """The call ids of the function calls the conversation holds."""
        return {e.item.call_id for e in self.entries if isinstance(e.item, FunctionCallItem)}

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
        msgs = _calls_joined(e.message() for e in (self.entries if entries is None else entries))
        if max_audio is not None:
            left = max_audio
            for i in range(len(msgs) - 1, -1, -1):
                n = len(msgs[i].media)
                if n > left:
                    msgs[i] = msgspec.structs.replace(msgs[i], media=())
                left = max(0, left - n)
        out = [ChatMessage(role="system", content=instructions)] if instructions else []
        out += [m for m in msgs if m.content or m.media or m.tool_calls or m.role == "tool"]
        return tuple(out)


def _calls_joined(msgs: Iterable[ChatMessage | None]) -> list[ChatMessage]:
    """Each function call joined to the assistant message before it, as
    chat's history holds a turn's calls: one assistant message, its text
    (if any) and its calls."""
    out: list[ChatMessage] = []
    for m in msgs:
        if m is None:
            continue
        prev = out[-1] if out else None
        if m.tool_calls and not m.content and prev is not None and prev.role == "assistant":
            out[-1] = msgspec.structs.replace(prev, tool_calls=prev.tool_calls + m.tool_calls)
            continue
        out.append(m)
    return out


def text_item(item_id: str, role: str, text: str) -> Item:
    kind = "output_text" if role == "assistant" else "input_text"
    return Item(id=item_id, role=role, content=[Content(type=kind, text=text)])
