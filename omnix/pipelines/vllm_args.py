"""vLLM's engine arguments as the installed vLLM defines them.

Owns: reading vLLM's own argument definitions (the actions
``AsyncEngineArgs.add_cli_args`` builds, so every name, type, choice and
help text follows the installed vLLM and omnix keeps no list of its own);
turning a pipeline file's ``engine_args`` value into the value vLLM's
command line would have given (``convert``: an unknown key or a value of
the wrong type is a ``ValueError`` naming the key); adding those flags to
``omnix serve`` (``add_engine_flags``); and ``vllm_kwargs``, the one place
a vLLM stage's typed fields (omnix's defaults) and its ``engine_args``
table (which wins) become the keyword arguments of vLLM's ``EngineArgs``.

vLLM is imported only when one of these is called, never when this module
is: validating a pipeline without vLLM stages, or a ``--help`` of another
verb, costs nothing.  Does not own building the engine
(``omnix.engines.vllm_setup``) nor the flags of omnix's own.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import functools
import json
import logging
import os
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omnix.pipelines.config import VllmArgs

#: Engine arguments a stage may not set in ``engine_args``, and what sets them.
RESERVED: dict[str, str] = {
    "model": "the stage's engine.model names the model folder",
}

#: The typed ``VllmArgs`` fields that are vLLM engine arguments of the same
#: name, with the value that leaves each to vLLM's own default.
TYPED: dict[str, object] = {
    "dtype": "auto",
    "max_model_len": 0,
    "max_num_seqs": 0,
    "enforce_eager": None,
    "gpu_memory_utilization": 0,
}


def import_vllm() -> None:
    """Import vLLM's engine arguments.  In a process that has not imported
    vLLM yet and does not say how vLLM should log (``VLLM_LOGGING_LEVEL``:
    the server; a worker sets it before it imports vLLM), vLLM's logger
    is set to ERROR first: the server only reads vLLM's definitions and
    checks configs, and its output is omnix's (an engine configures vLLM's
    logging afresh).  Whatever the level, the notes vLLM makes while it is
    imported are dropped: they describe the platform of the process that
    imports it (the server's: Triton without a CPU backend), not the
    workers' where engines run."""
    if "vllm.engine.arg_utils" in sys.modules:
        return
    if "vllm" not in sys.modules and "VLLM_LOGGING_LEVEL" not in os.environ:
        logging.getLogger("vllm").setLevel(logging.ERROR)
    disabled = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        import vllm.engine.arg_utils  # noqa: F401
    finally:
        logging.disable(disabled)


def vllm_version() -> str:
    import_vllm()
    import vllm

    return str(vllm.__version__)


@functools.cache
def engine_actions() -> dict[str, argparse.Action]:
    """vLLM's engine flags by destination (``max_model_len``: the
    ``--max-model-len`` action), as ``vllm serve`` builds them."""
    import_vllm()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(add_help=False)
    AsyncEngineArgs.add_cli_args(parser)
    return {a.dest: a for a in parser._actions if a.option_strings}


@functools.cache
def engine_fields() -> frozenset[str]:
    """The field names of vLLM's ``AsyncEngineArgs`` (what ``engine_args`` may name)."""
    import_vllm()
    from vllm.engine.arg_utils import AsyncEngineArgs

    return frozenset(f.name for f in dataclasses.fields(AsyncEngineArgs))


def unknown_key(key: str) -> str:
    """Why ``key`` is not an engine argument, with the closest names."""
    if key in RESERVED:
        return f"{key} is not taken here: {RESERVED[key]}"
    near = difflib.get_close_matches(key, sorted(engine_fields()), n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    return f"{key} is not one of vLLM {vllm_version()}'s engine arguments{hint}"


def convert(key: str, value: Any) -> Any:
    """``value`` (as a TOML, YAML or JSON file gives it) as vLLM's command
    line would give it for ``key``: through the flag's own type, choices
    and arity.  ``ValueError`` naming the key when it is not an engine
    argument or the value is not of its type."""
    if key in RESERVED or key not in engine_fields():
        raise ValueError(unknown_key(key))
    action = engine_actions().get(key)
    if action is None:  # a field without a flag: taken as given
        return value
    try:
        return through(action, value)
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        raise ValueError(f"{key} = {value!r}: {_one_line(str(exc))}") from None


def through(action: argparse.Action, value: Any) -> Any:
    """A file's ``value`` for the flag ``action`` as its command line
    would give it (``TypeError``/``ValueError`` when it is not one)."""
    flag = action.option_strings[0]
    if action.nargs == 0:  # a switch: --x / --no-x
        if not isinstance(value, bool):
            raise TypeError(f"{flag} is a switch: give true or false")
        return value
    if isinstance(value, bool) and not (action.nargs == "?" and action.const is True):
        raise TypeError(f"{flag} takes a value, not {str(value).lower()}")
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        return [_scalar(action, v) for v in items]
    if isinstance(value, (list, tuple)):
        raise TypeError(f"{flag} takes one value, not a list")
    return _scalar(action, value)


def _scalar(action: argparse.Action, value: Any) -> Any:
    if isinstance(value, bool) and action.nargs == "?":
        return value
    if isinstance(value, dict):
        text = json.dumps(value)  # a JSON-valued flag (--hf-overrides '{...}')
    elif isinstance(value, float) and value.is_integer() and action.type is int:
        text = str(int(value))
    else:
        text = str(value)
    if isinstance(value, (int, float)) and not _takes_numbers(action):
        raise TypeError(f"{action.option_strings[0]} takes text, not the number {value}")
    out = action.type(text) if callable(action.type) else text
    if action.choices is not None and out not in action.choices:
        shown = ", ".join(str(c) for c in action.choices if c is not None)
        raise ValueError(f"{out!r} is not one of {shown}")
    return out


def _takes_numbers(action: argparse.Action) -> bool:
    """Whether a number is a value of this flag (its type parses one)."""
    if action.type in (int, float):
        return True
    if action.choices is not None:
        return any(isinstance(c, (int, float)) and not isinstance(c, bool) for c in action.choices)
    parse = action.type
    if not callable(parse) or parse is str:
        return False
    try:  # vLLM's own parsers (human_readable_int, optional ints): try one
        return bool(parse("1") == 1)
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        return False


def _one_line(text: str) -> str:
    """A pydantic or vLLM error message in one line, without its links."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("For further information visit")]
    # pydantic's trailer: the error type and the whole input, echoed back
    return re.sub(r"\s*\[type=[^\]]*\]", "", "; ".join(lines))


def one_line(exc: BaseException) -> str:
    """vLLM's own message for ``exc`` in one line."""
    return _one_line(str(exc)) or type(exc).__name__


def vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def check_engine_args(table: dict[str, Any]) -> list[str]:
    """Every problem of a stage's ``engine_args`` table, one line each.
    Where vLLM is not installed (a laptop replaying a trace) there is
    nothing to check against: the engine checks the table when it starts."""
    if not vllm_installed():
        return []
    problems = []
    for key, value in table.items():
        try:
            convert(key, value)
        except ValueError as exc:
            problems.append(f"engine_args.{exc}")
    return problems


def vllm_kwargs(args: VllmArgs) -> dict[str, Any]:
    """The ``EngineArgs`` keywords a stage sets: its typed fields (omnix's
    defaults; a field at its ``TYPED`` value is left to vLLM), then its
    ``engine_args`` table converted as vLLM's command line would, which
    wins."""
    out: dict[str, Any] = {}
    for key, unset in TYPED.items():
        value = getattr(args, key)
        if value != unset:
            out[key] = value
    if args.limit_mm_per_prompt:
        out["limit_mm_per_prompt"] = dict(args.limit_mm_per_prompt)
    for key, value in args.engine_args.items():
        out[key] = convert(key, value)
    return out


def setting(args: VllmArgs, key: str) -> Any:
    """The value a stage asks of vLLM for ``key`` (its ``engine_args``
    entry, else its typed field), without importing vLLM when the table
    does not name it; None when the stage leaves it to vLLM."""
    if key in args.engine_args:
        value = args.engine_args[key]
        return convert(key, value) if vllm_installed() else value
    value = getattr(args, key, None)
    return None if key in TYPED and value == TYPED[key] else value


def add_engine_flags(parser: argparse.ArgumentParser) -> list[str]:
    """Add vLLM's engine flags to ``parser`` in a group of their own and
    return their destinations.  A flag whose names ``parser`` already has
    stays omnix's; none has a default (only what the command line gives
    reaches a stage; the rest is the stage's own or vLLM's)."""
    taken = set(parser._option_string_actions)
    group = parser.add_argument_group(
        f"vLLM engine arguments (vLLM {vllm_version()})",
        "vLLM's own flags, with vLLM's names and meaning; each one given applies to every "
        "vLLM stage of the served pipeline, over the stage's own settings",
    )
    dests = []
    for dest, action in engine_actions().items():
        names = [s for s in action.option_strings if s not in taken]
        if dest in RESERVED or not any(n.startswith("--") for n in names):
            continue
        mine = copy.copy(action)
        mine.option_strings = names
        if action.default is not argparse.SUPPRESS and action.help is not argparse.SUPPRESS:
            shown = str(action.default)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            mine.help = f"{action.help or ''} (vLLM's default: {shown.replace('%', '%%')})".strip()
        mine.default = argparse.SUPPRESS
        if callable(action.type):
            mine.type = _plain_or_text(action.type)
        group._add_action(mine)
        dests.append(dest)
    return dests


def parser_problems(tool_call_parser: str, reasoning_parser: str, auto: bool) -> list[str]:
    """What is wrong with a stage's parser settings: a name the installed
    vLLM does not have (vLLM's registries are the list), or
    ``enable_auto_tool_choice`` without a tool-call parser (vLLM refuses
    it too).  Names are not checked where vLLM is not installed."""
    problems = []
    if auto and not tool_call_parser:
        problems.append(
            "enable_auto_tool_choice (--enable-auto-tool-choice) needs tool_call_parser "
            "(--tool-call-parser NAME)"
        )
    if not vllm_installed():
        return problems
    for kind, name in (("tool_call", tool_call_parser), ("reasoning", reasoning_parser)):
        known = _registered_parsers(kind) if name else []
        if name and name not in known:
            words = kind.replace("_", "-")
            problems.append(
                f"{kind}_parser (--{words}-parser): vLLM has no {words} parser "
                f"{name!r}; its parsers: {', '.join(sorted(known))}"
            )
    return problems


def _registered_parsers(kind: str) -> list[str]:
    """The names in vLLM's registry of ``tool_call`` or ``reasoning`` parsers."""
    if kind == "tool_call":
        from vllm.tool_parsers import ToolParserManager

        return list(ToolParserManager.list_registered())
    from vllm.reasoning import ReasoningParserManager

    return list(ReasoningParserManager.list_registered())


def load_chat_template(value: str) -> str:
    """vLLM's ``--chat-template`` read as vLLM reads it: a file's text, one
    of vLLM's bundled templates by name, or the template itself.
    ``ValueError`` (vLLM's message) for a path that cannot be opened."""
    from vllm.exceptions import VLLMError
    from vllm.renderers.chat_utils import load_chat_template as load

    try:
        text = load(value)
    except VLLMError as exc:
        raise ValueError(str(exc)) from None
    assert text is not None
    return text


def _plain_or_text(parse: Any) -> Any:
    """vLLM's parser for a flag, checking the text as vLLM does but keeping
    a value a pipeline file can hold: the parsed value when it is plain
    (numbers, text, lists and tables of them), else the text itself (a
    config object given as JSON), which ``convert`` parses again."""

    def checked(text: str) -> Any:
        value = parse(text)
        return value if _is_plain(value) else text

    checked.__name__ = getattr(parse, "__name__", "value")
    return checked


def _is_plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False
