"""Bad input never kills a realtime session: a raw ``websockets`` client
sends what the SDK would not (bad JSON, unknown events and fields, bad
audio, oversized events, a full buffer...) and gets OpenAI's ``error``
event (type, code, message, event_id) each time, the socket still open."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import websockets

from .conftest import b64, pcm16

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def ws(rt_server) -> AsyncIterator[Any]:
    url = rt_server.url.replace("http", "ws") + "/v1/realtime?model=rt-omni"
    async with websockets.connect(url, max_size=None) as sock:
        created = json.loads(await sock.recv())
        assert created["type"] == "session.created"
        await sock.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
                }
            )
        )
        assert json.loads(await sock.recv())["type"] == "session.updated"
        yield sock


async def error_of(ws: Any, message: str | bytes) -> dict[str, Any]:
    """Send ``message``; the error event it gets, after checking the
    session still answers."""
    await ws.send(message)
    ev = json.loads(await ws.recv())
    assert ev["type"] == "error", ev
    assert ev["event_id"] and ev["error"]["message"] and ev["error"]["type"]
    await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
    assert json.loads(await ws.recv())["type"] == "input_audio_buffer.cleared"
    return ev["error"]


def event(type_: str, **fields: Any) -> str:
    return json.dumps({"type": type_, "event_id": f"evt_{type_}", **fields})


@pytest.mark.parametrize(
    ("message", "code", "param"),
    [
        ("{not json", "invalid_json", None),
        ("[1, 2]", "invalid_event", None),
        (json.dumps({"type": "response.fly"}), "invalid_event_type", "type"),
        (json.dumps({"no": "type"}), "invalid_event_type", "type"),
        (event("output_audio_buffer.clear"), "unsupported_event", "type"),
        (event("input_audio_buffer.commit", extra=1), "unknown_field", "extra"),
        (event("conversation.item.delete", item_id=5), "invalid_value", "item_id"),
        (event("input_audio_buffer.append", audio="%%% not base64"), "invalid_audio", "audio"),
        (event("input_audio_buffer.append", audio=b64(b"abc")), "invalid_audio", "audio"),
        (event("input_audio_buffer.commit"), "input_audio_buffer_commit_empty", None),
        (event("response.cancel"), "response_cancel_not_active", None),
        (event("response.create"), "conversation_empty", None),
        (event("conversation.item.retrieve", item_id="item_nope"), "item_not_found", "item_id"),
        (
            event(
                "session.update",
                session={"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
            ),
            "unsupported_value",
            "session.audio.input.format",
        ),
        (
            event("session.update", session={"max_output_tokens": 0}),
            "invalid_value",
            "session.max_output_tokens",
        ),
        (
            event("session.update", session={"tools": [{"type": "function", "name": "f"}]}),
            "unsupported_value",
            "session.tools",
        ),
        (
            event("session.update", session={"output_modalities": ["text", "audio"]}),
            "invalid_value",
            "session.output_modalities",
        ),
        (
            event(
                "session.update",
                session={"tools": [{"type": "function", "name": "f", "parameters": {"type": 5}}]},
            ),
            "invalid_value",
            "session.tools[0].parameters",
        ),
        (
            event(
                "session.update",
                session={
                    "tools": [{"name": "f"}],
                    "tool_choice": {"type": "function", "name": "g"},
                },
            ),
            "invalid_value",
            "session.tool_choice",
        ),
        (
            event("response.create", response={"tool_choice": "required"}),
            "invalid_value",
            "response.tool_choice",
        ),
        (
            event("session.update", session={"tools": [{"type": "mcp", "name": "f"}]}),
            "unsupported_value",
            "session.tools[0].type",
        ),
        (
            event("response.create", response={"tools": [{"name": "f"}, {"name": "f"}]}),
            "invalid_value",
            "response.tools[1].name",
        ),
        (
            event("session.update", session={"parallel_tool_calls": "no"}),
            "invalid_value",
            "session.parallel_tool_calls",
        ),
        (
            event("response.create", response={"parallel_tool_calls": 0}),
            "invalid_value",
            "response.parallel_tool_calls",
        ),
        (
            event(
                "conversation.item.create",
                item={"type": "function_call_output", "call_id": "call_nope", "output": "{}"},
            ),
            "call_not_found",
            "item.call_id",
        ),
        (
            event(
                "conversation.item.create",
                item={"type": "function_call_output", "call_id": "c", "output": "", "name": "f"},
            ),
            "invalid_value",
            "item.name",
        ),
    ],
)
async def test_bad_events_are_answered_and_the_session_goes_on(ws, message, code, param):
    err = await error_of(ws, message)
    assert err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err
    sent = json.loads(message) if message.startswith('{"type') else None
    if sent is not None and "event_id" in sent:
        assert err["event_id"] == sent["event_id"]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "f"}])
async def test_a_session_choice_without_tools_waits_for_a_response(ws, choice):
    # LiveKit Agents sends tool_choice before the tools: the update passes...
    await ws.send(event("session.update", session={"tool_choice": choice}))
    updated = json.loads(await ws.recv())
    assert updated["type"] == "session.updated", updated
    assert updated["session"]["tool_choice"] == choice
    # ...and a response created with still no tools is refused, none starts
    # (error_of sees the next event answer the next request).
    err = await error_of(ws, event("response.create"))
    assert (err["code"], err["param"]) == ("invalid_value", "session.tool_choice"), err
    assert err["event_id"] == "evt_response.create"


async def test_binary_messages_are_refused(ws):
    err = await error_of(ws, b"\x00\x01")
    assert err["code"] == "invalid_event"


async def test_an_oversized_event_is_refused(ws):
    big = event("input_audio_buffer.append", audio="A" * (15 * 2**20 + 4))
    err = await error_of(ws, big)
    assert err["code"] == "event_too_large"


async def test_the_buffer_has_a_limit(ws):
    # The test pipeline takes 4 s a turn: 4.1 s does not fit.
    await ws.send(event("input_audio_buffer.append", audio=b64(pcm16(3.5))))
    err = await error_of(ws, event("input_audio_buffer.append", audio=b64(pcm16(0.6))))
    assert err["code"] == "input_audio_buffer_full"


async def test_a_socket_that_is_not_upgraded_is_told(rt_server, http):
    async with http.get(rt_server.url + "/v1/realtime") as resp:
        assert resp.status == 426 and resp.headers["Upgrade"] == "websocket"
        assert (await resp.json())["error"]["code"] == "websocket_required"
