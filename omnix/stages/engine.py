"""The engine protocol every stage implementation speaks.

Owns: ``Engine`` (start, generate with streaming input and output, abort,
close), ``ProfilingEngine`` (what an engine that profiles its own
processes adds) and ``load_engine``, which builds the class a pipeline's engine kind
names.  Does not own the values that cross it (``omnix.transport.work``),
the registry of kinds (``omnix.pipelines.engines``), processes or sockets
(``worker.py``, ``omnix.transport``) nor any model code
(``omnix.engines``).

A stage execution is one ``generate`` call.  Its input arrives as a stream
of pieces (async chunk: the talker starts on the first sentence of the
thinker's text); the engine yields outputs as it produces them.  ``abort``
may be called at any time from another task; after it the engine must stop
producing outputs for that request promptly (vLLM: ``AsyncLLM.abort``;
diffusers: checked between steps).
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from omnix.pipelines.engines import ENGINE_CLASSES
from omnix.transport.work import EngineInfo, EngineOutput, GenerateRequest, InputPiece


class EngineDead(RuntimeError):
    """Raised by ``generate`` when the engine itself is gone (vLLM's engine
    core process died), not only this request: every later request would
    fail the same way, so the worker exits and its runtime starts a new one
    (the requests it ran continue elsewhere, as for any lost replica)."""


@runtime_checkable
class Engine(Protocol):
    """What a worker drives.  One instance per worker process."""

    async def start(self) -> EngineInfo:
        """Load the model; return once ready to generate."""
        ...

    def generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        """Consume input pieces as they come, yield outputs as produced.

        ``inputs`` ends when the stage's input is closed.  Raising fails the
        request on this stage (the worker reports StageFailed) but never the
        worker.  A ``ValueError`` says the request's own input is refused:
        the request fails at once; anything else may continue on another
        replica as the stage's ``retries`` allow.
        """
        ...

    async def abort(self, request_id: str) -> None:
        """Stop work for ``request_id`` now; idempotent, unknown ids ignored."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class ProfilingEngine(Protocol):
    """An engine with a profiler of its own (vLLM's: the engine core and
    the worker's process both); the worker then runs no profiler of its
    own (``omnix.stages.profiler``): two torch profilers in one process do
    not mix."""

    def prepare_profiling(self, directory: Path) -> None:
        """Before ``start``: traces will go under ``directory``."""
        ...

    async def start_profile(self) -> None: ...

    async def stop_profile(self) -> None: ...


def load_engine(kind: str, args: Any) -> Engine:
    """Build the engine for a config's engine kind (imports lazily: a worker
    for a codec stage never imports vLLM)."""
    try:
        target = ENGINE_CLASSES[kind]
    except KeyError:
        raise ValueError(
            f"unknown engine kind {kind!r}; known kinds: {', '.join(ENGINE_CLASSES)}"
        ) from None
    module, _, name = target.partition(":")
    cls = getattr(importlib.import_module(module), name)
    engine: Engine = cls(args)
    return engine
