"""Tool calls with audio out, on ``tiny-omni``'s real engines (the thinker
with vLLM's ``hermes`` parser): only the answer is spoken.  The talker is
fed no chunk of a tool call (the log's ``Routed`` sources say what it got),
and the transcript is the answer's text, never the call's JSON."""

from __future__ import annotations

import json

import openai

from omnix.events.types import Chunk, Routed

from .conftest import real_engine_marks
from .tool_calls import CHAT_WEATHER

PIPELINE = "tiny-omni"
SERVER = "tiny-omni+tools"  # its thinker parses hermes tool calls
pytestmark = real_engine_marks()


async def test_a_tool_call_is_not_spoken(server):
    client = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120
    )
    try:
        resp = await client.chat.completions.create(
            model=PIPELINE,
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
            tools=[CHAT_WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            modalities=["text", "audio"],
            audio={"voice": "default", "format": "wav"},
            max_tokens=40,
        )
    finally:
        await client.close()
    msg = resp.choices[0].message
    (call,) = msg.tool_calls
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
    assert msg.content is None and msg.audio is not None and msg.audio.transcript == ""
    events = server.omni.log.events_for(resp.id.removeprefix("chatcmpl-"))
    by_pos = {e.pos: e for e in events}
    fed = [
        by_pos[p]
        for e in events
        if isinstance(e, Routed) and e.stage == "talker"
        for p in e.sources
    ]
    calls = [e for e in events if isinstance(e, Chunk) and e.tool_calls]
    assert calls  # the thinker did write the call
    assert not any(isinstance(e, Chunk) and (e.tool_calls or e.modality == "text") for e in fed)
