"""A completions body -> the requests it submits.

Owns: which stage takes a raw prompt (``completion_stage``: the text
stage, when it is a vLLM stage reading the request itself; else the route
is refused), the body's prompts (``completion_prompts``: one, or a batch),
token-id prompts checked against the stage's tokenizer and recorded as a
``RawPrompt`` (their text is the request's ``prompt``, for the log and
``echo``), ``n`` samples of one prompt (a group), the sampling fields on
the text stage (``max_tokens`` 16 when not given, as vLLM's and OpenAI's)
and the ``CompletionOptions`` the response renders from.

Does not own admission (``core.submit``) nor the response's bytes
(``render.py``).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from omnix.events.options import API_COMPLETIONS, CompletionOptions, RawPrompt
from omnix.events.types import RequestSpec
from omnix.http.common.plan import Plan, PlanContext, group_ids, member
from omnix.http.common.rendering import RENDER_VERSION
from omnix.http.common.sampling import bad, sampling_extras, text_params, unsupported
from omnix.http.completions.protocol import CompletionRequest
from omnix.http.core.errors import ApiError

#: The ``max_tokens`` of a completion that names none (vLLM's and OpenAI's).
COMPLETION_MAX_TOKENS: Final = 16


def completion_stage(served: PlanContext) -> str:
    """The stage a raw completion prompt goes to: the text stage, when it is
    a vLLM stage that reads the request's prompt itself (the pipeline's
    first stage, whose tokenizer counts the prompt); else 400 naming it."""
    stage = served.output_stage("text")
    if not stage:
        raise ApiError(
            400,
            f"pipeline {served.model!r} produces no text ({', '.join(served.pipeline.outputs) or 'nothing'}), "
            "so it cannot answer /v1/completions.",
            param="model",
            code="unsupported_modality",
        )
    kind = served.engine_of(stage)
    sources = served.graph.sources(served.graph.needed_stages(("text",)))
    if kind != "vllm" or sources != (stage,) or served.pipeline.stages[0].name != stage:
        why = (
            f"its engine is {kind}, not vLLM"
            if kind != "vllm"
            else "it does not read the request's prompt itself (an upstream stage does)"
        )
        raise ApiError(
            400,
            f"/v1/completions is not supported by pipeline {served.model!r}: it sends a raw "
            f"prompt to the text stage, and text stage {stage!r} cannot take one ({why}). Use "
            "/v1/chat/completions.",
            param="prompt",
            code="unsupported_parameter",
        )
    return stage


def completion_prompts(body: CompletionRequest) -> list[str | list[int]]:
    """The body's prompts: one (a string, or a list of token ids), or a
    batch (a list of strings, or a list of token-id lists)."""
    p = body.prompt
    if isinstance(p, str):
        return [p]
    ids = [x for x in p if isinstance(x, int)]
    texts = [x for x in p if isinstance(x, str)]
    lists = [x for x in p if isinstance(x, list)]
    if len(ids) == len(p):
        return [ids]
    if len(texts) == len(p):
        return list(texts)
    if len(lists) == len(p):
        return list(lists)
    raise bad(
        "prompt",
        "prompt mixes strings, token ids and lists of token ids: send a string, a list of token "
        "ids, or a batch (a list of strings, or a list of token-id lists).",
    )


def _check_fields(body: CompletionRequest) -> None:
    """400 for the fields (and pairs of them) omnix does not take."""
    if body.suffix is not None:
        raise unsupported(
            "suffix", "omnix does not do fill-in-the-middle completions; omit suffix."
        )
    if body.best_of is not None and body.best_of != 1:
        raise ApiError(
            400,
            f"best_of={body.best_of} is not supported: omnix does not rank candidates; send "
            "n for several completions, or omit best_of.",
            param="best_of",
            code="unsupported_value",
        )
    if body.stream_options is not None and not body.stream:
        raise bad("stream_options", "stream_options is only allowed when stream is true.")
    if body.echo and body.logprobs is not None:
        raise ApiError(
            400,
            "echo with logprobs is not supported: omnix records no logprobs of the prompt's "
            "tokens. Send echo or logprobs, not both.",
            param="echo",
            code="unsupported_value",
        )


def _check_batch(body: CompletionRequest, batched: bool) -> None:
    """A batch is not streamed nor sampled; n samples are not resumable."""
    n = body.n
    if batched and body.stream:
        raise ApiError(
            400,
            "a batch of prompts cannot be streamed: send stream=false, or one prompt per "
            "request to stream.",
            param="stream",
            code="unsupported_value",
        )
    if n > 1 and batched:
        raise ApiError(
            400,
            f"n={n} with a batch of prompts is not supported: send n=1 with a batch, or one "
            "prompt with n > 1.",
            param="n",
            code="unsupported_value",
        )
    if n > 1 and body.stream_options is not None and body.stream_options.resumable:
        raise ApiError(
            400,
            f"a stream of n={n} choices is not resumable: send n=1 to get a resumable stream, "
            "or omit stream_options.resumable.",
            param="stream_options",
            code="unsupported_value",
        )


def _entries(
    prompts: list[str | list[int]], stage: str, tokenizer: Any
) -> list[tuple[str, RawPrompt]]:
    """Each prompt's text and how the stage takes it: as is, or as the
    token ids given (checked against the vocabulary; their text decoded)."""
    where = (lambda i: f"prompt[{i}]") if len(prompts) > 1 else (lambda i: "prompt")
    entries: list[tuple[str, RawPrompt]] = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if not p:
                raise bad(where(i), f"{where(i)} is empty: give some text or token ids.")
            entries.append((p, RawPrompt()))
            continue
        if tokenizer is None:
            raise ApiError(
                400,
                f"{where(i)} is token ids, but stage {stage!r} has no tokenizer to check them "
                "against: send the prompt as text.",
                param=where(i),
                code="unsupported_value",
            )
        vocab = len(tokenizer)
        if max(p) >= vocab:
            raise bad(
                where(i),
                f"{where(i)}: token id {max(p)} is outside the vocabulary (0..{vocab - 1}).",
            )
        entries.append((str(tokenizer.decode(p)) or " ", RawPrompt(token_ids=tuple(p))))
    return entries


def completion_plan(
    body: CompletionRequest, served: PlanContext, *, traceparent: str = "", tokenizer: Any = None
) -> Plan:
    """``tokenizer``: the text stage's (``PromptTokens.tokenizer``), needed
    for token-id prompts (checked against its vocabulary, and decoded: the
    request's ``prompt`` is their text, for the log and ``echo``)."""
    served.check_model(body.model)
    stage = completion_stage(served)
    _check_fields(body)
    prompts = completion_prompts(body)
    _check_batch(body, len(prompts) > 1)
    entries = _entries(prompts, stage, tokenizer)
    base = sampling_extras(
        body,
        temperature=body.temperature,
        top_p=body.top_p,
        stop=body.stop,
        max_tokens=body.max_tokens or COMPLETION_MAX_TOKENS,
        logprobs=body.logprobs,
    )
    params = text_params(served, body.sampling_params_list, stage, base)
    n = body.n
    opts = CompletionOptions(
        render=RENDER_VERSION,
        stream=body.stream and n == 1,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        usage_stage=stage,
        text_stage=stage,
        resumable=bool(body.stream_options and body.stream_options.resumable),
        logprobs=body.logprobs is not None,
        echo=body.echo,
    )
    seed = served.seed(body.seed)
    entries = entries * n if n > 1 else entries
    gid, rids = group_ids(served, len(entries))
    specs = []
    for i, (rid, (text, raw)) in enumerate(zip(rids, entries, strict=True)):
        group = member(gid, i, len(entries), samples=n > 1, streamed=n > 1 and body.stream)
        spec = RequestSpec(
            prompt=text,
            outputs=("text",),
            stage_params=params,
            seed=(seed + i) % 2**63,
            api=API_COMPLETIONS,
            model=served.model_for(body.model),
            traceparent=traceparent,
            response=msgspec.structs.replace(opts, group=group),
            raw_prompt=raw,
        )
        specs.append((rid, spec))
    return Plan(specs=tuple(specs), stream=body.stream)
