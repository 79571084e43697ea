"""Server-sent events as a client reads them: one reader for tests and benchmarks.

Owns: cutting an SSE byte stream into events (``SseEvent``: its ``data``,
multi-line data joined by newlines, and its ``id`` and ``event`` fields;
comments skipped; LF or CRLF line ends), fed a piece at a time
(``SseReader``), read off an aiohttp response (``sse_events``) or taken
from a body read so far (``parse_sse``); and the text a streamed chat
completion chunk carries in its deltas (``chat_delta_text``).

It reads pieces, not lines: aiohttp's line reader refuses lines over 128
KiB, and one event of base64 audio can be larger.  It imports nothing of
omnix: the benchmarks (floor 11) and the tests read omnix's streams, and
any other OpenAI-compatible server's, with it.  Does not own what an
event's data means beyond a chat chunk's text (each caller decodes its
own JSON), nor the server's side (``omnix.http``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec

#: The data of the event that ends an OpenAI stream.
DONE = "[DONE]"


class SseEvent(msgspec.Struct, frozen=True):
    """One event: its data (lines joined by newlines), id and event name
    ("" where the event had none)."""

    data: str
    id: str = ""
    event: str = ""

    @property
    def done(self) -> bool:
        """The stream's closing ``data: [DONE]``."""
        return self.data.strip() == DONE


class SseReader:
    """Cuts a byte stream into events as it arrives: ``feed`` each piece,
    ``end`` once the stream closed.  An event without a data line is not
    dispatched (as a browser's ``EventSource``), but its ``id`` still
    becomes ``last_id``."""

    def __init__(self) -> None:
        self.last_id = ""
        self._line = bytearray()
        self._data: list[str] = []
        self._id = ""
        self._event = ""

    def feed(self, piece: bytes) -> list[SseEvent]:
        out: list[SseEvent] = []
        start = 0
        while (end := piece.find(b"\n", start)) >= 0:
            self._line += piece[start:end]
            start = end + 1
            self._take(self._line.decode("utf-8", "replace").rstrip("\r"), out)
            self._line.clear()
        self._line += piece[start:]
        return out

    def end(self) -> list[SseEvent]:
        """The event the stream's last bytes held without a closing blank line."""
        out: list[SseEvent] = []
        if self._line:
            self._take(self._line.decode("utf-8", "replace").rstrip("\r"), out)
            self._line.clear()
        self._take("", out)
        return out

    def _take(self, line: str, out: list[SseEvent]) -> None:
        if not line:
            if self._data:
                out.append(SseEvent("\n".join(self._data), self._id, self._event))
            self._data, self._id, self._event = [], "", ""
            return
        if line.startswith(":"):
            return  # a comment (a keep-alive)
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            self._data.append(value)
        elif field == "id":
            self._id = self.last_id = value
        elif field == "event":
            self._event = value


async def sse_events(content: Any) -> AsyncIterator[SseEvent]:
    """The events of an aiohttp response body (``response.content``), as
    they arrive; the last one even without its closing blank line."""
    reader = SseReader()
    async for piece in content.iter_any():
        for event in reader.feed(piece):
            yield event
    for event in reader.end():
        yield event


def parse_sse(body: bytes) -> list[SseEvent]:
    """The complete events of a body; of a body read only in part, the
    unfinished last event is left out."""
    return SseReader().feed(body)


def chat_delta_text(data: str) -> str:
    """The text of a ``chat.completion.chunk``'s deltas (every choice's
    ``delta.content``); "" for ``[DONE]`` or data that is not a chunk."""
    if not data.startswith("{"):
        return ""
    choices = json.loads(data).get("choices") or []
    return "".join((c.get("delta") or {}).get("content") or "" for c in choices)
