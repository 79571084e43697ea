"""``omnix serve --config FILE``: the server's flags from a file.

Owns reading a TOML, YAML or JSON file whose keys are ``omnix serve``'s
long options (``retain-requests = 200`` or ``retain_requests: 200``, as
``vllm serve --config`` takes its own) into the parsed arguments: a key
the verb does not have is an error naming it; a value of the wrong kind
is an error naming the key; a flag given on the command line wins over
the file.  Does not own what any option means (``serve.py``).
"""

from __future__ import annotations

import argparse
import difflib
import json
import tomllib
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """The config file cannot be used; the message says where and why."""


def defaults_of(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The verb's options by destination (what a config key may name)."""
    return {
        a.dest: a for a in parser._actions if a.option_strings and a.dest not in ("help", "config")
    }


def read_config(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"--config {p}: cannot read it ({exc.strerror or exc})") from None
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        elif p.suffix == ".json":
            data = json.loads(text)
        else:
            data = tomllib.loads(text)
    except Exception as exc:
        raise ConfigError(
            f"--config {p}: not valid {p.suffix.lstrip('.') or 'TOML'} ({exc})"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"--config {p}: the file must hold a table of options, not {type(data).__name__}"
        )
    return data


def apply_config(
    args: argparse.Namespace,
    options: dict[str, argparse.Action],
    path: str | Path,
    engine: frozenset[str] = frozenset(),
) -> None:
    """Set ``args`` from the file at ``path`` where the command line left
    an option at its default.  ``engine``: the options that are vLLM's
    engine flags, whose values are read as vLLM's command line reads them
    (``omnix.pipelines.vllm_args.through``)."""
    for key, value in read_config(path).items():
        dest = str(key).replace("-", "_")
        action = options.get(dest)
        if action is None:
            own = ", ".join(sorted(d.replace("_", "-") for d in options if d not in engine))
            vllm = f"; and vLLM's {len(engine)} engine arguments" if engine else ""
            near = difflib.get_close_matches(dest, list(options), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(n.replace('_', '-') for n in near)}?" if near else ""
            raise ConfigError(
                f"--config {path}: unknown option {key!r} (options: {own}{vllm}){hint}"
            )
        if getattr(args, dest, argparse.SUPPRESS) != action.default:
            continue  # given on the command line: it wins
        if dest in engine:
            setattr(args, dest, _engine_value(path, key, action, value))
        else:
            setattr(args, dest, _value(path, key, action, value))


def _engine_value(path: str | Path, key: str, action: argparse.Action, value: Any) -> Any:
    from omnix.pipelines.vllm_args import through

    try:
        return through(action, value)
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        raise ConfigError(f"--config {path}: {key} = {value!r}: {exc}") from None


def _value(path: str | Path, key: str, action: argparse.Action, value: Any) -> Any:
    if isinstance(action, argparse._StoreTrueAction):
        if not isinstance(value, bool):
            raise ConfigError(
                f"--config {path}: {key} is a switch: give true or false, not {value!r}"
            )
        return value
    if isinstance(value, (dict, list)) or isinstance(value, bool):
        raise ConfigError(f"--config {path}: {key} takes one value, not {value!r}")
    convert = action.type if callable(action.type) else str
    try:
        return convert(value if convert is not str else str(value))
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        raise ConfigError(f"--config {path}: {key} = {value!r}: {exc}") from None
