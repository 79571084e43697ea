"""The one SSE reader the benchmarks and the tests read streams with."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from omnix.testing.sse import SseEvent, SseReader, chat_delta_text, parse_sse, sse_events


class _Pieces:
    """An aiohttp response body, cut into pieces of ``size`` bytes."""

    def __init__(self, data: bytes, size: int) -> None:
        self.pieces = [data[i : i + size] for i in range(0, len(data), size)]

    async def iter_any(self) -> AsyncIterator[bytes]:
        for p in self.pieces:
            yield p


@pytest.mark.asyncio
async def test_big_events_split_anywhere() -> None:
    big = "A" * 300_000  # one event of base64 audio larger than aiohttp's line limit
    body = (
        f'id: 1\r\ndata: {{"a": "{big}"}}\r\n\r\n: a comment\n\ndata: one\ndata: two\n\n'
        "event: x\ndata: [DONE]\n\n"
    ).encode()
    for size in (1, 7, 4096, len(body)):
        events = [e async for e in sse_events(_Pieces(body, size))]
        assert events == [
            SseEvent(f'{{"a": "{big}"}}', id="1"),
            SseEvent("one\ntwo"),
            SseEvent("[DONE]", event="x"),
        ], size
        assert events[-1].done and not events[0].done


@pytest.mark.asyncio
async def test_a_stream_cut_without_its_blank_line_still_gives_its_last_event() -> None:
    events = [e async for e in sse_events(_Pieces(b"data: a\n\ndata: b", 3))]
    assert [e.data for e in events] == ["a", "b"]


def test_a_body_read_in_part_gives_its_complete_events_and_last_id() -> None:
    reader = SseReader()
    events = reader.feed(b'id: 3.0\ndata: x\n\nid: 4.1\n\nid: 5.0\ndata: {"cho')
    assert events == [SseEvent("x", id="3.0")]
    assert reader.last_id == "5.0"  # an id counts once its line is read
    assert parse_sse(b"data: x\n\ndata: y") == [SseEvent("x")]


def test_chat_delta_text() -> None:
    assert chat_delta_text('{"choices": [{"delta": {"content": "hi"}}]}') == "hi"
    assert chat_delta_text('{"choices": [{"delta": {"role": "assistant"}}]}') == ""
    assert chat_delta_text('{"choices": [], "usage": {}}') == ""
    assert chat_delta_text("[DONE]") == ""
