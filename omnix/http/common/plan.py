"""Planning's common ground: what one HTTP call submits, and for which pipeline.

Owns: ``Plan`` (the requests one call submits, in choice order, and the
decoded media their specs reference), ``PlanContext`` (what every route's
planning needs to know about the served pipeline: its model name, output
stages, engines, audio rate; fresh ids and seeds), the request id a
client named (``CLIENT_REQUEST_ID``, set by ``body.generation`` for the
HTTP request being handled) and the ids and ``Group`` of a call that
submits several requests (``ID-0``, ``ID-1``...).

Does not own what any route makes of its body (each room's ``plan.py``),
the sampling parameters per stage (``sampling.py``) nor admission
(``core.submit``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path

import msgspec
import numpy as np

from omnix.engines.diffusers_model import DiffusionModel, describe_model
from omnix.events.options import DEFAULT_SAMPLE_RATE, Group
from omnix.events.types import BlobRef, MediaPart, Modality, RequestSpec
from omnix.http.core.errors import ApiError
from omnix.models.paths import resolve_model
from omnix.models.qwen3_omni_speech import read_speakers
from omnix.pipelines.config import (
    AudioEngineArgs,
    DiffusersArgs,
    DuplexArgs,
    PipelineConfig,
    Qwen3TTSTalkerArgs,
    TalkerArgs,
    engine_kind,
)
from omnix.pipelines.persona_card import PersonaCard, read_persona_card
from omnix.pipelines.plan import PipelineGraph
from omnix.pipelines.tts_card import TTSCard, read_tts_card

#: The request id the client named (``X-Request-Id``) for the HTTP request
#: being handled, "" when none.  A context variable, not a parameter, so
#: that every route's plan honours it: aiohttp runs each HTTP request in
#: its own task, which has its own context.
CLIENT_REQUEST_ID: ContextVar[str] = ContextVar("omnix_client_request_id", default="")

#: Decoded media parts of a body, by the JSON path of their part
#: (``messages[0].content[1]``); ``MediaPart.at`` is filled in by the plan.
Media = dict[str, MediaPart]


class DecodedBlob(msgspec.Struct, frozen=True):
    """A decoded media array and the reference its ``MediaPart`` holds."""

    ref: BlobRef
    array: np.ndarray


class Plan(msgspec.Struct, frozen=True):
    """The requests one HTTP call submits, in choice order, and the decoded
    media their specs reference (stored once the plan is validated, so a
    refused request leaves nothing in the blob store)."""

    specs: tuple[tuple[str, RequestSpec], ...]
    stream: bool = False
    blobs: tuple[DecodedBlob, ...] = ()

    @property
    def request_ids(self) -> tuple[str, ...]:
        return tuple(rid for rid, _ in self.specs)


class PlanContext:
    """What the adapters need to know about the served pipeline."""

    def __init__(
        self,
        pipeline: PipelineConfig,
        *,
        names: tuple[str, ...] = (),
        new_request_id: Callable[[], str],
        new_seed: Callable[[], int],
    ) -> None:
        self.pipeline = pipeline
        self.graph = PipelineGraph(pipeline)
        #: the names a request's ``model`` may give (vLLM's
        #: ``--served-model-name``); the first is the one reported
        self.names = names or (pipeline.name,)
        self.model = self.names[0]
        self._fresh_id = new_request_id
        self.new_seed = new_seed
        #: diffusers stages' models as their folders describe them (images)
        self._diffusion: dict[str, DiffusionModel] = {}
        self._voices: tuple[str, ...] | None = None
        self._tts: tuple[TTSCard | None] | None = None
        self._persona: PersonaCard | None = None

    def new_request_id(self) -> str:
        """The client's ``X-Request-Id`` (``CLIENT_REQUEST_ID``), else a fresh id."""
        return CLIENT_REQUEST_ID.get() or self._fresh_id()

    def seed(self, given: int | None) -> int:
        """The client's seed, else a fresh one: either way the log records it."""
        return given if given is not None else self.new_seed()

    def check_model(self, model: str) -> None:
        if model and model not in self.names:
            served = " or ".join(repr(n) for n in self.names)
            raise ApiError(
                404,
                f"The model {model!r} does not exist on this server: it serves {served} "
                "(see GET /v1/models). Pass that name, or omit model.",
                param="model",
                code="model_not_found",
            )

    def model_for(self, asked: str | None) -> str:
        """The name a response reports: the one the request gave, as vLLM
        answers, else the first served name."""
        return asked if asked and asked in self.names else self.model

    def output_stage(self, modality: Modality) -> str:
        return self.pipeline.outputs.get(modality, "")

    def source_stage(self, outputs: tuple[str, ...]) -> str:
        needed = self.graph.needed_stages(outputs)
        sources = self.graph.sources(needed)
        return sources[0] if sources else (needed[0] if needed else "")

    def media_stages(self, outputs: tuple[str, ...], modality: str) -> tuple[str, ...]:
        """Stages needed for ``modality`` but not for text: where voice and
        speed apply (talker and decoder of an omni pipeline)."""
        if modality not in self.pipeline.outputs:
            return ()
        media = self.graph.needed_stages((modality,))
        text = (
            set(self.graph.needed_stages(("text",))) if "text" in self.pipeline.outputs else set()
        )
        return tuple(n for n in media if n not in text) or media

    def sample_rate(self) -> int:
        stage = self.output_stage("audio")
        if stage:
            args = self.pipeline.stage(stage).engine
            if isinstance(args, AudioEngineArgs):
                return args.sample_rate
        return DEFAULT_SAMPLE_RATE

    def voices(self) -> tuple[str, ...]:
        """The voices the pipeline's talker knows (its checkpoint's
        speakers; the first is ``default``), () when none says (a stand-in
        talker or none at all: any voice is then taken and ignored)."""
        if self._voices is None:
            found: tuple[str, ...] = ()
            card = self.tts_card()
            talkers = [
                st.engine for st in self.pipeline.stages if isinstance(st.engine, TalkerArgs)
            ]
            if card is not None:
                found = card.speakers
            elif talkers:
                found = read_speakers(resolve_model(talkers[0].model))
            self._voices = found
        return self._voices

    def tts_card(self) -> TTSCard | None:
        """What the pipeline's Qwen3-TTS talker's checkpoint can do (read
        once); None when it has no such talker."""
        if self._tts is None:
            folder = self.tts_folder()
            self._tts = (None if folder is None else read_tts_card(folder),)
        return self._tts[0]

    def tts_folder(self) -> Path | None:
        """The folder of the pipeline's Qwen3-TTS talker's checkpoint; None
        when it has no such talker."""
        for st in self.pipeline.stages:
            if isinstance(st.engine, Qwen3TTSTalkerArgs):
                return resolve_model(st.engine.model)
        return None

    def persona(self) -> PersonaCard:
        """The persona the pipeline's full-duplex stage's checkpoint takes
        (read once; an empty card when it takes none or has no such stage)."""
        if self._persona is None:
            card = PersonaCard()
            for st in self.pipeline.stages:
                if isinstance(st.engine, DuplexArgs):
                    card = read_persona_card(resolve_model(st.engine.model))
                    break
            self._persona = card
        return self._persona

    def check_voice(self, voice: str, param: str) -> None:
        """A 400 naming the known voices when ``voice`` is not one of them."""
        known = self.voices()
        if known and voice != "default" and voice.lower() not in known:
            raise ApiError(
                400,
                f"Unknown voice {voice!r}: this model speaks with {', '.join(known)} "
                "(or 'default', the first); see GET /v1/audio/voices.",
                param=param,
                code="invalid_value",
            )

    def engine_of(self, stage: str) -> str:
        """The kind of the stage's engine (``"vllm"``, ``"scripted"``...)."""
        for st in self.pipeline.stages:
            if st.name == stage:
                return engine_kind(st.engine)
        return ""

    def diffusion_model(self, stage: str) -> DiffusionModel | None:
        """The diffusers stage's model, as its folder describes it (cached
        once read; None while the folder is not there)."""
        got = self._diffusion.get(stage)
        if got is None:
            args = self.pipeline.stage(stage).engine
            if isinstance(args, DiffusersArgs):
                got = describe_model(args)
                if got is not None:
                    self._diffusion[stage] = got
        return got


def group_ids(served: PlanContext, n: int) -> tuple[str, list[str]]:
    """The id of a call that submits ``n`` requests, and theirs: the id
    itself for one, ``ID-0``, ``ID-1``... for more."""
    gid = served.new_request_id()
    return gid, [gid] if n == 1 else [f"{gid}-{i}" for i in range(n)]


def member(
    gid: str, i: int, n: int, *, samples: bool = False, streamed: bool = False
) -> Group | None:
    """Member ``i`` of the ``n`` requests of call ``gid`` (None when alone)."""
    if n == 1:
        return None
    return Group(id=gid, index=i, size=n, samples=samples, streamed=streamed)
