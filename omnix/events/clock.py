"""Injected clocks: the only way time enters omnix's state.

Owns: the ``Clock`` protocol, the system clock used in production and a
manual clock for tests and replay.  Decision code never calls a clock: the
log stamps input events on append and decisions copy their cause's stamp.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ns(self) -> int:
        """Unix time in nanoseconds, never decreasing between calls."""
        ...


class SystemClock:
    """Wall time, forced monotonic so log timestamps never go backwards."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last = 0

    def now_ns(self) -> int:
        t = time.time_ns()
        if t <= self._last:
            t = self._last + 1
        self._last = t
        return t


class ManualClock:
    """A clock that moves only when told to (tests, virtual-time replay)."""

    __slots__ = ("t",)

    def __init__(self, start_ns: int = 1_700_000_000_000_000_000) -> None:
        self.t = start_ns

    def now_ns(self) -> int:
        return self.t

    def advance(self, ns: int) -> None:
        if ns < 0:
            raise ValueError("a clock cannot move backwards")
        self.t += ns

    def set(self, t_ns: int) -> None:
        if t_ns < self.t:
            raise ValueError(f"a clock cannot move backwards ({t_ns} < {self.t})")
        self.t = t_ns
