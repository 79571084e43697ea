"""A realtime session's function tools: checked, recorded, and put on the text stage.

Owns ``Tools``: the functions a session (``session.update``) or one
response (``response.create``) offers the model, its ``tool_choice`` and
its ``parallel_tool_calls`` (false: one call an answer, as chat's);
``checked`` (the rules chat's ``tools`` follow, ``omnix.http.chat.tools``:
a JSON Schema of the arguments, one function a name, a named choice among
the tools, ``required`` or a name only with tools -- a session's waits
for its tools until a response is created, as LiveKit Agents sends
``tool_choice`` before ``tools`` --, a vLLM text stage, and
``auto`` only where that stage parses calls by itself: vLLM's
``--enable-auto-tool-choice`` and ``--tool-call-parser``), each refusal
naming its field; what the log records (``SessionSettings.tools`` /
``.tool_choice`` as JSON, ``.parallel_tool_calls``) and back; and
``params``: the text stage's tool parameters, made by chat's own
``stage_tools`` (vLLM's parsers take chat's shape; the stage enforces
``parallel_tool_calls`` false for both APIs alike).

Does not own the rest of the configuration (``config.py``) nor rendering
the calls (``render.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from omnix.events.types import StageParams
from omnix.http.chat.protocol import FunctionDef, NamedFunction, NamedToolChoice, Tool
from omnix.http.chat.tools import check_schema, stage_tools, tool_stage
from omnix.http.common.plan import PlanContext
from omnix.http.core.errors import ApiError
from omnix.http.realtime.protocol import FunctionChoice, FunctionTool, ToolChoice

CHOICES = ("auto", "none", "required")


def _bad(param: str, why: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, f"{param}: {why}", param=param, code=code)


@dataclass(frozen=True, slots=True)
class Tools:
    """The functions offered, the choice (default: none offered, ``auto``)
    and ``parallel_tool_calls`` (None: not set, any number of calls)."""

    tools: tuple[FunctionTool, ...] = ()
    choice: ToolChoice = "auto"
    parallel: bool | None = None

    @property
    def calls(self) -> bool:
        """Whether the model may call a function."""
        return bool(self.tools) and self.choice != "none"

    def checked(
        self,
        served: PlanContext,
        tools: list[FunctionTool] | UnsetType | None,
        choice: ToolChoice | UnsetType | None,
        where: str,
    ) -> Tools:
        """These tools with a ``session.update``'s or a ``response.create``'s
        ``tools`` and ``tool_choice`` (UNSET: kept; None: none, ``auto``)."""
        new_tools = self.tools if tools is UNSET else tuple(tools or ())
        new_choice = self.choice if choice is UNSET else (choice or "auto")
        names: set[str] = set()
        for i, tool in enumerate(new_tools):
            if tool.type != "function":
                raise _bad(
                    f"{where}.tools[{i}].type",
                    f'omnix calls functions only, not {tool.type!r} tools; give "function".',
                    "unsupported_value",
                )
            if tool.name in names:
                raise _bad(f"{where}.tools[{i}].name", f"a second function named {tool.name!r}.")
            names.add(tool.name)
            if tool.parameters is not None:
                check_schema(tool.parameters, f"{where}.tools[{i}].parameters")
        # A choice kept from the session is the session's to answer for.
        param = f"{where if choice is not UNSET else 'session'}.tool_choice"
        if isinstance(new_choice, FunctionChoice):
            if new_choice.type != "function":
                raise _bad(
                    f"{param}.type",
                    f'omnix calls functions only, not {new_choice.type!r} tools; give "function".',
                    "unsupported_value",
                )
        elif new_choice not in CHOICES:
            raise _bad(param, f'give "auto", "none", "required" or a function, not {new_choice!r}.')
        out = Tools(new_tools, new_choice, self.parallel)
        # A session may be told its choice before its tools (LiveKit Agents
        # sends tool_choice in one session.update, the tools in the next):
        # without any tools, the choice waits for a response to be checked.
        if names or where != "session":
            out.check_choice(param)
        if out.tools:
            _check_stage(served, out, where)
        return out

    def with_parallel(self, parallel: bool | UnsetType | None) -> Tools:
        """These tools with a ``parallel_tool_calls`` given (UNSET: kept;
        None: not set).  Without tools it is kept for them, as chat ignores
        it without tools."""
        return self if parallel is UNSET else replace(self, parallel=parallel)

    def check_choice(self, param: str = "session.tool_choice") -> None:
        """Refuse a choice these tools cannot meet: a function they do not
        give, or ``required`` with none (``param`` names the field)."""
        choice = self.choice
        if isinstance(choice, FunctionChoice):
            names = [t.name for t in self.tools]
            if choice.name not in names:
                given = ", ".join(sorted(names)) or "none"
                raise _bad(
                    param,
                    f"it names the function {choice.name!r}, which tools does not give "
                    f"(it gives {given}); name one of them, or give that function in tools.",
                )
        elif choice == "required" and not self.tools:
            raise _bad(param, '"required" but no tools are given: give tools too.')

    def params(self) -> StageParams:
        """The text stage's tool parameters, the very JSON chat's ``tools``
        and ``tool_choice`` make of the same functions (empty: no tools)."""
        if not self.tools:
            return StageParams()
        tools = [
            Tool(
                function=FunctionDef(
                    name=t.name, description=t.description, parameters=t.parameters
                )
            )
            for t in self.tools
        ]
        choice: Any = self.choice
        if isinstance(choice, FunctionChoice):
            choice = NamedToolChoice(function=NamedFunction(name=choice.name))
        return stage_tools(tools, choice, self.parallel)

    def recorded(self) -> tuple[str, str]:
        """``(tools, tool_choice)`` as the log records them ("" for the
        defaults; ``parallel`` is recorded as it is)."""
        tools = msgspec.json.encode(self.tools).decode() if self.tools else ""
        choice = "" if self.choice == "auto" else msgspec.json.encode(self.choice).decode()
        return tools, choice

    @classmethod
    def from_recorded(cls, tools: str, choice: str, parallel: bool | None = None) -> Tools:
        return cls(
            tuple(msgspec.json.decode(tools, type=list[FunctionTool])) if tools else (),
            msgspec.json.decode(choice, type=ToolChoice) if choice else "auto",
            parallel,
        )


def _check_stage(served: PlanContext, tools: Tools, where: str) -> None:
    stage = served.output_stage("text") or served.source_stage(("text",))
    args = tool_stage(served.pipeline, stage)
    if args is None:
        raise _bad(
            f"{where}.tools",
            f"the text stage {stage!r} of {served.model!r} is not a vLLM stage writing text: "
            "it calls no tools; send [].",
            "unsupported_value",
        )
    if tools.choice == "auto" and not (args.enable_auto_tool_choice and args.tool_call_parser):
        raise _bad(
            f"{where}.tool_choice",
            '"auto" tool choice needs the server started with --enable-auto-tool-choice and '
            '--tool-call-parser: send "none", "required" or a named function.',
        )
