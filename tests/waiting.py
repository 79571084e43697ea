"""Waiting in tests: on a condition, never for a guessed time.

Owns ``wait_until`` (async) and ``wait_until_blocking`` (for synchronous tests): poll a
predicate until it holds, and fail naming what was awaited when a deadline
passes.  A test waits on what it needs (an event in the log, a line of
output, a process gone), so it is as fast as the machine allows and does not
pass or fail by timing.  Waiting on an asyncio event where the code under
test offers one is better still; this is for conditions nothing signals.
Does not own the runtime harness's ``Harness.wait_for`` (tests/stages),
which wakes on every emitted event rather than polling.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 5.0


async def wait_until(
    pred: Callable[[], T | Awaitable[T]],
    what: str,
    timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109 (a deadline, then a message naming `what`)
    interval: float = 0.01,
) -> T:
    """The first truthy value of ``pred()`` (which may be a coroutine
    function), polled every ``interval`` s; ``AssertionError`` naming
    ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)


def wait_until_blocking(
    pred: Callable[[], T],
    what: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.05,
) -> T:
    """``wait_until`` for code with no event loop: blocks the calling thread."""
    deadline = time.monotonic() + timeout
    while not (got := pred()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
    return got
