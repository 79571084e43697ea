"""Agent clients, unchanged, on ``tiny-omni``'s real engines (the thinker
with vLLM's ``hermes`` parser and ``--enable-auto-tool-choice``): the
``openai-agents`` SDK's ``RealtimeAgent`` over ``/v1/realtime`` (the model
calls its function tool, the SDK runs it and sends the output back, and
the agent's answer comes as audio), and the ``openai`` client's chat
tool-call loop (tool_calls, the tool's message, the final answer spoken).
A named function or ``required`` makes random weights call a tool
(structured output); the log shows what the thinker was given."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import openai

from .conftest import real_engine_marks
from .tool_calls import CHAT_WEATHER, admitted

PIPELINE = "tiny-omni"
SERVER = "tiny-omni+tools"  # its thinker parses hermes tool calls
pytestmark = real_engine_marks()

ASK = "What is the weather in Paris?"


async def test_an_openai_agents_realtime_agent_calls_its_tool_and_answers_in_audio(server):
    from agents import function_tool, set_tracing_disabled
    from agents.realtime import RealtimeAgent, RealtimeRunner, RealtimeSession
    from agents.realtime.config import RealtimeSessionModelSettings
    from agents.realtime.model_inputs import RealtimeModelSendSessionUpdate
    from openai.types.responses import ToolChoiceFunction

    set_tracing_disabled(True)  # its spans would be exported to api.openai.com
    calls: list[str] = []
    live: list[RealtimeSession] = []

    # Bounded arguments: a random-weight model must still close its JSON.
    @function_tool
    async def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """The weather in a city."""
        calls.append(city)
        # A Realtime session keeps its tool_choice for every response (the
        # SDK resets it only for non-realtime runs): still forced, the
        # answer after this output would be one more call, and so on.
        (session,) = live
        await session.model.send_event(
            RealtimeModelSendSessionUpdate(
                session_settings={**settings, "tool_choice": "none", "tools": agent.tools}
            )
        )
        return json.dumps({"city": city, "sky": "clear"})

    agent = RealtimeAgent(name="Forecaster", instructions="Say the weather.", tools=[get_weather])
    # The SDK's defaults are OpenAI's names (voice "ash", transcription by
    # "gpt-4o-mini-transcribe"), which omnix refuses naming the field: a
    # client of omnix sets the served ones.  No turn detection: the user
    # speaks by text here.
    settings: RealtimeSessionModelSettings = {
        "model_name": PIPELINE,
        "voice": "default",
        "input_audio_transcription": {"model": PIPELINE},
        "turn_detection": None,
        # A named function: one call (structured output holds the
        # arguments); "required" lets random weights add calls.
        "tool_choice": ToolChoiceFunction(type="function", name="get_weather"),  # type: ignore[typeddict-item]
        "max_output_tokens": 40,
    }
    runner = RealtimeRunner(starting_agent=agent, config={"tracing_disabled": True})
    session = await runner.run(
        model_config={
            "url": server.url.replace("http://", "ws://", 1) + f"/v1/realtime?model={PIPELINE}",
            "api_key": "unused",
            "initial_model_settings": settings,
        }
    )
    seen: list[str] = []
    tool_events: list[Any] = []
    responses: list[str] = []
    audio_after_tool = bytearray()
    async with session:
        live.append(session)
        await session.send_message(ASK)
        async with asyncio.timeout(240):
            async for ev in session:
                if ev.type == "raw_model_event":
                    raw = ev.data
                    if raw.type == "raw_server_event" and raw.data["type"] == "response.done":
                        responses.append(raw.data["response"]["id"])
                    continue
                seen.append(ev.type)
                assert ev.type != "error", ev.error
                if ev.type in ("tool_start", "tool_end"):
                    tool_events.append(ev)
                elif ev.type == "audio" and tool_events:
                    audio_after_tool += ev.audio.data
                elif ev.type == "agent_end" and len(responses) == 2:
                    break
    start, end = tool_events
    assert start.type == "tool_start" and end.type == "tool_end"
    assert start.tool.name == end.tool.name == "get_weather"
    # The tool ran once, on the arguments the model wrote.
    assert json.loads(start.arguments) == {"city": calls[0]} and len(calls) == 1
    assert end.output == json.dumps({"city": calls[0], "sky": "clear"})
    assert seen.index("tool_end") < seen.index("audio_end")
    assert len(audio_after_tool) > 0 and len(audio_after_tool) % 2 == 0  # pcm16

    # The call came alone; the answer read the call and the tool's output
    # as chat's history gives them.
    first, answer = responses
    assert admitted(server, first).spec.messages[-1].role == "user"
    sent = admitted(server, answer).spec.messages
    assert [m.role for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[0].content == "Say the weather." and sent[1].content == ASK
    (tc,) = sent[2].tool_calls
    assert (tc.name, tc.arguments) == ("get_weather", start.arguments)
    assert sent[3].tool_call_id == tc.id and sent[3].content == end.output


async def test_the_openai_chat_tool_loop_ends_in_a_spoken_answer(server):
    weather = CHAT_WEATHER
    results = {"Paris": "sunny", "Oslo": "snow"}
    client = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120
    )
    messages: list[Any] = [{"role": "user", "content": ASK}]
    try:
        first = await client.chat.completions.create(
            model=PIPELINE,
            messages=messages,
            tools=[weather],
            tool_choice="required",
            # One call: a random-weight model would add calls until max_tokens.
            parallel_tool_calls=False,
            max_tokens=60,
        )
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls", choice.message
        (call,) = choice.message.tool_calls
        city = json.loads(call.function.arguments)["city"]
        messages += [
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": results[city]},
        ]
        # The loop as an agent writes it: the same tools, the model's choice.
        final = await client.chat.completions.create(
            model=PIPELINE,
            messages=messages,
            tools=[weather],
            modalities=["text", "audio"],
            audio={"voice": "default", "format": "wav"},
            seed=3,
            max_tokens=16,
        )
    finally:
        await client.close()
    answer = final.choices[0]
    assert answer.finish_reason in ("stop", "length") and not answer.message.tool_calls
    assert answer.message.audio is not None and answer.message.audio.data
    assert answer.message.audio.transcript
    sent = admitted(server, final.id.removeprefix("chatcmpl-")).spec.messages
    assert [m.role for m in sent] == ["user", "assistant", "tool"]
    (tc,) = sent[1].tool_calls
    assert (tc.id, tc.name, tc.arguments) == (call.id, "get_weather", call.function.arguments)
    assert sent[2].tool_call_id == call.id and sent[2].content == results[city]
