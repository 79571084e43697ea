"""What the waveform decoder stages share (``codec``, ``code2wav``).

Owns: ``DecoderThread``, one decode thread for every request of a worker
(no oversubscription of a small CPU, one CUDA stream of its own, and the
event loop never waits on torch), the requests running and those aborted, the
deterministic kernels a sample-exact stream needs on CUDA, and
``Delivered``, which drops the samples a lost replica already delivered
from a continuation's output.  Does not own any decoder's maths nor its
input layout (``codec_engine.py``, ``code2wav_engine.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from omnix.engines.device import pick_device, use_own_stream
from omnix.transport.work import GenerateRequest

T = TypeVar("T")


class DecoderThread:
    """One decode thread and the request bookkeeping an engine's
    ``generate`` / ``abort`` / ``close`` share."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pool: ThreadPoolExecutor | None = None
        self.running: set[str] = set()
        self.aborted: set[str] = set()

    def open(self, device: str) -> str:
        """The device ``device`` names (``auto``: the best there is), the
        thread started.  On CUDA: the same shapes take the same kernels,
        giving the same bits (a stream's exactness needs it)."""
        import torch

        picked = pick_device(device)
        if picked.startswith("cuda"):
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
        # A stream of the thread's own: a talker in the same process steps
        # on the GPU while a decode runs, not after it.
        self.pool = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix=f"omnix-{self.name}",
            initializer=use_own_stream,
            initargs=(picked,),
        )
        return picked

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        if self.pool is None:
            raise RuntimeError(f"{self.name} engine used before start() (or after close())")
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def begin(self, rid: str) -> None:
        self.running.add(rid)
        self.aborted.discard(rid)

    def end(self, rid: str) -> None:
        self.running.discard(rid)
        self.aborted.discard(rid)

    def abort(self, rid: str) -> None:
        if rid in self.running:
            self.aborted.add(rid)

    def close(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class Delivered:
    """A continuation's first ``resume.samples`` samples, which the replica
    it replaces had delivered: dropped from what it decodes again."""

    def __init__(self, request: GenerateRequest) -> None:
        self.left = request.resume.samples if request.resume is not None else 0
        if self.left < 0:
            raise ValueError(f"resume.samples must be >= 0, got {self.left}")

    def drop(self, pcm: np.ndarray) -> np.ndarray:
        if self.left:
            cut = min(self.left, pcm.size)
            pcm, self.left = pcm[cut:], self.left - cut
        return pcm
