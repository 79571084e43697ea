"""How an oracle bench ends: its figures, its verdict, its exit status.

Owns: ``finish``, shared by the benches that hold omnix's output to a
reference in the same run (``speech``, ``tts``): a human line unless
``--json``, the JSON object on the last line, and exit 1 with a reason on
stderr when omnix's output differed from the reference's; and
``progress``, the ``[  12.3 s] what`` lines a long bench writes to stderr
as it goes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def finish(args: argparse.Namespace, res: dict[str, Any], line: str, differs: str) -> int:
    """Print ``line`` (unless ``--json``) and ``res``; 1 with ``differs``
    on stderr when ``res["oracle_equal"]`` is false, else 0."""
    if not getattr(args, "json", False):
        print(line)
    print(json.dumps(res))
    if not res["oracle_equal"]:
        print(differs, file=sys.stderr)
        return 1
    return 0


def progress(what: str, since: float) -> None:
    """``what``, stamped with the seconds since ``since`` (a
    ``time.perf_counter()``), on stderr."""
    print(f"[{time.perf_counter() - since:6.1f} s] {what}", file=sys.stderr, flush=True)
