"""LiveKit Agents, unchanged, on ``tiny-omni``'s real engines (the thinker
with vLLM's ``hermes`` parser): an ``AgentSession`` with no room, its LLM
``livekit-plugins-openai``'s ``RealtimeModel`` on ``/v1/realtime``, driven
by ``session.run(user_input=...)``.  The model calls the agent's
``@function_tool``, LiveKit runs it and sends the output back, and the
agent's answer comes as audio.  A named function makes random weights call
(structured output); the log shows what the thinker was given."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import aiohttp

from .conftest import real_engine_marks
from .tool_calls import WEATHER_FUNCTION, admitted

PIPELINE = "tiny-omni"
SERVER = "tiny-omni+tools"  # its thinker parses hermes tool calls
pytestmark = real_engine_marks()

ASK = "What is the weather in Paris?"


async def test_a_livekit_agent_session_calls_its_tool_and_answers_in_audio(server):
    from livekit.agents import Agent, AgentSession, function_tool
    from livekit.agents.voice.run_result import (
        ChatMessageEvent,
        FunctionCallEvent,
        FunctionCallOutputEvent,
    )
    from livekit.plugins.openai import realtime

    calls: list[str] = []
    received: list[dict[str, Any]] = []  # the server's events, as LiveKit got them

    # Bounded arguments and no others: a random-weight model must still
    # close its JSON (LiveKit's schema of a typed function_tool allows other
    # keys, which structured output then lets the model write on and on).
    @function_tool(raw_schema=WEATHER_FUNCTION)
    async def get_weather(raw_arguments: dict[str, Any]) -> str:
        city = raw_arguments["city"]
        calls.append(city)
        return json.dumps({"city": city, "sky": "clear"})

    class Model(realtime.RealtimeModel):
        def session(self, *, turn_detection_disabled: bool = False) -> realtime.RealtimeSession:
            s = super().session(turn_detection_disabled=turn_detection_disabled)
            s.on("openai_server_event_received", received.append)
            return s

    async with aiohttp.ClientSession() as http:
        # LiveKit's defaults are OpenAI's names (voice "marin", transcription
        # by "gpt-4o-mini-transcribe", semantic VAD), which omnix refuses
        # naming the field: a client of omnix sets the served ones.  No turn
        # detection: the user speaks by text here.
        model = Model(
            model=PIPELINE,
            voice="default",
            base_url=server.url + "/v1",
            api_key="unused",
            http_session=http,
            input_audio_transcription=None,
            turn_detection=None,
            # A named function: one call (structured output holds the arguments).
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
        model.update_options(max_response_output_tokens=40)
        # LiveKit answers the tool's output with tool_choice "auto" (this
        # server's thinker parses calls by itself), not the named one, which
        # would call again; random weights write no hermes call unasked.
        session: AgentSession[None] = AgentSession(llm=model, max_tool_steps=1)
        await session.start(
            Agent(instructions="Say the weather.", tools=[get_weather]), record=False
        )
        try:
            async with asyncio.timeout(240):
                result = await session.run(user_input=ASK)
        finally:
            await session.aclose()

    for ev in received:
        assert ev["type"] != "error", ev
    # What the run saw: the call, its output, the spoken answer.
    assert [type(ev) for ev in result.events] == [
        FunctionCallEvent,
        FunctionCallOutputEvent,
        ChatMessageEvent,
    ]
    call_ev, out_ev, answer_ev = result.events
    assert isinstance(call_ev, FunctionCallEvent) and isinstance(out_ev, FunctionCallOutputEvent)
    assert isinstance(answer_ev, ChatMessageEvent) and answer_ev.item.role == "assistant"
    call, out = call_ev.item, out_ev.item
    assert call.name == out.name == "get_weather" and out.call_id == call.call_id
    # The tool ran once, on the arguments the model wrote.
    assert json.loads(call.arguments) == {"city": calls[0]} and len(calls) == 1
    assert out.output == json.dumps({"city": calls[0], "sky": "clear"}) and not out.is_error

    # Two responses: the call alone, then the answer, spoken (pcm16).
    done = [ev["response"] for ev in received if ev["type"] == "response.done"]
    first, answer = done
    audio = b"".join(
        base64.b64decode(ev["delta"])
        for ev in received
        if ev["type"] == "response.output_audio.delta" and ev["response_id"] == answer["id"]
    )
    assert len(audio) > 0 and len(audio) % 2 == 0
    assert [o["type"] for o in first["output"]] == ["function_call"]

    # The answer read the call and the tool's output as chat's history gives them.
    assert admitted(server, first["id"]).spec.messages[-1].role == "user"
    sent = admitted(server, answer["id"]).spec.messages
    assert [m.role for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[0].content == "Say the weather." and sent[1].content == ASK
    (tc,) = sent[2].tool_calls
    # (LiveKit keeps the arguments as it re-serialises them: json.dumps.)
    assert (tc.id, tc.name) == (call.call_id, "get_weather")
    assert json.loads(tc.arguments) == json.loads(call.arguments)
    assert sent[3].tool_call_id == tc.id and sent[3].content == out.output
