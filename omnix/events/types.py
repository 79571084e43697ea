"""The event vocabulary: every request and worker transition omnix records.

Owns: the immutable msgspec Structs that make up the log, the one tagged
union ``Event`` and the small value types they embed (request specs, blob
references, sampling parameters).  Does not own encoding (``codec.py``),
folding (``reducer.py``) or storage (``log.py``, ``disklog.py``).

Schema rules (the log is forever):
  * Every event is ``frozen=True, array_like=True``: encoded as a msgpack
    array ``[tag, field, field, ...]`` in declaration order.  A type can only
    grow by appending fields *with defaults* at the end; never reorder,
    rename a tag or remove a field.  ``SCHEMA_VERSION`` is bumped whenever a
    field is appended so readers know what they are looking at.
  * ``pos`` is assigned by the log (``-1`` before append); ``ts_ns`` is the
    injected clock's reading in Unix nanoseconds (``0`` means "stamp on
    append").  Decisions carry the timestamp of the event that caused them,
    so replay on a virtual clock reproduces them byte for byte.
  * ``cause`` is the log position of the event that led to this one
    (``-1`` when it came from outside: a client, a worker, a timer).

Events are either *inputs* (facts from outside the orchestrator: a client
asked, a worker produced, a timer expired) or *decisions* (what the
orchestrator appended in reaction).  ``DECISION_TYPES`` lists the latter;
replay re-derives decisions from inputs and compares.
"""

from __future__ import annotations

from typing import Final, Literal, TypeGuard, Union, final, get_args

import msgspec

from omnix.events.options import RawPrompt, ResponseOptions, from_legacy
from omnix.events.sessions import SessionItem, SessionOp, SessionSettings

SCHEMA_VERSION = 15  # 2: Routed.resume, Chunk.piece; 3: ChatMessage.media; 4: Released;
# 5: StageParams vLLM/OpenAI sampling fields (penalties, logprobs, structured output...), Chunk.logprobs,
# StageParams negative_prompt / true_cfg_scale / output_format (diffusion);
# 6: RequestSpec.response and .raw_prompt, typed (options.py), in place of .options' strings;
# 7: media: image edits and video (MediaKind "mask" and "video", MediaPart.fps, Modality "video",
# StageParams strength / partial_images / num_frames / fps, Progress.blob (a partial image),
# ReleaseReason "deleted", ImageOptions.edit / .size, VideoOptions);
# RealtimeOptions (a /v1/realtime response), the cancel reason "interrupted",
# SessionChanged (a realtime session's settings and conversation items),
# RequestSpec.input_streams and InputAppended (a client's text into a running request);
# 8: Scaled (a stage's replica started, drained or gone after its drain);
# 9: StageFailed.retry (False: the engine refused the request's own input);
# 10: tool calls: ChatMessage.tool_calls / .tool_call_id, StageParams tools / tool_choice /
# parallel_tool_calls, Chunk.reasoning / .tool_calls (a text stage's parsed output);
# 11: StageParams instructions / language (a Qwen3-TTS talker's voice instruction and language)
# 12: realtime function calls: SessionSettings.tools / .tool_choice, SessionItem.type / .call_id /
# .name / .arguments / .output (a client's function_call and function_call_output items);
# 13: SessionSettings.parallel_tool_calls (a realtime session's)
# 14: full duplex: InputAppended.modality / .blob (a client's audio frame into a running
# request), DuplexOptions (a /v1/realtime?duplex=1 session);
# 15: MediaKind "speaker" (a Qwen3-TTS Base voice's speaker vector beside its reference audio)

Modality = Literal["text", "audio", "image", "codec", "hidden", "video"]
"""What a chunk carries.  ``codec`` (talker codes) and ``hidden`` (a
thinker's context for its talker: prompt ids, hidden states, media grids)
are intermediates no client sees; ``video`` (schema v7) an encoded video
file."""
OutputModality = Literal["text", "audio", "image", "codec", "video"]
"""What a stage's engine outputs (a ``hidden`` context comes beside it)."""

CancelReason = Literal["client", "disconnect", "deadline", "shutdown", "interrupted"]
"""Who stopped a request; ``interrupted`` (schema v7): a realtime
session's user spoke over its response (server VAD)."""
FailReason = Literal[
    "stage_lost",
    "stage_error",
    "stage_timeout",
    "no_replica",
    "shutdown",
    "not_resumed",
]
RejectReason = Literal["overloaded", "not_ready", "shutting_down"]
ReleaseReason = Literal["time", "count", "bytes", "deleted"]
"""Which retention bound released ended requests (``omnix.events.retention``),
or ``deleted`` (schema v7): a client deleted them (``DELETE /v1/videos/{id}``)."""
ScaleOp = Literal["start", "drain", "left"]
"""What a ``Scaled`` event (schema v8) does to a replica: ``start`` it,
``drain`` it (it takes no new work), or record that a drained replica
``left`` (its requests done, its worker stopped)."""
ScaleReason = Literal["queue", "idle", "admin", "drained", "restart"]
"""Why: the stage's queue stayed up, it stayed idle with a replica to
spare, an admin set the count (``POST /admin/stages/{name}/replicas``),
a drained replica's work was done (``left``), or a restarted server
went back to the stage's ``min``."""
MediaKind = Literal["audio", "image", "mask", "video", "speaker"]
"""What a message's media part holds (decoded at admission).  ``mask``
(schema v7): an image edit's mask, the weight to repaint each pixel with
(uint8, 255 = repaint); ``video`` (schema v7): an encoded video file;
``speaker`` (schema v15): a Qwen3-TTS Base voice's speaker vector (float32,
shape ``(dim,)``), what the speaker encoder made of the message's audio
part, so the talker clones with the vector the request was admitted with
(and a trace holds it) instead of encoding the clip again."""


# --------------------------------------------------------------------------
# Embedded value types
# --------------------------------------------------------------------------


class BlobRef(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A content-addressed payload stored beside the log.

    ``digest`` is the hex blake2b-128 of the bytes; ``dtype``/``shape``
    describe an array payload (``dtype == "bytes"`` and ``shape == ()`` for
    opaque bytes such as a PNG, whose ``media_type`` says what it is).
    """

    digest: str
    nbytes: int
    dtype: str = "bytes"
    shape: tuple[int, ...] = ()
    media_type: str = ""


class MediaPart(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A decoded audio clip, image, mask, video or speaker vector in a message.

    ``blob`` holds the decoded array, as the admission decoded it once:
    audio as float32 mono samples at ``rate`` Hz (shape ``(n,)``), an image
    as uint8 RGB (shape ``(height, width, 3)``), a mask as uint8 repaint
    weights (shape ``(height, width)``, 255 = repaint), a video as its
    encoded file (uint8 bytes, shape ``(n,)``: the engine decodes it,
    sampling ``fps`` frames a second, at most ``frames``), a speaker vector
    as float32 (shape ``(dim,)``).  ``in_video``: an audio part that is the
    sound track of the video part before it (the model hears it with the
    video: Qwen3-Omni's ``use_audio_in_video``).
    ``at`` is the character offset in the message's ``content`` where the
    part stood among the text parts, so the engine's prompt keeps the
    client's order.
    """

    kind: MediaKind
    blob: BlobRef
    at: int = 0
    rate: int = 0
    fps: float = 0.0  # schema v7: a video's sampling rate for the model
    frames: int = 0  # schema v7: the most frames sampled from a video (0: no cap)
    in_video: bool = False  # schema v7: a video's sound track


class ToolCall(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A function call an assistant made (schema v10): its id, the
    function's name, the arguments as the JSON text the model wrote."""

    id: str
    name: str
    arguments: str


class ChatMessage(msgspec.Struct, frozen=True, array_like=True, gc=False):
    role: str
    content: str
    media: tuple[MediaPart, ...] = ()  # schema v3
    #: schema v10: an assistant message's function calls, and the call a
    #: ``tool`` message answers
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""


class StageParams(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """Sampling / generation parameters for one stage.

    Every field is optional: ``None`` means "use the stage's default".  The
    pipeline config supplies defaults; a request may override per stage
    (vLLM-Omni's ``sampling_params_list``).  Encoded as a map (not an array)
    because it is also the user-facing shape in configs and HTTP bodies.
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    # diffusion
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    width: int | None = None
    height: int | None = None
    # speech
    voice: str | None = None
    speed: float | None = None
    # schema v5: vLLM's and OpenAI's sampling extras (vLLM stages; see
    # docs/http.md "Sampling parameters").  ``logprobs`` is the number of
    # alternatives per token (0: the sampled token's only); ``json_schema``
    # the schema as JSON text; ``json_object`` any JSON object.
    min_tokens: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    stop_token_ids: tuple[int, ...] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    ignore_eos: bool | None = None
    logit_bias: dict[int, float] | None = None
    logprobs: int | None = None
    json_schema: str | None = None
    json_object: bool | None = None
    # schema v5, diffusion (docs/http.md "Images"): the negative prompt, the
    # true classifier-free guidance scale it needs on pipelines with true
    # CFG (FluxPipeline), and the image file's format ("png" | "jpeg" |
    # "webp"; None: PNG), which the engine encodes.
    negative_prompt: str | None = None
    true_cfg_scale: float | None = None
    output_format: str | None = None
    # schema v7, diffusion (docs/http.md "Image edits", "Videos"): how much
    # of an edited image is repainted (image-to-image, inpaint: the
    # pipeline's ``strength``), partial images to stream (previews at that
    # many denoising checkpoints), and a video's frame count and rate.
    strength: float | None = None
    partial_images: int | None = None
    num_frames: int | None = None
    fps: int | None = None
    # schema v10, a text stage's tool calls (docs/http.md "Tool calls"): the
    # request's tools as OpenAI's JSON array, ``tool_choice`` as JSON
    # ("auto", "none", "required" or a named function's object), whether
    # several calls may come in one answer.
    tools: str | None = None
    tool_choice: str | None = None
    parallel_tool_calls: bool | None = None
    # schema v11, speech (docs/http.md "Speech"): how to say it (a Qwen3-TTS
    # CustomVoice instruction, or VoiceDesign's description of the voice)
    # and the language spoken ("auto" or one of the checkpoint's).
    instructions: str | None = None
    language: str | None = None


class ToolCallDelta(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A piece of a function call as a text stage's tool-call parser read it
    from the model's output (schema v10), as OpenAI streams it: the call's
    ``index`` in the answer; ``id`` and ``name`` on its first piece only;
    then the arguments' JSON text, piece by piece."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One generated token's log probability (schema v5), as the engine
    reported it: the token's text, its logprob, and the ``top`` most
    likely alternatives at that step as (token text, logprob) pairs, most
    likely first.  Encoded as ``[token, logprob, [[token, logprob], ...]]``."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


class RequestSpec(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Everything a client asked for, as recorded at admission.

    ``seed`` is chosen before admission (by the client or the API layer) so
    randomness enters the log as data.  ``outputs`` names the modalities the
    client wants; the orchestrator runs only the stages needed for them.
    ``deadline_ms`` is relative to the admission timestamp (0: none).
    ``response`` records how the client asked to receive the response (per
    API: ``stream``, ``include_usage``, ``audio_format``...), so the bytes
    it was sent can be regenerated from the log alone; ``raw_prompt`` that
    the prompt goes to the source stage as is (``/v1/completions``).

    ``options`` is the form schema v5 and older recorded both in: strings
    under keys.  A spec that holds it and neither typed field is read into
    them (``options.from_legacy``) as it is built or decoded, so readers
    only ever see the typed form; the strings stay as recorded (the event
    still encodes to what the log holds).  New specs leave it empty.
    """

    prompt: str = ""
    messages: tuple[ChatMessage, ...] = ()
    outputs: tuple[Modality, ...] = ("text",)
    stage_params: dict[str, StageParams] = {}
    seed: int = 0
    deadline_ms: int = 0
    api: str = ""
    model: str = ""
    traceparent: str = ""
    options: dict[str, str] = {}
    response: ResponseOptions | None = None  # schema v6
    raw_prompt: RawPrompt | None = None  # schema v6
    #: schema v7: more input follows admission (``InputAppended``), its
    #: source stages' input stays open until a piece says it is the last
    input_streams: bool = False

    def __post_init__(self) -> None:
        # Only a spec of the old form pays: new specs have no ``options``.
        if self.options and self.response is None and self.raw_prompt is None:
            response, raw = from_legacy(self.api, self.options)
            msgspec.structs.force_setattr(self, "response", response)
            msgspec.structs.force_setattr(self, "raw_prompt", raw)


# --------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------


class _Base(
    msgspec.Struct,
    frozen=True,
    array_like=True,
    gc=False,
    kw_only=True,
    tag_field="type",
):
    pos: int = -1
    ts_ns: int = 0


class RequestEvent(_Base, frozen=True, kw_only=True):
    request_id: str


class WorkerEvent(_Base, frozen=True, kw_only=True):
    worker_id: str
    stage: str
    replica: int


# Each event type below is ``@final``: the union is closed (a subclass would
# not decode), and it lets the checker narrow ``type(ev) is X`` in both
# branches.  Hot paths dispatch with ``type(ev) is X`` rather than
# ``isinstance``, which costs ~150 ns against a Struct class (the call goes
# through the metaclass's ``__instancecheck__``) where ``is`` costs ~10.


# -- request lifecycle ------------------------------------------------------


@final
class Admitted(RequestEvent, frozen=True, kw_only=True, tag="admitted"):
    """The request was accepted; its spec is now part of the log."""

    pipeline: str
    spec: RequestSpec


@final
class Rejected(RequestEvent, frozen=True, kw_only=True, tag="rejected"):
    """Admission was refused (overload, not ready).  Terminal, and the only
    event such a request ever has."""

    pipeline: str
    spec: RequestSpec
    reason: RejectReason
    message: str = ""


@final
class InputAppended(RequestEvent, frozen=True, kw_only=True, tag="input_appended"):
    """The client sent more input to a running request whose input streams
    (``RequestSpec.input_streams``; schema v7): ``text`` goes to its source
    stages as their next input piece, ``last`` closes their input.  An
    input, as ``Admitted`` is for the first piece.  Schema v14: a piece of
    ``modality`` ``audio`` is the array in ``blob`` (a full-duplex
    session's user frame: float32 mono PCM at the model's rate)."""

    text: str
    last: bool = False
    modality: Modality = "text"  # schema v14
    blob: BlobRef | None = None  # schema v14


@final
class Routed(RequestEvent, frozen=True, kw_only=True, tag="routed"):
    """Input piece ``seq`` for ``stage`` goes to ``replica``.

    ``seq == 0`` starts the stage; later pieces stream more input (async
    chunk).  ``sources`` are the positions of the upstream events whose
    payloads form this piece (the ``Admitted`` event for a source stage,
    ``Chunk`` events otherwise).  ``last`` closes the stage's input.

    A continuation (a stage moved to another replica after its replica was
    lost or it failed) starts again at ``seq == 0`` with ``resume = K``: the
    stage already delivered chunks ``0..K-1``, its input pieces are sent
    again, and its new replica's chunks continue at index ``K``.  ``resume``
    is 0 for a first execution and for a retry before any output.
    """

    stage: str
    replica: int
    seq: int
    sources: tuple[int, ...]
    last: bool
    cause: int = -1
    resume: int = 0  # schema v2


@final
class StageStarted(RequestEvent, frozen=True, kw_only=True, tag="stage_started"):
    """The worker began executing the request for this stage."""

    stage: str
    replica: int


@final
class Progress(RequestEvent, frozen=True, kw_only=True, tag="progress"):
    """Step ``step`` of ``total`` done (diffusion steps, decoder frames).
    ``blob``: a partial image decoded at this step (schema v7), when the
    request asked for partial images."""

    stage: str
    replica: int
    step: int
    total: int
    blob: BlobRef | None = None


@final
class Chunk(RequestEvent, frozen=True, kw_only=True, tag="chunk"):
    """A piece of stage output.  ``index`` counts from 0 per (request, stage)
    and must be contiguous.  Small payloads are inline (``text``,
    ``token_ids``); arrays and images are ``blob`` references.  ``piece``
    is the stage's input piece (counted from 0 in the order the engine was
    fed them) whose generation produced the chunk: how a continuation
    splits the delivered outputs over the pieces (``Resume.pieces``)."""

    stage: str
    replica: int
    index: int
    modality: Modality
    text: str = ""
    token_ids: tuple[int, ...] = ()
    blob: BlobRef | None = None
    piece: int = 0  # schema v2
    #: per generated token of this chunk, when the request asked for
    #: logprobs (text chunks only; schema v5)
    logprobs: tuple[TokenLogprob, ...] = ()
    #: schema v10: a text stage whose parsers split its output (tool calls,
    #: reasoning): ``text`` is the answer's part only, ``reasoning`` the
    #: reasoning's, ``tool_calls`` the calls' pieces (``token_ids`` stay all
    #: the chunk's tokens)
    reasoning: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()


@final
class StageFinished(RequestEvent, frozen=True, kw_only=True, tag="stage_finished"):
    """The stage is done with this request.  ``finish_reason`` is the
    engine's (``stop``, ``length``) or ``aborted`` when it acknowledges an
    abort."""

    stage: str
    replica: int
    chunks: int
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    output_tokens: int = 0


@final
class StageFailed(RequestEvent, frozen=True, kw_only=True, tag="stage_failed"):
    """The stage's engine raised for this request (the worker lives on).
    ``retry`` False (schema v9): it refused the request's own input (a
    ``ValueError``), which no other replica would take either: the request
    fails at once instead of continuing elsewhere."""

    stage: str
    replica: int
    message: str
    retry: bool = True


@final
class CancelRequested(RequestEvent, frozen=True, kw_only=True, tag="cancel_requested"):
    """Someone asked to stop the request: the client, its disconnect, the
    deadline, shutdown.  Aborts go to every active stage; ``Cancelled``
    follows once they acknowledge."""

    reason: CancelReason
    cause: int = -1


@final
class DeadlineExpired(RequestEvent, frozen=True, kw_only=True, tag="deadline_expired"):
    """A timer fired.  ``scope`` is ``"request"`` for the request deadline,
    ``"abort"`` for the wait for abort acknowledgements, ``"resume"`` when a
    restarted server found the request older than it resumes, or a stage
    name for that stage's timeout (no chunk within ``timeout_s``)."""

    scope: str


@final
class Cancelled(RequestEvent, frozen=True, kw_only=True, tag="cancelled"):
    """Terminal: the request was cancelled; ``cause`` is its CancelRequested."""

    reason: CancelReason
    cause: int = -1


@final
class Failed(RequestEvent, frozen=True, kw_only=True, tag="failed"):
    """Terminal: the request failed.  ``cause`` is the event that doomed it
    (a ``WorkerLost``, a ``StageFailed``, a ``DeadlineExpired``)."""

    reason: FailReason
    message: str = ""
    stage: str = ""
    cause: int = -1


@final
class Finished(RequestEvent, frozen=True, kw_only=True, tag="finished"):
    """Terminal: every needed stage finished; ``cause`` is the last one."""

    cause: int = -1


# -- workers ------------------------------------------------------------------


@final
class WorkerJoined(WorkerEvent, frozen=True, kw_only=True, tag="worker_joined"):
    """A replica completed its handshake and can take ``capacity`` requests."""

    engine: str
    capacity: int
    pid: int = 0


@final
class WorkerLost(WorkerEvent, frozen=True, kw_only=True, tag="worker_lost"):
    """A replica is gone (process exit, missed heartbeats, shutdown)."""

    reason: str


# -- the server -----------------------------------------------------------------


@final
class Released(_Base, frozen=True, kw_only=True, tag="released"):
    """Retention released these ended requests (schema v4): their events,
    blobs and folded state are dropped from memory (and, once their segments
    go, from disk); the ids are answered as "released" while they stay in
    the tombstones.  A decision of ``omnix.events.retention.Retention``, a
    function of the log prefix and the retention policy: ``reason`` names
    the bound that passed.  ``ts_ns`` is the log clock's reading the time
    bound was compared with (an idle server's sweep appends one with the
    clock's current reading; otherwise it copies its cause's).  Only ended
    (terminal) requests may be released: the reducer refuses an in-flight
    one; ids no longer in the fold are ignored."""

    request_ids: tuple[str, ...]
    reason: ReleaseReason


@final
class SessionChanged(_Base, frozen=True, kw_only=True, tag="session_changed"):
    """A ``/v1/realtime`` session changed (schema v7), an input: it was
    opened or its settings updated (``settings``), an item was added to its
    conversation (``item``, its audio in ``media``, after the item
    ``previous``, "" for first), deleted or truncated (``item_id``,
    ``audio_end_ms``).  Its responses are requests (``RealtimeOptions``
    names the session); these events and those requests are the session,
    so a restarted server takes it up again and a trace replays it whole.
    No request's state depends on it."""

    session: str
    op: SessionOp
    settings: SessionSettings | None = None
    item: SessionItem | None = None
    media: tuple[MediaPart, ...] = ()
    previous: str = ""
    item_id: str = ""
    audio_end_ms: int = 0


@final
class Scaled(_Base, frozen=True, kw_only=True, tag="scaled"):
    """A stage's replica set changed (schema v8): replica ``replica`` of
    ``stage`` starts (it joins with ``WorkerJoined``), drains (routing
    gives it no new request from here on; the requests it runs finish
    there), or ``left`` (a drained replica with nothing left to run
    stopped cleanly: the runtime's input, no ``WorkerLost``, nothing
    moves).  ``replicas`` is the stage's count after it (started and not
    draining).  The orchestrator's decision when ``cause`` is set (the
    sample that led to it, ``reason`` ``queue`` or ``idle``); an input
    otherwise: an admin's count (``admin``, each replica an event), a
    replica that ``left``, a restarted server's return to ``min``."""

    stage: str
    replica: int
    op: ScaleOp
    replicas: int
    reason: ScaleReason
    cause: int = -1


#: Every event about a request.  An ``Event`` narrows to it with
#: ``isinstance(ev, RequestEvent)``, or on a hot path with
#: ``type(ev) is not WorkerJoined and type(ev) is not WorkerLost and
#: type(ev) is not Released and type(ev) is not SessionChanged and
#: type(ev) is not Scaled``.
RequestEventType = Union[  # noqa: UP007 (one tagged union, listed one per line)
    Admitted,
    Rejected,
    Routed,
    StageStarted,
    Progress,
    Chunk,
    StageFinished,
    StageFailed,
    CancelRequested,
    DeadlineExpired,
    Cancelled,
    Failed,
    Finished,
    InputAppended,
]
#: The one tagged union every event decodes as (``Event.__args__`` is flat:
#: a Union of a Union flattens).
Event = Union[RequestEventType, WorkerJoined, WorkerLost, Released, SessionChanged, Scaled]  # noqa: UP007 (as RequestEventType)

#: Events about one stage of one request on one replica: each has ``stage``
#: and ``replica`` (narrow with ``isinstance(ev, STAGE_EVENT_TYPES)``).
StageEvent = Routed | StageStarted | Progress | Chunk | StageFinished | StageFailed
#: Events from a stage's worker about a request (not decisions).
StageOutputEvent = StageStarted | Progress | Chunk | StageFinished | StageFailed
#: The one event each request ends with.
TerminalEvent = Rejected | Cancelled | Failed | Finished
#: Events about a worker replica rather than a request.
WorkerEventType = WorkerJoined | WorkerLost
#: Events about no one request: the workers', retention's, realtime sessions', scaling's.
ServerEventType = WorkerJoined | WorkerLost | Released | SessionChanged | Scaled

# The tuples below are left to inference (Final, no ``tuple[type, ...]``):
# the checker then knows each member, so ``isinstance(ev, TERMINAL_TYPES)``
# narrows ``ev`` as ``isinstance(ev, TerminalEvent)`` does.
STAGE_EVENT_TYPES: Final = (Routed, StageStarted, Progress, Chunk, StageFinished, StageFailed)

EVENT_TYPES: tuple[type[Event], ...] = get_args(Event)
TERMINAL_TYPES: Final = (Rejected, Cancelled, Failed, Finished)
REQUEST_EVENT_TYPES: tuple[type[RequestEventType], ...] = get_args(RequestEventType)
WORKER_EVENT_TYPES: Final = (WorkerJoined, WorkerLost)
SERVER_EVENT_TYPES: Final = (WorkerJoined, WorkerLost, Released, SessionChanged, Scaled)

#: Appended by the orchestrator; everything else is an input.  CancelRequested
#: and Scaled are both: a client's cancel, an admin's count or a replica
#: that left is an input, a deadline's cancel or a scale decision is a
#: decision (it has a cause).
DECISION_TYPES: Final = (Routed, Cancelled, Failed, Finished)
#: The event types a decision can have (a CancelRequested or Scaled only with a cause).
DecisionEvent = Routed | CancelRequested | Cancelled | Failed | Finished | Scaled


def is_decision(ev: Event) -> TypeGuard[DecisionEvent]:
    """Appended by the orchestrator in reaction to an input (replay re-derives
    these).  A CancelRequested is a decision when it has a cause (the
    deadline's); a client's (``cause == -1``) is an input; so is a Scaled."""
    return type(ev) in DECISION_TYPES or (
        (type(ev) is CancelRequested or type(ev) is Scaled) and ev.cause >= 0
    )


def _tag_of(cls: type[Event]) -> str:
    tag = cls.__struct_config__.tag
    if not isinstance(tag, str):  # pragma: no cover - every event names a str tag
        raise TypeError(f"{cls.__name__} has no string tag")
    return tag


# msgspec types a struct's tag as ``str | int | None``; every event's is a
# str, so the tags are read (and checked) once, here.
_TAGS: dict[type[Event], str] = {cls: _tag_of(cls) for cls in EVENT_TYPES}


def event_tag(ev: Event) -> str:
    """The event's type as the log names it (``"chunk"``, ``"routed"``...)."""
    return _TAGS[type(ev)]


def is_terminal(ev: Event) -> TypeGuard[TerminalEvent]:
    return isinstance(ev, TERMINAL_TYPES)
