"""The HTTP API's request and response bodies, as typed msgspec Structs.

Owns: the shapes of every JSON body the server reads or writes, and their
value constraints (``msgspec.Meta``), so a bad body fails in the decoder
with a message that names the field.  Request Structs forbid unknown
fields (OpenAI answers an unknown argument with 400; so do we).

Does not own the meaning of a request (``adapt.py`` turns bodies into
``RequestSpec``s) nor any rendering logic (``render.py`` fills the
response Structs from the log).  ``openapi.py`` derives its schemas from
these types.

OpenAI parameters omnix cannot honour whose values are free-form JSON
(``tools``...) are listed in ``UNSUPPORTED_CHAT_FIELDS``, so a client
sending one gets a precise "not supported" (400 ``unsupported_parameter``)
instead of a generic "unknown field".  vLLM's sampling extras are declared
on the chat request and passed to the text stage (``adapt.py`` refuses
them for a stage whose engine cannot honour them).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from omnix.events.types import StageParams

_REQ = dict(forbid_unknown_fields=True, kw_only=True)

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
PositiveInt = Annotated[int, Meta(ge=1, le=1_000_000)]
Seed = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
Voice = Annotated[str, Meta(min_length=1, max_length=64)]
Speed = Annotated[float, Meta(ge=0.25, le=4.0)]
Steps = Annotated[int, Meta(ge=1, le=1000)]

#: Per-stage overrides: a list aligned with the pipeline's stages (``null``
#: keeps a stage's defaults), or a map from stage name to overrides.
SamplingParamsList = list[StageParams | None] | dict[str, StageParams]


# --------------------------------------------------------------------------
# Chat completions
# --------------------------------------------------------------------------


class TextPart(msgspec.Struct, tag="text", tag_field="type", **_REQ):
    text: str


class ImageUrl(msgspec.Struct, **_REQ):
    url: str
    detail: str = "auto"


class ImageUrlPart(msgspec.Struct, tag="image_url", tag_field="type", **_REQ):
    image_url: ImageUrl


class InputAudio(msgspec.Struct, **_REQ):
    data: str
    format: str


class InputAudioPart(msgspec.Struct, tag="input_audio", tag_field="type", **_REQ):
    input_audio: InputAudio


class AudioUrl(msgspec.Struct, **_REQ):
    url: str


class AudioUrlPart(msgspec.Struct, tag="audio_url", tag_field="type", **_REQ):
    audio_url: AudioUrl


class VideoUrl(msgspec.Struct, **_REQ):
    url: str


class VideoUrlPart(msgspec.Struct, tag="video_url", tag_field="type", **_REQ):
    video_url: VideoUrl


MediaContentPart = ImageUrlPart | InputAudioPart | AudioUrlPart | VideoUrlPart
ContentPart = TextPart | ImageUrlPart | InputAudioPart | AudioUrlPart | VideoUrlPart

Role = Literal["system", "developer", "user", "assistant", "tool"]


class Message(msgspec.Struct, **_REQ):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None


class StreamOptions(msgspec.Struct, **_REQ):
    include_usage: bool = False
    #: omnix: give each SSE event an ``id:`` so a dropped stream can be
    #: resumed (``GET /v1/requests/{id}/stream`` with ``Last-Event-ID``).
    resumable: bool = False


class JsonSchemaFormat(msgspec.Struct, **_REQ):
    name: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    #: required here (OpenAI's is optional): omnix constrains the answer to it
    schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None


class TextFormat(msgspec.Struct, tag="text", tag_field="type", **_REQ):
    pass


class JsonObjectFormat(msgspec.Struct, tag="json_object", tag_field="type", **_REQ):
    pass


class JsonSchemaResponseFormat(msgspec.Struct, tag="json_schema", tag_field="type", **_REQ):
    json_schema: JsonSchemaFormat


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaResponseFormat


ChatAudioFormat = Literal["wav", "mp3", "flac", "opus", "aac", "pcm16"]


class AudioParams(msgspec.Struct, **_REQ):
    format: ChatAudioFormat = "wav"
    voice: Voice = "default"


class SamplingFields(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The sampling fields chat and completions share: OpenAI's penalties,
    ``logit_bias`` and ``response_format``; from ``top_k`` on, vLLM's
    extensions.  Mapped onto the text stage (``adapt._sampling_extras``)."""

    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]] | None = None
    response_format: ResponseFormat | None = None
    # vLLM's extras
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    ignore_eos: bool | None = None
    min_tokens: Annotated[int, Meta(ge=0, le=1_000_000)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] | None = None
    stop_token_ids: Annotated[list[Annotated[int, Meta(ge=0)]], Meta(max_length=64)] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None


class ChatCompletionRequest(SamplingFields, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/chat/completions.

    ``messages`` is one conversation (a list of messages) or a batch (a list
    of conversations, answered with one choice each, non-streaming only).
    ``sampling_params_list`` and the fields from ``top_k`` on below
    ``stop`` are vLLM(-Omni)'s extensions.
    """

    messages: Annotated[
        list[Message | Annotated[list[Message], Meta(min_length=1)]], Meta(min_length=1)
    ]
    model: str = ""
    stream: bool = False
    stream_options: StreamOptions | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioParams | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    seed: Seed | None = None
    stop: str | Annotated[list[str], Meta(max_length=16)] | None = None
    n: Annotated[int, Meta(ge=1, le=128)] = 1
    sampling_params_list: SamplingParamsList | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    parallel_tool_calls: bool | None = None


#: OpenAI chat parameters omnix does not take, with the reason: sending one
#: is answered 400 ``unsupported_parameter`` with this text (not a generic
#: "unknown field").  Their values would be free-form JSON, so they are not
#: declared on the Struct.
UNSUPPORTED_CHAT_FIELDS: dict[str, str] = {
    "tools": "omnix does not run tool calls; omit it.",
    "tool_choice": "omnix does not run tool calls; omit it.",
    "functions": "omnix does not run function calls; omit it.",
    "function_call": "omnix does not run function calls; omit it.",
    "prediction": "omit it.",
    "reasoning_effort": "omit it.",
    "web_search_options": "omit it.",
}


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AudioOut(msgspec.Struct, kw_only=True):
    """OpenAI's ``message.audio`` (and, streamed, ``delta.audio``)."""

    id: str
    data: str | UnsetType = UNSET
    expires_at: int | UnsetType = UNSET
    transcript: str | UnsetType = UNSET


class AssistantMessage(msgspec.Struct, kw_only=True):
    # ``content`` is written even when null (as OpenAI does); UNSET fields
    # are never written.
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    audio: AudioOut | UnsetType = UNSET


class TopLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobOut(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(msgspec.Struct, kw_only=True):
    """OpenAI's ``choices[].logprobs``."""

    content: list[TokenLogprobOut] | None


class ChatChoice(msgspec.Struct, kw_only=True):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    #: omnix: the request id behind each choice (``/v1/requests/{id}``).
    request_ids: list[str]


class Delta(msgspec.Struct, kw_only=True):
    role: Literal["assistant"] | UnsetType = UNSET
    content: str | UnsetType = UNSET
    audio: AudioOut | UnsetType = UNSET


class ChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    # Absent unless stream_options.include_usage; then null on every chunk
    # but the last, which has empty choices and the totals (as OpenAI does).
    usage: Usage | UnsetType | None = UNSET


# --------------------------------------------------------------------------
# Completions (vLLM's /v1/completions)
# --------------------------------------------------------------------------

TokenId = Annotated[int, Meta(ge=0, le=2**31 - 1)]
#: A prompt: a string or token ids; a list of strings, or of id lists, is a
#: batch (``adapt.completion_prompts`` sorts out which).
CompletionPrompt = (
    str
    | Annotated[
        list[str | TokenId | Annotated[list[TokenId], Meta(min_length=1)]], Meta(min_length=1)
    ]
)


class CompletionRequest(SamplingFields, forbid_unknown_fields=True, kw_only=True):
    """POST /v1/completions (OpenAI's legacy completions, as vLLM serves
    them): the prompt goes to the text stage raw (no chat template).
    ``logprobs`` is the number of alternatives per token (0-5).  The
    sampling fields mean what they mean on chat; from ``top_k`` on they are
    vLLM's extensions."""

    prompt: CompletionPrompt
    model: str = ""
    suffix: str | None = None
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Annotated[int, Meta(ge=1, le=128)] = 1
    best_of: Annotated[int, Meta(ge=1, le=128)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    echo: bool = False
    stop: str | Annotated[list[str], Meta(max_length=16)] | None = None
    seed: Seed | None = None
    user: str | None = None
    sampling_params_list: SamplingParamsList | None = None


class CompletionLogprobs(msgspec.Struct, kw_only=True):
    """OpenAI's legacy ``choices[].logprobs`` (as vLLM writes it): per
    token its text, logprob, the most likely alternatives (the token
    itself first), and its offset in the choice's text."""

    text_offset: list[int]
    token_logprobs: list[float]
    tokens: list[str]
    top_logprobs: list[dict[str, float]]


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class Completion(msgspec.Struct, kw_only=True):
    """A ``text_completion`` object; streamed, each SSE event is one with
    the text of that event (``usage`` as on chat chunks)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | UnsetType | None = UNSET
    #: omnix: the request id behind each choice (whole responses only).
    request_ids: list[str] | UnsetType = UNSET


# --------------------------------------------------------------------------
# Speech
# --------------------------------------------------------------------------

SpeechFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]


class SpeechRequest(msgspec.Struct, **_REQ):
    """POST /v1/audio/speech.  Without ``stream_format`` the whole file is
    returned once generated; ``"audio"`` streams the encoded bytes as they
    are produced (chunked transfer); ``"sse"`` streams
    ``speech.audio.delta`` events.  ``stream: true`` (vLLM-Omni's) means
    ``stream_format: "sse"`` unless a ``stream_format`` is given.
    ``speed`` other than 1 and ``instructions`` are refused (400) by a
    pipeline none of whose speech stages can honour them."""

    input: Annotated[str, Meta(min_length=1, max_length=16384)]
    model: str = ""
    voice: Voice = "default"
    response_format: SpeechFormat = "mp3"
    speed: Speed = 1.0
    stream_format: Literal["audio", "sse"] | None = None
    stream: bool | None = None
    instructions: Annotated[str, Meta(max_length=4096)] | None = None
    seed: Seed | None = None
    sampling_params_list: SamplingParamsList | None = None


class SpeechAudioDelta(msgspec.Struct, tag="speech.audio.delta", tag_field="type"):
    audio: str


class SpeechUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class SpeechAudioDone(msgspec.Struct, tag="speech.audio.done", tag_field="type"):
    usage: SpeechUsage


# --------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------

Size = Annotated[str, Meta(pattern=r"^[1-9][0-9]{0,4}x[1-9][0-9]{0,4}$")]


class ImageRequest(msgspec.Struct, **_REQ):
    """POST /v1/images/generations.  ``seed``, ``steps`` (alias of
    ``num_inference_steps``), ``num_inference_steps``, ``guidance_scale``,
    ``negative_prompt`` and ``true_cfg_scale`` are vLLM-Omni's (and
    omnix's) extensions; ``quality``, ``style``, ``background`` and
    ``output_format`` are OpenAI's, honoured as docs/http.md "Images" says
    (a value the pipeline cannot honour is a 400 naming it)."""

    prompt: Annotated[str, Meta(min_length=1, max_length=32000)]
    model: str = ""
    n: Annotated[int, Meta(ge=1, le=16)] = 1
    size: Size | None = None
    response_format: Literal["b64_json", "url"] = "b64_json"
    seed: Seed | None = None
    steps: Steps | None = None
    num_inference_steps: Steps | None = None
    guidance_scale: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    sampling_params_list: SamplingParamsList | None = None
    user: str | None = None
    quality: Literal["auto", "standard", "low", "medium", "high", "hd"] | None = None
    style: Literal["vivid", "natural"] | None = None
    background: Literal["auto", "opaque", "transparent"] | None = None
    output_format: Literal["png", "jpeg", "webp"] | None = None
    negative_prompt: Annotated[str, Meta(max_length=32000)] | None = None
    true_cfg_scale: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None


class ImageData(msgspec.Struct, kw_only=True):
    #: one of ``b64_json`` and ``url``, as the request's response_format says
    b64_json: str | UnsetType = UNSET
    url: str | UnsetType = UNSET
    revised_prompt: str | UnsetType = UNSET


class ImagesResponse(msgspec.Struct, kw_only=True):
    created: int
    data: list[ImageData]
    request_ids: list[str]
    #: the file format, when the request named one (as OpenAI answers it)
    output_format: str | UnsetType = UNSET


# --------------------------------------------------------------------------
# Models, health, omnix's own routes
# --------------------------------------------------------------------------


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "omnix"
    #: omnix: what the pipeline can produce and its stages, in order.
    modalities: list[str]
    stages: list[str]


class ModelList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(msgspec.Struct, kw_only=True):
    status: Literal["ok"] = "ok"


class TokenizeRequest(msgspec.Struct, **_REQ):
    """vLLM's ``POST /tokenize``: a ``prompt``, or chat ``messages`` as the
    stage's chat template renders them (text parts only)."""

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[Message], Meta(min_length=1)] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class TokenizeResponse(msgspec.Struct, kw_only=True):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(msgspec.Struct, **_REQ):
    """vLLM's ``POST /detokenize``."""

    tokens: list[Annotated[int, Meta(ge=0, le=2**31 - 1)]]
    model: str | None = None


class DetokenizeResponse(msgspec.Struct, kw_only=True):
    prompt: str


class ProfileRequest(msgspec.Struct, **_REQ):
    """``POST /start_profile`` and ``/stop_profile`` (vLLM-Omni's shape):
    the stages whose workers to profile; none: every stage."""

    stages: list[Annotated[str, Meta(min_length=1, max_length=128)]] = []


class WorkerProfile(msgspec.Struct, kw_only=True):
    """One worker's answer: where its traces go (start), the file it wrote
    (stop), or what went wrong (``ok`` false)."""

    stage: str
    replica: int
    ok: bool
    detail: str


class Profiles(msgspec.Struct, kw_only=True):
    workers: list[WorkerProfile]


class Version(msgspec.Struct, kw_only=True):
    """``GET /version``, as vLLM's server answers it."""

    version: str


class Readiness(msgspec.Struct, kw_only=True):
    ready: bool
    accepting: bool
    #: ready replicas per stage
    stages: dict[str, int]


class CancelResult(msgspec.Struct, kw_only=True):
    request_id: str
    #: True when this call asked to cancel; False when it had already ended.
    cancel_requested: bool
    status: str


__all__ = [
    "AssistantMessage",
    "AudioOut",
    "AudioParams",
    "CancelResult",
    "ChatChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChunkChoice",
    "Delta",
    "Health",
    "ImageData",
    "ImageRequest",
    "ImagesResponse",
    "Message",
    "ModelCard",
    "ModelList",
    "Readiness",
    "SpeechAudioDelta",
    "SpeechAudioDone",
    "SpeechRequest",
    "SpeechUsage",
    "StreamOptions",
    "Usage",
    "Version",
]
