"""The values that cross between the orchestrator, the transport and an engine.

Owns: ``WorkItem`` (one input piece, or several, for one request on one
stage replica, as the orchestrator derives it from a ``Routed`` event) and
the engine's value types (``InputPiece``, ``EngineOutput``, ``EngineInfo``,
``GenerateRequest``).  They live on the transport's floor because all three
layers above speak them: the orchestrator builds work items, the transport
frames them, workers and engines consume them.  Does not own how they travel
(``codec.py``, ``messages.py``), the engine protocol (``omnix.stages.engine``)
nor what runs them (``omnix.stages.worker``).

``seq == 0`` starts the stage for the request (it takes one of the
replica's credits); later items stream more input into the running
``generate`` call (async chunk); ``last`` closes the input.  ``params`` are
already merged (stage defaults + request overrides): the worker does no
merging of its own.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from omnix.events.types import ChatMessage, Modality, StageParams, TokenLogprob, ToolCallDelta


class InputPiece(msgspec.Struct, frozen=True):
    """One piece of a stage's input.

    Source stages get the request's ``prompt``/``messages``; downstream
    stages get upstream output: ``text`` and/or ``token_ids`` (text or codec
    codes), or an ``array`` (audio, images, hidden states).  ``media`` are
    the decoded arrays of the messages' media parts (``MediaPart``), in
    message and part order; they travel as zero-copy frames.
    """

    text: str = ""
    token_ids: tuple[int, ...] = ()
    messages: tuple[ChatMessage, ...] = ()
    array: np.ndarray | None = None
    modality: Modality = "text"
    media: tuple[np.ndarray, ...] = ()
    #: a source piece that is a raw completion prompt (``RequestSpec.raw_prompt``):
    #: ``text`` (or ``token_ids``, when given) as is, whatever the stage's
    #: ``input_mode`` (no chat template)
    raw: bool = False


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
    #: the input piece whose generation produced this output (0 for the
    #: first piece the engine was fed); recorded on its chunk, so that a
    #: continuation knows how the delivered outputs split over the pieces
    piece: int = 0
    #: per token of ``token_ids``, when the request asked for logprobs
    #: (recorded as ``Chunk.logprobs``)
    logprobs: tuple[TokenLogprob, ...] = ()
    #: a text stage's parsed output (``Chunk.reasoning``, ``Chunk.tool_calls``)
    reasoning: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    #: a progress output's partial image (an encoded file of type
    #: ``media_type``), recorded as its ``Progress`` event's blob
    preview: bytes = b""

    @property
    def has_payload(self) -> bool:
        """It is a chunk (text, ids, bytes or an array), not progress or
        payload-free finish metadata."""
        return (
            bool(self.text or self.token_ids or self.data or self.reasoning or self.tool_calls)
            or self.array is not None
        )

    @property
    def is_progress(self) -> bool:
        return self.total > 0 and not self.has_payload


class EngineInfo(msgspec.Struct, frozen=True):
    """What a started engine says of itself: its kind, how many requests
    it runs at once, where, which model, and ``settings``: its engine's
    own configuration as it resolved it (a vLLM stage's engine arguments
    read back from vLLM's config), plain values by name."""

    engine: str
    capacity: int
    device: str = "cpu"
    model: str = ""
    settings: dict[str, Any] = {}


class PieceOutput(msgspec.Struct, frozen=True, array_like=True):
    """What one input piece's generation had delivered before a stage
    execution moved: its ``chunks``, the ``token_ids`` count and the
    ``text`` length (characters) of those chunks."""

    chunks: int = 0
    token_ids: int = 0
    text: int = 0


class Resume(msgspec.Struct, frozen=True, array_like=True):
    """Where a continuation picks up: a stage execution migrated to another
    replica after ``chunks`` outputs (chunk indices ``0..chunks-1``) were
    already delivered and logged.

    The engine gets every input piece again and must produce only what
    follows, so that the outputs before and after the move concatenate to
    an undisturbed run's: an autoregressive engine continues from its
    prompt plus ``token_ids`` (every token id the stage emitted, in order)
    with the rest of its token budget; a deterministic decoder re-decodes
    and drops the first ``samples`` samples it emitted; the scripted engine
    skips its first ``chunks`` outputs.  The worker numbers the
    continuation's chunks from ``chunks`` on.

    ``pieces`` splits the delivered outputs over the input pieces that
    produced them (``EngineOutput.piece``, recorded as ``Chunk.piece``):
    entry ``i`` is piece ``i``'s share of ``token_ids`` and ``text``, in
    order, up to the last piece that delivered anything.  Every piece
    before that one had finished; that one may have been cut.  An engine
    that runs each piece as a request of its own (vLLM's talker) skips the
    finished pieces and continues the last from its share.  ``()``: the
    producer did not split them (all from the first piece)."""

    chunks: int
    token_ids: tuple[int, ...] = ()
    samples: int = 0
    text: str = ""
    pieces: tuple[PieceOutput, ...] = ()
    #: the first execution's seed (the request's): an engine that continues
    #: by replaying its inputs from the start (a full-duplex session) draws
    #: with it what the first execution drew
    seed: int = 0


class GenerateRequest(msgspec.Struct, frozen=True):
    request_id: str
    stage: str
    params: StageParams
    seed: int = 0
    #: set on a migrated stage execution (see ``Resume``)
    resume: Resume | None = None
    #: see ``WorkItem.feeds``
    feeds: bool = False
    #: see ``WorkItem.input_streams``
    input_streams: bool = False


class WorkItem(msgspec.Struct, frozen=True, array_like=True):
    request_id: str
    stage: str
    replica: int
    seq: int
    last: bool
    pieces: tuple[InputPiece, ...]
    params: StageParams = StageParams()
    seed: int = 0
    #: set on the first piece (``seq == 0``) of a migrated stage execution
    resume: Resume | None = None
    #: the stage's output goes on to another stage of this request (a
    #: thinker whose talker runs sends it its context only then)
    feeds: bool = False
    #: the request's input streams (``RequestSpec.input_streams``): a source
    #: stage gets more pieces after its first, whenever they came, so an
    #: engine that would take its whole input at once (Qwen3-TTS's talker)
    #: takes it as it comes instead, whatever the pieces' timing
    input_streams: bool = False
