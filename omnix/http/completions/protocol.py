"""Completions' request and response bodies, as typed msgspec Structs.

Owns: ``CompletionRequest`` (OpenAI's legacy completions, as vLLM serves
them: a raw prompt, text or token ids, a list of them a batch; the
sampling fields chat has too) and ``Completion`` (the ``text_completion``
object, whole or one per SSE event) with its legacy ``logprobs``.

Does not own what a body means (``plan.py``) nor filling the responses
(``render.py``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from omnix.http.common.fields import (
    PositiveInt,
    SamplingFields,
    SamplingParamsList,
    Seed,
    Stop,
    StreamOptions,
    Temperature,
    TokenId,
    TopP,
    Usage,
)

#: A prompt: a string or token ids; a list of strings, or of id lists, is a
#: batch (``plan.completion_prompts`` sorts out which).
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
    stop: Stop | None = None
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
