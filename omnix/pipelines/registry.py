"""The built-in pipelines shipped with omnix, selected by name.

Owns: the mapping from names (``tiny-omni``...) to the TOML files in
``omnix/pipelines/builtin/``.  Loading and validating them is
``validate.load_pipeline``'s job.
"""

from __future__ import annotations

from pathlib import Path

BUILTIN_DIR = Path(__file__).parent / "builtin"
DEFAULT_PIPELINE = "tiny-omni"


def builtin_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in BUILTIN_DIR.glob("*.toml")))


def builtin_path(name: str) -> Path | None:
    p = BUILTIN_DIR / f"{name}.toml"
    return p if p.is_file() else None
