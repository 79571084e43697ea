"""Body pieces several routes share, as typed msgspec values.

Owns: the constrained value types request bodies are built of
(``Temperature``, ``Seed``...), ``REQUEST`` (the Struct options of every
request body: unknown fields are refused, as OpenAI answers them), the
per-stage overrides every generation route takes
(``SamplingParamsList``), chat messages and their content parts (chat,
``/tokenize`` and transcriptions read them; the media decoder decodes
their media parts), ``StreamOptions`` and the sampling fields chat and
completions share (``SamplingFields``, with ``response_format``).
Each route's own bodies are in its room's ``protocol.py``; the value
constraints (``msgspec.Meta``) make a bad body fail in the decoder with a
message that names the field.

Also ``Usage``, the token counts chat and completions answer with.

Does not own what the fields mean (``sampling.py`` maps them onto a
stage's ``StageParams``).
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from omnix.events.types import StageParams

#: The options every request body Struct is declared with.
REQUEST: Final[dict[str, Any]] = dict(forbid_unknown_fields=True, kw_only=True)

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
PositiveInt = Annotated[int, Meta(ge=1, le=1_000_000)]
Seed = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
Voice = Annotated[str, Meta(min_length=1, max_length=64)]
Speed = Annotated[float, Meta(ge=0.25, le=4.0)]
Steps = Annotated[int, Meta(ge=1, le=1000)]
TokenId = Annotated[int, Meta(ge=0, le=2**31 - 1)]
Stop = str | Annotated[list[str], Meta(max_length=16)]

#: Per-stage overrides: a list aligned with the pipeline's stages (``null``
#: keeps a stage's defaults), or a map from stage name to overrides.
SamplingParamsList = list[StageParams | None] | dict[str, StageParams]


class TextPart(msgspec.Struct, tag="text", tag_field="type", **REQUEST):
    text: str


class ImageUrl(msgspec.Struct, **REQUEST):
    url: str
    detail: str = "auto"


class ImageUrlPart(msgspec.Struct, tag="image_url", tag_field="type", **REQUEST):
    image_url: ImageUrl


class InputAudio(msgspec.Struct, **REQUEST):
    data: str
    format: str


class InputAudioPart(msgspec.Struct, tag="input_audio", tag_field="type", **REQUEST):
    input_audio: InputAudio


class AudioUrl(msgspec.Struct, **REQUEST):
    url: str


class AudioUrlPart(msgspec.Struct, tag="audio_url", tag_field="type", **REQUEST):
    audio_url: AudioUrl


class VideoUrl(msgspec.Struct, **REQUEST):
    url: str


class VideoUrlPart(msgspec.Struct, tag="video_url", tag_field="type", **REQUEST):
    video_url: VideoUrl


MediaContentPart = ImageUrlPart | InputAudioPart | AudioUrlPart | VideoUrlPart
ContentPart = TextPart | ImageUrlPart | InputAudioPart | AudioUrlPart | VideoUrlPart

Role = Literal["system", "developer", "user", "assistant", "tool"]


class FunctionCallIn(msgspec.Struct, **REQUEST):
    name: str
    #: the JSON text the model wrote (OpenAI's: a string, not an object)
    arguments: str


class ToolCallIn(msgspec.Struct, **REQUEST):
    """A call an assistant message of the history made."""

    id: str
    function: FunctionCallIn
    type: Literal["function"] = "function"


class Message(msgspec.Struct, **REQUEST):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCallIn] | None = None


class StreamOptions(msgspec.Struct, **REQUEST):
    include_usage: bool = False
    #: omnix: give each SSE event an ``id:`` so a dropped stream can be
    #: resumed (``GET /v1/requests/{id}/stream`` with ``Last-Event-ID``).
    resumable: bool = False


class JsonSchemaFormat(msgspec.Struct, **REQUEST):
    name: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    #: required here (OpenAI's is optional): omnix constrains the answer to it
    schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None


class TextFormat(msgspec.Struct, tag="text", tag_field="type", **REQUEST):
    pass


class JsonObjectFormat(msgspec.Struct, tag="json_object", tag_field="type", **REQUEST):
    pass


class JsonSchemaResponseFormat(msgspec.Struct, tag="json_schema", tag_field="type", **REQUEST):
    json_schema: JsonSchemaFormat


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaResponseFormat


class SamplingFields(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The sampling fields chat and completions share: OpenAI's penalties,
    ``logit_bias`` and ``response_format``; from ``top_k`` on, vLLM's
    extensions.  Mapped onto the text stage (``sampling.sampling_extras``)."""

    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Meta(ge=-100.0, le=100.0)]] | None = None
    response_format: ResponseFormat | None = None
    # vLLM's extras
    top_k: Annotated[int, Meta(ge=-1, le=2**31 - 1)] | None = None
    ignore_eos: bool | None = None
    min_tokens: Annotated[int, Meta(ge=0, le=1_000_000)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] | None = None
    stop_token_ids: Annotated[list[TokenId], Meta(max_length=64)] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
