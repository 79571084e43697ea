"""``omnix bench engines``' TTFP part: tiny-omni's first audio with async chunk on and off.

Owns: the pipeline with every edge forwarding only at its source's
finish (``unchunked``), one set of worker processes shared by two ``Omni``
(``SharedWorkers``, ``OmniVariant``), the rounds of sequential requests
per variant and their figures (``ttfp_phase``: TTFP and TTFT p50, the
target: forwarding at least halves TTFP), and the runtime's CPU
placement in a line (``describe_plan``).  Does not own the verb
(``engines``).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from omnix.bench.engines_sides import OmnixSide, Sample, freeze_startup_heap, p50, say
from omnix.events.types import Event, RequestEvent, Scaled

if TYPE_CHECKING:
    from omnix.stages.options import RuntimeOptions
    from omnix.stages.runtime import StageRuntime
    from omnix.transport.work import WorkItem

TTFP_CUT = 0.5


def unchunked(pipeline: Any) -> Any:
    """The same pipeline with every edge forwarding only at the source's finish."""
    return msgspec.structs.replace(
        pipeline,
        edges=tuple(msgspec.structs.replace(e, forward="finish") for e in pipeline.edges),
    )


class SharedWorkers:
    """One ``StageRuntime`` (one set of worker processes) under two ``Omni``
    instances that differ only in their edges.

    Both variants then run on the very same engine processes (no placement
    or warm-up difference between them) and start-up is paid once.  Worker
    events go to both logs (each orchestrator needs its ``WorkerJoined``);
    a request's events go to the ``Omni`` whose prefix its id carries.  The
    variants are measured one at a time, so neither orchestrator's view of
    a replica's load is ever wrong.
    """

    def __init__(self, pipeline: Any, options: RuntimeOptions) -> None:
        from omnix.events.blobs import MemoryBlobStore
        from omnix.stages.runtime import StageRuntime

        self.blobs = MemoryBlobStore()
        self._owners: dict[str, Callable[[Event], None]] = {}
        self.runtime = StageRuntime(pipeline, emit=self._emit, blobs=self.blobs, options=options)

    def attach(self, prefix: str, emit: Callable[[Event], None]) -> None:
        self._owners[prefix] = emit

    def detach(self, prefix: str) -> None:
        self._owners.pop(prefix, None)

    def _emit(self, ev: Event) -> None:
        if not isinstance(ev, RequestEvent):  # a worker's event: every log needs it
            for emit in self._owners.values():
                emit(ev)
            return
        owner = self._owners.get(ev.request_id.partition("-")[0])
        if owner is not None:
            owner(ev)

    async def shutdown(self) -> None:
        self._owners.clear()  # the logs are closed by now
        await self.runtime.shutdown()


class _RuntimeView:
    """The shared runtime as one ``Omni`` drives it: ``start`` and
    ``shutdown`` do nothing (``SharedWorkers`` starts and stops the workers
    once, for both variants)."""

    def __init__(self, runtime: StageRuntime) -> None:
        self._rt = runtime

    async def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass

    def send(self, work: WorkItem) -> None:
        self._rt.send(work)

    def abort(self, request_id: str, stage: str, replica: int) -> None:
        self._rt.abort(request_id, stage, replica)

    def release(self, request_id: str) -> None:
        self._rt.release(request_id)

    def scale(self, ev: Scaled) -> None:
        self._rt.scale(ev)


class OmniVariant(OmnixSide):
    """An ``Omni`` over ``SharedWorkers``; request ids start with ``name``."""

    def __init__(self, name: str, pipeline: Any, shared: SharedWorkers) -> None:
        from omnix.api import Omni

        self.name = name
        self.meter = None
        self.omni = Omni(
            pipeline,
            blobs=shared.blobs,
            runtime_factory=lambda p, e, b: _RuntimeView(shared.runtime),
        )
        self._shared = shared
        shared.attach(name, self.omni.sequencer.emit)
        self._n = 0

    async def close(self) -> None:
        try:
            await self.omni.shutdown(grace_s=2.0)
        finally:
            self._shared.detach(self.name)  # its log is closed

    def _rid(self) -> str:
        self._n += 1
        return f"{self.name}-{self._n}"


async def ttfp_phase(
    args: argparse.Namespace, pipeline: Any, options: RuntimeOptions
) -> dict[str, Any]:
    import dataclasses

    opts = options
    if args.talker_cpus:
        opts = dataclasses.replace(options, worker_cpus={"talker": args.talker_cpus})
    shared = SharedWorkers(pipeline, opts)
    plan = shared.runtime.cpu_plan
    # Created before the workers start, so both logs see them join.
    on = OmniVariant("chunked", pipeline, shared)
    off = OmniVariant("unchunked", unchunked(pipeline), shared)
    sides = [on, off]
    samples: dict[str, list[Sample]] = {"chunked": [], "unchunked": []}
    tt, ta = args.thinker_tokens, args.talker_tokens
    try:
        t0 = time.perf_counter()
        say("starting tiny-omni's workers (thinker, talker, code2wav) ...")
        await shared.runtime.start()
        for s in sides:
            await s.start()
        say(f"tiny-omni ready in {time.perf_counter() - t0:.1f} s")
        freeze_startup_heap()
        say("warming up both variants")
        for s in sides:
            await s.one_omni(900_000, tt, ta)
        rounds = min(4, max(1, args.ttfp_requests))
        per_round = max(1, args.ttfp_requests // rounds)
        say(f"TTFP: {rounds} rounds x {per_round} sequential requests per variant")
        for r in range(rounds):
            for s in sides if r % 2 == 0 else sides[::-1]:
                await asyncio.sleep(args.settle)
                for k in range(per_round):
                    samples[s.name].append(await s.one_omni(50_000 + r * per_round + k, tt, ta))
    finally:
        for s in sides:
            try:
                await s.close()
            except Exception as exc:
                say(f"closing {s.name} failed: {type(exc).__name__}: {exc}")
        await shared.shutdown()
    fig: dict[str, Any] = {}
    for name, ss in samples.items():
        fig[f"ttfp_ms_{name}"] = round(p50([s.ttfp * 1e3 for s in ss]), 1)
        fig[f"ttft_ms_{name}"] = round(p50([s.ttft * 1e3 for s in ss]), 1)
    fig["ttfp_cut"] = round(fig["ttfp_ms_chunked"] / fig["ttfp_ms_unchunked"], 3)
    fig["ttfp_ok"] = fig["ttfp_ms_chunked"] <= TTFP_CUT * fig["ttfp_ms_unchunked"]
    fig["ttfp_requests"] = len(samples["chunked"])
    fig["ttfp_thinker_tokens"] = tt
    fig["ttfp_talker_tokens"] = ta
    fig["talker_cpus"] = args.talker_cpus or "unpinned"
    fig["vllm_cpus"] = describe_plan(plan)
    return fig


def describe_plan(plan: Any) -> str:
    """The runtime's CPU placement in a line (docs/runtime.md)."""
    if plan is None:
        return "not placed"
    engines = ", ".join(f"{w} engine core on {c}" for w, c in plan.engines.items())
    return f"server and vLLM workers on {plan.frontend}; {engines}"
