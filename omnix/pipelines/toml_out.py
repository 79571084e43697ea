"""A pipeline config written as TOML that loads back to the same config.

Owns ``pipeline_toml``: every field that differs from its default (a field
left out decodes to its default, so the file stays short and says only
what was chosen), stages and edges as arrays of tables, each nested table
under its own header (``[stages.engine]``, ``[stages.engine.engine_args]``).
Written here rather than with a TOML library because omnix's configs need
only scalars, lists and tables.  Does not own reading (``validate.py``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import msgspec

from omnix.pipelines.config import PipelineConfig

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def pipeline_toml(cfg: PipelineConfig, header: str = "") -> str:
    """``cfg`` as TOML; ``header`` becomes comment lines at the top."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    _table(_plain(cfg), (), lines)
    return "\n".join(lines).strip() + "\n"


def _plain(value: Any) -> Any:
    """Structs as dicts of their non-default fields (a tagged union keeps its tag)."""
    if isinstance(value, msgspec.Struct):
        out: dict[str, Any] = {}
        config = value.__struct_config__
        if config.tag_field is not None:
            out[config.tag_field] = config.tag
        for f in msgspec.structs.fields(value):
            v = getattr(value, f.name)
            if f.default is not msgspec.NODEFAULT and v == f.default:
                continue
            if f.default_factory is not msgspec.NODEFAULT and v == f.default_factory():
                continue
            if v is not None:
                out[f.encode_name] = _plain(v)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    return value


def _key(k: str) -> str:
    return k if _BARE.match(k) else json.dumps(k)


def _is_tables(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _table(d: dict[str, Any], path: tuple[str, ...], lines: list[str]) -> None:
    for k, v in d.items():
        if not isinstance(v, dict) and not _is_tables(v):
            lines.append(f"{_key(k)} = {_value(v)}")
    for k, v in d.items():
        name = ".".join(_key(p) for p in (*path, k))
        if isinstance(v, dict):
            lines += ["", f"[{name}]"]
            _table(v, (*path, k), lines)
        elif _is_tables(v):
            for item in v:
                lines += ["", f"[[{name}]]"]
                _table(item, (*path, k), lines)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        inner = ", ".join(f"{_key(str(k))} = {_value(x)}" for k, x in v.items() if x is not None)
        return "{ " + inner + " }" if inner else "{}"
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as TOML")
