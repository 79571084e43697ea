"""What both parts of ``omnix bench engines`` send, and omnix's side of them.

Owns: the prompts and seeds every side shares (request ``i``: prompt
``PROMPTS[i % n]``, seed ``SEED0 + i``), ``Sample`` (one request as the
client saw it), ``OmnixSide`` (``Omni`` on real worker processes, and
where a request's time to first token went, from the log's stamps), the
heap frozen after start-up, and the bench's log line and median.  Does not
own either comparison (``engines_text``, ``engines_ttfp``).
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

import msgspec

from omnix.bench.cpu_meter import CpuMeter
from omnix.events.types import Admitted, Chunk, RequestSpec, StageParams, StageStarted

if TYPE_CHECKING:
    from omnix.stages.options import RuntimeOptions

# Varied lengths so prefill is not one shape; request i uses PROMPTS[i % n]
# and seed SEED0 + i on both sides.
PROMPTS = (
    "Tell me a story about a cat.",
    "What is the capital of France, and why?",
    "Write a haiku about the sea at night.",
    "Explain how a bicycle stays upright while it moves forward.",
    "List three colours.",
    "Summarise the plot of a detective novel in two sentences, without naming the detective.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes with the steps numbered.",
)
SEED0 = 1000


def say(msg: str) -> None:
    print(f"[bench engines] {msg}", file=sys.stderr, flush=True)


def p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


class Sample(msgspec.Struct):
    """One request as a client saw it (times in seconds, perf_counter)."""

    index: int
    ttft: float
    tokens: int
    ids: tuple[int, ...] = ()
    # omnix only: where the time to the first token went (ms), from log stamps
    to_started_ms: float = 0.0  # submit -> the worker's Started in the log
    to_chunk_ms: float = 0.0  # submit -> the first Chunk in the log
    ttfp: float = 0.0  # tiny-omni: submit -> first audio chunk
    rid: str = ""  # omnix only: the request id, for those stamps
    submit_ns: int = 0  # omnix only: the batch's start on the log's clock


class OmnixSide:
    """``Omni`` on a pipeline with real worker processes."""

    def __init__(self, name: str, pipeline: Any, runtime_options: RuntimeOptions) -> None:
        from omnix.api import Omni

        self.name = name
        self.omni = Omni(pipeline, runtime_options=runtime_options)
        self.meter: CpuMeter | None = None

    async def start(self) -> None:
        await self.omni.start()
        await self.omni.wait_ready()  # bounded by the caller (--start-timeout)

    async def close(self) -> None:
        await self.omni.shutdown(grace_s=2.0)

    def _rid(self) -> str | None:
        return None  # Omni picks one

    async def one(self, index: int, max_tokens: int, t0: float) -> Sample:
        spec = RequestSpec(
            prompt=PROMPTS[index % len(PROMPTS)],
            stage_params={"thinker": StageParams(max_tokens=max_tokens)},
            seed=SEED0 + index,
            api="bench",
        )
        return await self._run(index, spec, t0)

    async def one_omni(self, index: int, thinker_tokens: int, talker_tokens: int) -> Sample:
        spec = RequestSpec(
            prompt=PROMPTS[index % len(PROMPTS)],
            outputs=("text", "audio"),
            stage_params={
                "thinker": StageParams(max_tokens=thinker_tokens),
                "talker": StageParams(max_tokens=talker_tokens),
            },
            seed=SEED0 + index,
            api="bench",
        )
        # Cancelled at its first audio chunk: TTFP is measured by then, and
        # the rest (every thinker sentence spoken, up to talker_tokens codes
        # each) would only make the run long.
        return await self._run(index, spec, time.perf_counter(), stop_at_audio=True)

    async def _run(
        self, index: int, spec: RequestSpec, t0: float, stop_at_audio: bool = False
    ) -> Sample:
        from omnix.api import Overloaded

        omni = self.omni
        wall0 = time.time_ns() - int((time.perf_counter() - t0) * 1e9)
        ev = omni.submit(spec, self._rid())
        if not isinstance(ev, Admitted):
            raise Overloaded(ev)
        rid = ev.request_id
        first = first_audio = 0.0
        ids: list[int] = []
        async for out in omni.stream(rid):
            if out.modality == "text":
                if out.token_ids and not first:
                    first = time.perf_counter()
                ids.extend(out.token_ids)
            elif out.modality == "audio" and not first_audio:
                first_audio = time.perf_counter()
                if stop_at_audio:
                    omni.cancel(rid)
        rs = omni.state(rid)
        ok = ("finished", "cancelled") if stop_at_audio and first_audio else ("finished",)
        if rs is None or rs.status not in ok:
            status, reason = (rs.status, rs.reason) if rs is not None else ("?", "")
            raise RuntimeError(f"request {rid} ended {status}: {reason}")
        return Sample(
            index,
            first - t0,
            len(ids),
            tuple(ids),
            ttfp=first_audio - t0 if first_audio else 0.0,
            rid=rid,
            submit_ns=wall0,
        )

    def annotate(self, samples: list[Sample]) -> None:
        """Where each request's time to first token went (log stamps, this
        process's wall clock): its thinker's Started and first Chunk.  Read
        after the batch's wall time is taken: walking ~50 events a request
        at the batch's end cost omnix ~2 ms of every c=32 batch's wall."""
        for s in samples:
            started = chunk = 0
            for e in self.omni.log.events_for(s.rid):
                if isinstance(e, StageStarted) and e.stage == "thinker" and not started:
                    started = e.ts_ns
                elif isinstance(e, Chunk) and e.stage == "thinker" and not chunk:
                    chunk = e.ts_ns
                    break
            s.to_started_ms = (started - s.submit_ns) / 1e6
            s.to_chunk_ms = (chunk - s.submit_ns) / 1e6


def freeze_startup_heap() -> None:
    """Take what the start-up left on the heap out of the collector's reach
    (``omnix.stages.worker.freeze_heap``).

    This process holds the direct side's ``AsyncLLM`` (torch, transformers,
    vLLM: ~600k objects) beside omnix's server, so an unfrozen full
    collection stopped it for ~300 ms, once or twice a run, in the middle
    of whichever side's batch it fell on.  vLLM's server and omnix's
    workers freeze after their load for the same reason; omnix's own server
    process holds no such heap (~30k objects, a full collection ~5 ms)."""
    from omnix.stages.worker import freeze_heap

    freeze_heap()
