"""One side of the published-size diffusion table: an engine, its runs, its row.

Owns ``Side``: a ``DiffusersEngine`` on the stage settings of one side
(``diffusion_gpu.py`` makes them), started, warmed, and run: each run a
request alone (seed ``SEED_ALONE``) and a call of four (``SEEDS_FOUR``),
their wall times and steps a second (``rate``), the first run's pixels
(the reference's for ``off``; the worst PSNR and pixel difference against
it for the others) and whether later runs repeat them; ``Side.row``, the
figures as the table reports them.  And ``raw_videos``: the engine writes
videos as their raw frames while the table runs.

Does not own which sides there are, their order or the time budget
(``diffusion_gpu.py``), nor the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from omnix.bench.diffusion_cache import fidelity, generate_once, pixels
from omnix.pipelines.config import DiffusersArgs

#: seeds of the request alone and of the call of four, every run
SEED_ALONE = 1
SEEDS_FOUR = (11, 12, 13, 14)


@dataclass(frozen=True)
class Run:
    """One run of a side: steps a second alone and in the call of four,
    and the wall time of each."""

    steps_per_s: float | None
    steps_per_s_c4: float | None
    c1_s: float
    c4_s: float


class Side:
    """One engine of the table and what it measured."""

    def __init__(self, label: str, args: DiffusersArgs, params: Any) -> None:
        self.label = label
        self.args = args
        self.params = params
        self.engine: Any = None
        self.runs: list[Run] = []
        self.outputs: dict[int, np.ndarray] = {}
        self.worst: list[tuple[float, int]] = []
        self.repeats_equal = True
        #: every call of four ran as one pipeline call
        self.batched = True
        self.start_s = 0.0
        self.warm_s = 0.0
        self.error = ""

    async def start(self) -> None:
        from omnix.engines.diffusers_engine import DiffusersEngine

        t0 = time.perf_counter()
        self.engine = DiffusersEngine(self.args)
        await self.engine.start()
        self.start_s = time.perf_counter() - t0

    async def close(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            await engine.close()

    async def _one(self, seed: int) -> tuple[bytes, list[float]]:
        data, stamps = await generate_once(self.engine, seed, self.params)
        if not data:
            raise RuntimeError(f"seed {seed}: the engine gave no file")
        return data, stamps

    async def _four(self) -> tuple[list[bytes], list[float], float]:
        t0 = time.perf_counter()
        got = await asyncio.gather(*(self._one(s) for s in SEEDS_FOUR), return_exceptions=True)
        took = time.perf_counter() - t0
        for g in got:  # every request ended before one's failure is raised
            if isinstance(g, BaseException):
                raise g
        done = [g for g in got if not isinstance(g, BaseException)]
        return [d[0] for d in done], done[0][1], took

    def _pixels(self, data: bytes) -> np.ndarray:
        return pixels(data, self.args.output_modality == "video").astype(np.uint8)

    async def warm(self, four: bool) -> None:
        t0 = time.perf_counter()
        await self._one(SEED_ALONE)
        if four:
            await self._four()
        self.warm_s = time.perf_counter() - t0

    async def run(self, reference: Side | None) -> Run:
        """One run: the request alone, then the call of four."""
        t0 = time.perf_counter()
        alone, stamps = await self._one(SEED_ALONE)
        c1_s = time.perf_counter() - t0
        fours, stamps4, c4_s = await self._four()
        calls = self.engine.batcher.calls
        self.batched &= bool(calls) and calls[-1] == len(SEEDS_FOUR)
        # Decoded after the clocks stopped: reading the files is the bench's.
        files = zip((SEED_ALONE, *SEEDS_FOUR), [alone, *fours], strict=True)
        outs = {seed: self._pixels(data) for seed, data in files}
        if not self.runs:
            self.outputs = outs
            if reference is not None:
                self.worst = [_fidelity(outs[s], reference.outputs[s]) for s in outs]
        else:
            self.repeats_equal &= all(np.array_equal(outs[s], self.outputs[s]) for s in outs)
        done = Run(rate(stamps), rate(stamps4), c1_s, c4_s)
        self.runs.append(done)
        return done

    def row(self, per: float, unit: str, off: Side | None) -> dict[str, Any]:
        if self.error and not self.runs:
            return {"error": self.error}
        runs = self.runs
        out: dict[str, Any] = {}
        for key, values in (
            ("steps_per_s", [r.steps_per_s for r in runs if r.steps_per_s is not None]),
            ("steps_per_s_c4", [r.steps_per_s_c4 for r in runs if r.steps_per_s_c4 is not None]),
        ):
            out[key] = round(statistics.median(values), 2) if values else None
            out[f"{key}_min"] = round(min(values), 2) if values else None
        for c, rates in (
            ("c1", [per / r.c1_s for r in runs]),
            ("c4", [len(SEEDS_FOUR) * per / r.c4_s for r in runs]),
        ):
            out[f"{unit}_{c}"] = round(statistics.median(rates), 3)
            out[f"{unit}_{c}_min"] = round(min(rates), 3)
        if off is not None and off.runs:
            ref = off.row(per, unit, None)
            for key, speedup in (
                ("steps_per_s", "speedup_steps"),
                ("steps_per_s_c4", "speedup_steps_c4"),
            ):
                a, b = out[key], ref[key]
                out[speedup] = round(a / b, 2) if a and b else None
            if self.worst:
                psnr = min(p for p, _ in self.worst)
                out["psnr_db_min"] = None if psnr == math.inf else round(psnr, 1)
                out["max_pixel_diff"] = max(d for _, d in self.worst)
        elif self.outputs:
            # Random weights can decode to a flat image: say how far from one.
            out["pixel_std"] = round(float(self.outputs[SEED_ALONE].std()), 1)
        out["repeats_equal"] = self.repeats_equal
        out["batched_c4"] = self.batched
        out["runs"] = len(runs)
        out["start_s"] = round(self.start_s, 1)
        out["warm_s"] = round(self.warm_s, 1)
        if self.error:
            out["error"] = self.error
        return out


def _fidelity(got: np.ndarray, want: np.ndarray) -> tuple[float, int]:
    return fidelity(got.astype(np.int32), want.astype(np.int32))


def rate(stamps: list[float]) -> float | None:
    """Steps a second from progress stamps: from the third on where there
    are eight or more (see the module doc), else from the first."""
    s = stamps[2:] if len(stamps) >= 8 else stamps
    return (len(s) - 1) / (s[-1] - s[0]) if len(s) > 1 and s[-1] > s[0] else None


@contextlib.contextmanager
def raw_videos() -> Iterator[None]:
    """The engine writes a video as its raw frames (``.npy``) instead of an
    MP4: GPU machines without PyAV run the bench, and the fidelity figures
    are then the pipeline's own pixels.  Images stay PNG."""
    from omnix.engines import diffusers_jobs

    def npy(frames: np.ndarray, fps: int) -> bytes:
        buf = io.BytesIO()
        np.save(buf, frames)
        return buf.getvalue()

    encode = diffusers_jobs.encode_mp4
    diffusers_jobs.encode_mp4 = npy
    try:
        yield
    finally:
        diffusers_jobs.encode_mp4 = encode
