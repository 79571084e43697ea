"""The engine protocol every stage implementation speaks.

Owns: ``Engine`` (start, generate with streaming input and output, abort,
close), the values that cross it (``InputPiece``, ``EngineOutput``,
``EngineInfo``) and the registry that maps an engine kind from a pipeline
config to its class.  Does not own processes or sockets (``worker.py``,
``omnix.transport``) nor any model code (``omnix.engines``).

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
from typing import Any, Protocol, runtime_checkable

import msgspec
import numpy as np

from omnix.events.types import ChatMessage, Modality, StageParams


class InputPiece(msgspec.Struct, frozen=True):
    """One piece of a stage's input.

    Source stages get the request's ``prompt``/``messages``; downstream
    stages get upstream output: ``text`` and/or ``token_ids`` (text or codec
    codes), or an ``array`` (audio, images, hidden states).
    """

    text: str = ""
    token_ids: tuple[int, ...] = ()
    messages: tuple[ChatMessage, ...] = ()
    array: np.ndarray | None = None
    modality: Modality = "text"


class EngineOutput(msgspec.Struct):
    """One streamed output.  Exactly one of the payload fields is usually
    set.  ``progress`` outputs (``step``/``total`` > 0, no payload) report
    steps of long work; the worker turns them into Progress events.
    ``media_type`` tags opaque bytes (``image/png``)."""

    modality: Modality = "text"
    text: str = ""
    token_ids: tuple[int, ...] = ()
    array: np.ndarray | None = None
    data: bytes = b""
    media_type: str = ""
    step: int = 0
    total: int = 0
    # Reported once, on the last output of a request (or with finish_reason).
    prompt_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = ""

    @property
    def is_progress(self) -> bool:
        return self.total > 0 and not (self.text or self.token_ids or self.data) and self.array is None


class EngineInfo(msgspec.Struct, frozen=True):
    engine: str
    capacity: int
    device: str = "cpu"
    model: str = ""


class GenerateRequest(msgspec.Struct, frozen=True):
    request_id: str
    stage: str
    params: StageParams
    seed: int = 0


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
        worker.
        """
        ...

    async def abort(self, request_id: str) -> None:
        """Stop work for ``request_id`` now; idempotent, unknown ids ignored."""
        ...

    async def close(self) -> None:
        ...


_REGISTRY: dict[str, str] = {
    "scripted": "omnix.engines.scripted:ScriptedEngine",
    "vllm": "omnix.engines.vllm_engine:VllmEngine",
    "diffusers": "omnix.engines.diffusers_engine:DiffusersEngine",
    "codec": "omnix.engines.codec_engine:CodecEngine",
}


def engine_kinds() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def load_engine(kind: str, args: Any) -> Engine:
    """Build the engine for a config's engine kind (imports lazily: a worker
    for a codec stage never imports vLLM)."""
    try:
        target = _REGISTRY[kind]
    except KeyError:
        raise ValueError(
            f"unknown engine kind {kind!r}; known kinds: {', '.join(_REGISTRY)}"
        ) from None
    module, _, name = target.partition(":")
    cls = getattr(importlib.import_module(module), name)
    return cls(args)
