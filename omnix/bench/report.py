"""How an oracle bench ends: its figures, its verdict, its exit status.

Owns: ``finish``, shared by the benches that hold omnix's output to a
reference in the same run (``speech``, ``tts``): a human line unless
``--json``, the JSON object on the last line, and exit 1 with a reason on
stderr when omnix's output differed from the reference's.
"""

from __future__ import annotations

import argparse
import json
import sys
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
