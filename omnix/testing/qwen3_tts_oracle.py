"""The Qwen3-TTS reference run from omnix's side: where it lives, how it runs.

Owns: ``reference_python`` (the reference environment's interpreter:
``$OMNIX_REFERENCE_ENV``, else ``.venv-ref`` at the repository root, as
scripts/reference-env.sh builds it) and ``run_reference``, which runs
``qwen3_tts_reference.py`` there over a list of cases as a subprocess and
returns what it wrote.  Used by the oracle tests
(tests/engines/test_qwen3_tts.py) and ``omnix bench tts``; never by the
server.  Does not own the cases' meaning (the script's docstring).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("qwen3_tts_reference.py")


class ReferenceMissing(RuntimeError):
    """No reference environment: build it with scripts/reference-env.sh."""


def reference_python() -> Path:
    env = Path(os.environ.get("OMNIX_REFERENCE_ENV", ROOT / ".venv-ref"))
    if not env.is_absolute():
        env = ROOT / env
    return env / "bin" / "python"


def run_reference(
    folder: Path, cases: list[dict[str, Any]], tmp: Path, timeout: float = 600
) -> dict[str, Any]:
    """The reference's run over ``cases`` in one process (~20 s to load
    and run the oracle's cases): ``{"keys": ..., "results": [...]}``."""
    python = reference_python()
    if not python.exists():
        raise ReferenceMissing(
            f"no reference environment at {python.parent.parent}: bash scripts/reference-env.sh"
        )
    (tmp / "cases.json").write_text(json.dumps(cases))
    out = tmp / "out.json"
    run = subprocess.run(
        [str(python), str(RUNNER), str(folder), str(tmp / "cases.json"), str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""},
    )
    if run.returncode != 0:
        raise RuntimeError(f"the reference failed:\n{run.stderr[-4000:]}")
    data: dict[str, Any] = json.loads(out.read_text())
    return data
