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
    """One request's parser (``parser_cls``: ``stage_parser``'s class).
    ``structured`` is the structured output to sample under (None: free)."""

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
        request = ChatCompletionRequest(**kw)
        self.parser = parser_cls(tokenizer, request.tools)
        self.request = self.parser.adjust_request(request)
        self.structured: Any = getattr(self.request, "structured_outputs", None)
        self._prompt_seen = False

    def feed(self, text: str, ids: tuple[int, ...], prompt_ids: Any, finished: bool) -> Parsed:
        """The next delta of the request's output (``prompt_ids``: the
        prompt as vLLM ran it, which tells the reasoning parser whether the
        answer starts inside its reasoning)."""
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
        )
        return Parsed(delta.content or "", delta.reasoning or "", calls)
