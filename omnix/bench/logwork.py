"""The log benchmarks' workload and measuring tools (``omnix bench log``).

Owns: the realistic event mix (``request_lifecycle``: one thinker ->
talker -> code2wav request's 31 events; ``workload``: many in flight,
interleaved; ``batches``: pre-built so construction stays untimed),
``_Timer`` (wall and CPU seconds) and ``_machine`` (peak RSS and load
average, printed).  Shared by the memory and disk runs (``log.py``) and
the replicated log's (``lognats.py``); owns no figure.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator

from omnix.events.types import (
    Admitted,
    BlobRef,
    Chunk,
    Event,
    Finished,
    RequestSpec,
    Routed,
    StageFinished,
    StageStarted,
)

_SPEC = RequestSpec(
    prompt="Describe the sound of rain on a tin roof, then say it aloud.",
    outputs=("text", "audio"),
    seed=7,
    api="chat.completions",
    model="qwen3-omni",
)
_BLOB = BlobRef(digest="9f86d081884c7d659a2feaa0c55ad015", nbytes=19200, dtype="<f4", shape=(4800,))


def request_lifecycle(rid: str) -> Iterator[Event]:
    """The 31 events of one thinker -> talker -> code2wav request."""
    yield Admitted(request_id=rid, pipeline="qwen3-omni", spec=_SPEC)
    yield Routed(request_id=rid, stage="thinker", replica=0, seq=0, sources=(0,), last=True)
    yield StageStarted(request_id=rid, stage="thinker", replica=0)
    for i in range(8):
        yield Chunk(
            request_id=rid,
            stage="thinker",
            replica=0,
            index=i,
            modality="text",
            text=" word",
            token_ids=(1000 + i,),
        )
        if i == 2:  # async chunk: talker starts on the first sentence
            yield Routed(
                request_id=rid, stage="talker", replica=1, seq=0, sources=(3, 4, 5), last=False
            )
            yield StageStarted(request_id=rid, stage="talker", replica=1)
    yield StageFinished(
        request_id=rid, stage="thinker", replica=0, chunks=8, prompt_tokens=14, output_tokens=8
    )
    yield Routed(request_id=rid, stage="talker", replica=1, seq=1, sources=(6, 7, 8), last=True)
    for i in range(6):
        yield Chunk(
            request_id=rid,
            stage="talker",
            replica=1,
            index=i,
            modality="codec",
            token_ids=(11, 12, 13, 14, 15, 16, 17, 18),
        )
    yield StageFinished(request_id=rid, stage="talker", replica=1, chunks=6, output_tokens=48)
    yield Routed(request_id=rid, stage="code2wav", replica=0, seq=0, sources=(20,), last=True)
    yield StageStarted(request_id=rid, stage="code2wav", replica=0)
    for i in range(4):
        yield Chunk(
            request_id=rid, stage="code2wav", replica=0, index=i, modality="audio", blob=_BLOB
        )
    yield StageFinished(request_id=rid, stage="code2wav", replica=0, chunks=4)
    yield Finished(request_id=rid)


def workload(n_events: int, concurrency: int) -> Iterator[Event]:
    """``n_events`` events of many requests in flight, interleaved round-robin."""
    flights: list[Iterator[Event]] = []
    made = 0
    started = 0
    while made < n_events:
        while len(flights) < concurrency:
            flights.append(request_lifecycle(f"req-{started:09d}"))
            started += 1
        alive = []
        for life in flights:
            ev = next(life, None)
            if ev is None:
                continue
            alive.append(life)
            yield ev
            made += 1
            if made == n_events:
                return
        flights = alive


def batches(n_events: int, concurrency: int, size: int = 20_000) -> Iterator[list[Event]]:
    """The workload in pre-built batches, so construction stays untimed and
    memory stays bounded."""
    batch: list[Event] = []
    for ev in workload(n_events, concurrency):
        batch.append(ev)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class _Timer:
    """Wall and CPU seconds of the timed sections (CPU: this process, all
    threads; on a machine shared with other work it shows what the code
    costs when wall time is inflated by waiting for a core)."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def __enter__(self) -> _Timer:
        self._w = time.perf_counter()
        self._c = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall += time.perf_counter() - self._w
        self.cpu += time.process_time() - self._c


def _machine() -> tuple[float, float]:
    """Peak RSS (MB) and the 1-minute load average, printed."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"  peak RSS                      {rss:12.0f} MB")
    load = os.getloadavg()[0]
    print(
        f"  load average (1 min)          {load:12.2f}  on {os.cpu_count()} CPUs "
        "(other processes' load lowers every rate above)"
    )
    return rss, load
