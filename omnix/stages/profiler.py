"""Profiling one worker on request: torch's profiler around its process.

Owns ``WorkerProfiler``: one start/stop window at a time, written as a
Chrome trace (``worker-<pid>-<n>.json``, open it in Perfetto or
chrome://tracing) under the replica's directory (``DIR/<stage>/<replica>``).
Does not own when profiling happens (``POST /start_profile`` and
``/stop_profile`` through the runtime's PROFILE message) nor an engine's
profiling of processes of its own (an engine that is a
``ProfilingEngine``, like vLLM's, whose engine core writes its traces
under the same directory).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class ProfileError(RuntimeError):
    """A start while profiling or a stop while not: says which."""


class WorkerProfiler:
    """torch's profiler over this process (CPU, and CUDA where there is one)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._prof: Any = None
        self._windows = 0

    def prepare(self) -> None:
        """Import torch's profiler now, while the worker loads (seconds of
        import on a worker whose engine does not use torch), so that a start
        later does not stall the worker's loop and heartbeats."""
        import torch.profiler  # noqa: F401

    @property
    def active(self) -> bool:
        return self._prof is not None

    def start(self) -> None:
        if self._prof is not None:
            raise ProfileError(
                f"already profiling into {self.root}: stop it first (POST /stop_profile)"
            )
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.root.mkdir(parents=True, exist_ok=True)
        prof = profile(activities=activities, record_shapes=True)
        prof.start()
        self._prof = prof

    def stop(self) -> Any:
        """End the window (on the thread that started it: torch's profiler
        state is per thread); what ``write`` takes."""
        if self._prof is None:
            raise ProfileError("not profiling: start first (POST /start_profile)")
        prof, self._prof = self._prof, None
        prof.stop()
        self._windows += 1
        return prof

    def write(self, ended: Any) -> Path:
        """Write an ended window's trace (seconds for a long window: call it
        off the event loop); the file written."""
        path = self.root / f"worker-{os.getpid()}-{self._windows}.json"
        ended.export_chrome_trace(str(path))
        return path
