"""A chat body's tools -> the text stage's tool parameters, or one 400.

Owns: checking ``tools``, ``tool_choice``, ``parallel_tool_calls`` and
the history's calls against each other and against the text stage (its
parsers, as ``--enable-auto-tool-choice`` and ``--tool-call-parser`` set
them), with the error vLLM's server gives where it gives one, naming the
field; and the ``StageParams`` the stage runs them with (``stage_tools``:
the tools and the choice as JSON, as vLLM's parsers take them, and
``parallel_tool_calls``; the realtime API's functions are given to the
stage by it too).  The history's calls as the log records them
(``history_calls``).

Does not own the rest of the body (``plan.py``), rendering the tools into
the prompt nor parsing the output (the vLLM stage's worker:
``omnix.engines.vllm_tools``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from omnix.events.types import StageParams, ToolCall
from omnix.http.chat.protocol import ChatCompletionRequest, NamedToolChoice, Tool, ToolChoice
from omnix.http.common.fields import Message
from omnix.http.common.plan import PlanContext
from omnix.http.common.sampling import bad
from omnix.http.core.errors import ApiError
from omnix.pipelines.config import PipelineConfig, VllmArgs


def tool_stage(pipeline: PipelineConfig, stage: str) -> VllmArgs | None:
    """The stage's vLLM arguments when it is a vLLM stage writing text (the
    only kind that calls tools), else None."""
    for st in pipeline.stages:
        if st.name == stage and isinstance(st.engine, VllmArgs):
            return st.engine if st.engine.output_modality == "text" else None
    return None


def check_schema(schema: dict[str, Any], param: str) -> None:
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise bad(
            param,
            f"{param} is not a valid JSON Schema: {exc.message}"
            + (f" (at {where})" if where else ""),
        ) from None


def stage_tools(tools: Sequence[Tool], choice: ToolChoice, parallel: bool | None) -> StageParams:
    """The text stage's tool parameters: ``tools`` and ``choice`` as the
    JSON vLLM's parsers take, and ``parallel`` (``parallel_tool_calls``;
    False: the stage keeps the answer's first call only, and a forced
    answer's schema holds one: ``omnix.engines.vllm_tools``; None: vLLM's
    default, any number)."""
    return StageParams(
        tools=msgspec.json.encode(tools).decode(),
        tool_choice=msgspec.json.encode(choice).decode(),
        parallel_tool_calls=parallel,
    )


def tool_params(body: ChatCompletionRequest, served: PlanContext, stage: str) -> StageParams:
    """The text stage's tool parameters (empty: the body gives no tools)."""
    tools = body.tools or []
    choice = body.tool_choice
    if not tools:
        if choice is not None and choice != "none":
            raise bad("tool_choice", "tool_choice is given but tools is not: give tools too.")
        return StageParams()
    names: set[str] = set()
    for i, tool in enumerate(tools):
        name = tool.function.name
        if name in names:
            raise bad(f"tools[{i}].function.name", f"tools[{i}]: a second function named {name!r}.")
        names.add(name)
        if tool.function.parameters is not None:
            check_schema(tool.function.parameters, f"tools[{i}].function.parameters")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise bad(
            "tool_choice",
            f"tool_choice names the function {choice.function.name!r}, which tools does not "
            f"give (it gives {', '.join(sorted(names))}).",
        )
    args = tool_stage(served.pipeline, stage)
    if args is None:
        raise ApiError(
            400,
            f"tools: the text stage {stage!r} is not a vLLM stage writing text: it calls no "
            "tools; omit tools.",
            param="tools",
            code="unsupported_parameter",
        )
    if (choice is None or choice == "auto") and not (
        args.enable_auto_tool_choice and args.tool_call_parser
    ):
        # vLLM's server's words for the same request.
        raise bad(
            "tool_choice",
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be '
            'set: send tool_choice "none", "required" or a named function.',
        )
    return stage_tools(tools, choice if choice is not None else "auto", body.parallel_tool_calls)


def history_calls(m: Message) -> tuple[tuple[ToolCall, ...], str]:
    """A history message's calls and the call it answers, as given: like
    vLLM's server, the chat template judges them (the document lets any
    role carry both, so refusing one here would refuse a body it allows)."""
    calls = m.tool_calls or []
    return (
        tuple(
            ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments) for c in calls
        ),
        m.tool_call_id or "",
    )
