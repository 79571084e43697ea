"""A vLLM text stage's output parsing with vLLM's own parsers, fed the
model format's text token by token as the engine streams it (how
``tool_choice: "auto"`` is held: a random-weight model never writes a
call by itself): hermes-style calls become OpenAI's call pieces, the text
around them the answer; Qwen3's reasoning parser splits the reasoning off;
``required`` and a named function sample under the JSON schema of their
calls and read it back as vLLM's server does, with or without a parser;
``none`` leaves the text alone.  And the chat template sees the
tools and the history's calls, as vLLM hands them to it."""

from __future__ import annotations

import json

import pytest

from omnix.events.types import ChatMessage, StageParams, ToolCall
from omnix.pipelines.config import VllmArgs
from omnix.transport.work import InputPiece

pytest.importorskip("vllm")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from vllm.tokenizers import get_tokenizer

    from tests.model_fixtures import session_models

    return get_tokenizer(session_models(tmp_path_factory).thinker)


def _parse(tokenizer, tool_parser="hermes", reasoning_parser="", **params):
    from omnix.engines.vllm_tools import RequestParse, stage_parser

    args = VllmArgs(
        model="thinker",
        enable_auto_tool_choice=bool(tool_parser),
        tool_call_parser=tool_parser,
        reasoning_parser=reasoning_parser,
    )
    return RequestParse(stage_parser(args, tokenizer), tokenizer, StageParams(**params))


def _stream(tokenizer, parse, text: str):
    """Feed ``text`` one token at a time; the answer, reasoning and pieces."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    prompt = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    content, reasoning, pieces = [], [], []
    for i, t in enumerate(ids):
        got = parse.feed(tokenizer.decode([t]), (t,), prompt, i == len(ids) - 1)
        content.append(got.content)
        reasoning.append(got.reasoning)
        pieces.extend(got.tool_calls)
    return "".join(content), "".join(reasoning), pieces


def _calls(pieces):
    calls: dict[int, dict] = {}
    for p in pieces:
        c = calls.setdefault(p.index, {"id": "", "name": "", "arguments": ""})
        c["id"] = c["id"] or p.id
        c["name"] = c["name"] or p.name
        c["arguments"] += p.arguments
    return [calls[i] for i in sorted(calls)]


def test_auto_splits_a_hermes_call_from_the_answer(tokenizer):
    parse = _parse(tokenizer, tools=json.dumps([WEATHER]), tool_choice='"auto"')
    assert parse.structured is None  # auto samples freely
    text = 'Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, reasoning, pieces = _stream(tokenizer, parse, text)
    assert content == "Let me look. "
    assert reasoning == ""
    (call,) = _calls(pieces)
    assert call["name"] == "get_weather" and call["id"]
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    # The id and the name come once, on the call's first piece.
    assert sum(1 for p in pieces if p.id) == 1 and pieces[0].name == "get_weather"


def test_auto_reads_parallel_calls_in_order(tokenizer):
    parse = _parse(tokenizer, tools=json.dumps([WEATHER, TIME]), tool_choice='"auto"')
    text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    _, _, pieces = _stream(tokenizer, parse, text)
    calls = _calls(pieces)
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert [json.loads(c["arguments"]) for c in calls] == [{"city": "Oslo"}, {}]
    assert calls[0]["id"] != calls[1]["id"]


def test_parallel_tool_calls_false_keeps_the_first_call_only(tokenizer):
    parse = _parse(
        tokenizer,
        tools=json.dumps([WEATHER, TIME]),
        tool_choice='"auto"',
        parallel_tool_calls=False,
    )
    text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    _, _, pieces = _stream(tokenizer, parse, text)
    assert [c["name"] for c in _calls(pieces)] == ["get_weather"]


def test_plain_text_stays_the_answer(tokenizer):
    parse = _parse(tokenizer, tools=json.dumps([WEATHER]), tool_choice='"auto"')
    content, _, pieces = _stream(tokenizer, parse, "It is sunny in Paris.")
    assert content == "It is sunny in Paris." and pieces == []


def test_tool_choice_none_leaves_a_call_as_text(tokenizer):
    parse = _parse(tokenizer, tools=json.dumps([WEATHER]), tool_choice='"none"')
    text = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    content, _, pieces = _stream(tokenizer, parse, text)
    assert pieces == [] and content == text


def test_qwen3_reasoning_parser_splits_the_reasoning_off(tokenizer):
    parse = _parse(tokenizer, reasoning_parser="qwen3", tools=json.dumps([WEATHER]))
    text = '<think>The user wants weather.</think>Checking. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    content, reasoning, pieces = _stream(tokenizer, parse, text)
    assert reasoning == "The user wants weather."
    assert content == "Checking. "
    assert json.loads(_calls(pieces)[0]["arguments"]) == {"city": "Rome"}


def test_a_reasoning_parser_alone_splits_requests_without_tools(tokenizer):
    parse = _parse(tokenizer, tool_parser="", reasoning_parser="qwen3")
    content, reasoning, pieces = _stream(tokenizer, parse, "<think>hmm</think>Hello.")
    assert (reasoning, content, pieces) == ("hmm", "Hello.", [])


@pytest.mark.parametrize("tool_parser", ["hermes", ""])
def test_required_samples_a_json_array_of_calls_and_reads_it_back(tokenizer, tool_parser):
    parse = _parse(
        tokenizer, tool_parser, tools=json.dumps([WEATHER, TIME]), tool_choice='"required"'
    )
    schema = json.loads(json.dumps(parse.structured.json))
    assert schema["type"] == "array" and schema["minItems"] == 1
    text = '[{"name": "get_weather", "parameters": {"city": "Oslo"}}, {"name": "get_time", "parameters": {}}]'
    content, _, pieces = _stream(tokenizer, parse, text)
    calls = _calls(pieces)
    assert content == ""
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert [json.loads(c["arguments"]) for c in calls] == [{"city": "Oslo"}, {}]


def test_a_named_function_samples_its_arguments_and_reads_them_as_its_call(tokenizer):
    named = {"type": "function", "function": {"name": "get_weather"}}
    parse = _parse(tokenizer, tools=json.dumps([WEATHER, TIME]), tool_choice=json.dumps(named))
    assert parse.structured.json == WEATHER["function"]["parameters"]
    content, _, pieces = _stream(tokenizer, parse, '{"city": "Paris"}')
    (call,) = _calls(pieces)
    assert content == "" and call["name"] == "get_weather" and call["id"]
    assert json.loads(call["arguments"]) == {"city": "Paris"}


TOOLS_TEMPLATE = (
    "{%- if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}CALL {{ c.id }} {{ c.function.name }} "
    "{{ c.function.arguments.city }}{% endfor %}{% endif %}"
    "{%- if m.tool_call_id %} FOR {{ m.tool_call_id }}{% endif %}<|im_end|>\n"
    "{%- endfor %}<|im_start|>assistant\n"
)


def test_the_chat_template_sees_the_tools_and_the_historys_calls(tokenizer):
    from omnix.engines.vllm_prompt import PromptRenderer
    from omnix.engines.vllm_setup import VocabLayout

    prompts = PromptRenderer(None, VocabLayout(), None, tokenizer, None, TOOLS_TEMPLATE)
    piece = InputPiece(
        messages=(
            ChatMessage("user", "Weather in Paris?"),
            ChatMessage(
                "assistant",
                "",
                tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Paris"}'),),
            ),
            ChatMessage("tool", "sunny", tool_call_id="call_1"),
        )
    )
    ids = prompts.prompt_ids(piece, VllmArgs(model="thinker"), [WEATHER, TIME])
    text = tokenizer.decode(ids)
    assert text.startswith("TOOLS:get_weather;get_time;")
    # Arguments reach the template as an object, as vLLM gives them.
    assert "CALL call_1 get_weather Paris" in text
    assert "sunny FOR call_1" in text
