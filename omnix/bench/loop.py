"""The event loop a benchmark runs on.

Owns: ``run_on_loop``, which runs a benchmark's coroutine on uvloop (what
``omnix serve`` and the workers run on) unless told otherwise, falling back
to asyncio's loop where uvloop is not installed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_on_loop(coro: Coroutine[Any, Any, T], *, uvloop: bool = True) -> T:
    if uvloop:
        try:
            import uvloop as uv
        except ImportError:
            pass
        else:
            with asyncio.Runner(loop_factory=uv.new_event_loop) as runner:
                return runner.run(coro)
    return asyncio.run(coro)
