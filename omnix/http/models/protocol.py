"""The model list's and the tokenizer routes' bodies, as msgspec Structs.

Owns ``ModelList`` (the served pipeline as OpenAI's one model, with its
modalities, its stages and what its speech route takes) and vLLM's ``/tokenize`` and ``/detokenize``
bodies.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from omnix.http.audio.protocol import SpeechFields
from omnix.http.common.fields import REQUEST, Message


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "omnix"
    #: as vLLM's card: what the name serves (the pipeline) and the context
    #: of its first stage as the engine reports it (None: not a vLLM stage)
    root: str = ""
    max_model_len: int | None = None
    #: omnix: what the pipeline can produce and its stages, in order.
    modalities: list[str]
    stages: list[str]
    #: omnix: what ``POST /v1/audio/speech`` takes here (a Qwen3-TTS
    #: checkpoint's fields); None on a pipeline that makes no audio.
    speech: SpeechFields | None = None


class ModelList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeRequest(msgspec.Struct, **REQUEST):
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


class DetokenizeRequest(msgspec.Struct, **REQUEST):
    """vLLM's ``POST /detokenize``."""

    tokens: list[Annotated[int, Meta(ge=0, le=2**31 - 1)]]
    model: str | None = None


class DetokenizeResponse(msgspec.Struct, kw_only=True):
    prompt: str
