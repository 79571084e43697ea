"""Chat completions' request and response bodies, as typed msgspec Structs.

Owns: ``ChatCompletionRequest`` (OpenAI's, with vLLM(-Omni)'s extensions:
``sampling_params_list`` and the sampling extras of ``SamplingFields``),
``UNSUPPORTED_CHAT_FIELDS`` (OpenAI parameters omnix knows and does not
take, so a client sending one gets a precise 400 rather than a generic
"unknown field"), and the response bodies: ``ChatCompletion`` and, streamed,
``ChatCompletionChunk``.  Messages and their content parts are shared
(``omnix.http.common.fields``).

Does not own what a body means (``plan.py``) nor filling the responses
(``render.py``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from omnix.http.common.fields import (
    REQUEST,
    Message,
    PositiveInt,
    SamplingFields,
    SamplingParamsList,
    Seed,
    Stop,
    StreamOptions,
    Temperature,
    TopP,
    Usage,
    Voice,
)

ChatAudioFormat = Literal["wav", "mp3", "flac", "opus", "aac", "pcm16"]

#: OpenAI's function names: letters, digits, ``_`` and ``-``, at most 64.
FunctionName = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


class FunctionDef(msgspec.Struct, **REQUEST):
    name: FunctionName
    description: str | None = None
    #: a JSON Schema of the arguments (checked as one: ``tools.py``)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct, **REQUEST):
    function: FunctionDef
    type: Literal["function"] = "function"


class NamedFunction(msgspec.Struct, **REQUEST):
    name: str


class NamedToolChoice(msgspec.Struct, **REQUEST):
    """``tool_choice`` naming the function the answer must call."""

    function: NamedFunction
    type: Literal["function"] = "function"


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class AudioParams(msgspec.Struct, **REQUEST):
    format: ChatAudioFormat = "wav"
    voice: Voice = "default"


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
    stop: Stop | None = None
    n: Annotated[int, Meta(ge=1, le=128)] = 1
    sampling_params_list: SamplingParamsList | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    parallel_tool_calls: bool | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None


#: OpenAI chat parameters omnix does not take, with the reason: sending one
#: is answered 400 ``unsupported_parameter`` with this text (not a generic
#: "unknown field").  Their values would be free-form JSON, so they are not
#: declared on the Struct.
UNSUPPORTED_CHAT_FIELDS: dict[str, str] = {
    "functions": "the deprecated form of tools: send tools.",
    "function_call": "the deprecated form of tool_choice: send tool_choice.",
    "prediction": "omit it.",
    "reasoning_effort": "omit it.",
    "web_search_options": "omit it.",
}


class AudioOut(msgspec.Struct, kw_only=True):
    """OpenAI's ``message.audio`` (and, streamed, ``delta.audio``)."""

    id: str
    data: str | UnsetType = UNSET
    expires_at: int | UnsetType = UNSET
    transcript: str | UnsetType = UNSET


class FunctionCallOut(msgspec.Struct, kw_only=True):
    name: str
    arguments: str


class ToolCallOut(msgspec.Struct, kw_only=True):
    """A call in ``message.tool_calls``."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class FunctionDeltaOut(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str | UnsetType = UNSET
    arguments: str = ""


class ToolCallDeltaOut(msgspec.Struct, kw_only=True):
    """A piece of a call in ``delta.tool_calls``, as the openai client
    assembles them: ``id``, ``type`` and the name on a call's first piece
    only, then its arguments' text by ``index``."""

    index: int
    id: str | UnsetType = UNSET
    type: Literal["function"] | UnsetType = UNSET
    function: FunctionDeltaOut


class AssistantMessage(msgspec.Struct, kw_only=True):
    # ``content`` is written even when null (as OpenAI does); UNSET fields
    # are never written.
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    audio: AudioOut | UnsetType = UNSET
    #: vLLM's field: the reasoning its reasoning parser split off
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCallOut] | UnsetType = UNSET


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
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCallDeltaOut] | UnsetType = UNSET


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
