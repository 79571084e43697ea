"""A vLLM stage's sampling: ``StageParams`` as vLLM's ``SamplingParams``.

Owns: ``budget`` (how many tokens a sub-request may emit: the request's
``max_tokens``, or ``DEFAULT_MAX_TOKENS``, within the room its prompt
leaves in ``max_model_len``) and ``sampling_params`` (one sub-request's
``SamplingParams``: DELTA outputs, one seed per input piece, the OpenAI and
vLLM extras as vLLM's OpenAI server maps them; for codec output, sampling
restricted to the layout's codec ids and stopping on its EOS).

Does not own prompts (``vllm_prompt.py``) nor outputs (``vllm_outputs.py``).
"""

from __future__ import annotations

from typing import Any

from omnix.engines.vllm_setup import VocabLayout
from omnix.transport.work import GenerateRequest

DEFAULT_MAX_TOKENS = 128

#: ``StageParams`` fields (schema v5) passed to vLLM as they are, when set.
_PASSED_ON = (
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
)


def budget(request: GenerateRequest, max_model_len: int, prompt_len: int) -> int:
    """Tokens a sub-request with a ``prompt_len``-token prompt may emit."""
    room = max_model_len - prompt_len
    if room <= 0:
        raise ValueError(
            f"prompt of {prompt_len} tokens leaves no room in max_model_len "
            f"{max_model_len}: raise the stage's max_model_len or shorten the input"
        )
    return min(request.params.max_tokens or DEFAULT_MAX_TOKENS, room)


def sampling_params(
    request: GenerateRequest,
    max_tokens: int,
    seq: int,
    codec: bool,
    layout: VocabLayout,
    structured: Any = None,
) -> Any:
    """The ``SamplingParams`` of sub-request ``seq`` (the ``seq``-th
    non-empty input piece) of ``request``; ``structured``: the structured
    output a tool choice of ``required`` or a named function samples under
    (``vllm_tools.RequestParse``), over the request's own JSON."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    p = request.params
    base = p.seed if p.seed is not None else request.seed
    kw: dict[str, Any] = {
        "n": 1,
        "max_tokens": max_tokens,
        # One seed per piece: reproducible, and two sentences don't share noise.
        "seed": (base + seq) % (1 << 63),
        "output_kind": RequestOutputKind.DELTA,
        # Built fresh for this sub-request and never reused, so vLLM
        # need not deep-copy it on add_request (~30 us a request on
        # this machine; vLLM's own OpenAI server does the same).
        "skip_clone": True,
    }
    if p.temperature is not None:
        kw["temperature"] = p.temperature
    if p.top_p is not None:
        kw["top_p"] = p.top_p
    if p.top_k is not None:
        kw["top_k"] = p.top_k
    # vLLM's and OpenAI's extras (StageParams schema v5), as vLLM's
    # OpenAI server maps them.
    for name in _PASSED_ON:
        value = getattr(p, name)
        if value is not None:
            kw[name] = value
    if p.min_tokens is not None:
        kw["min_tokens"] = min(p.min_tokens, max_tokens)
    if p.logprobs is not None and not codec:
        kw["logprobs"] = p.logprobs
    if codec:
        allowed = list(range(layout.codec_offset, layout.codec_offset + layout.codec_size))
        if layout.codec_eos >= 0:
            allowed.append(layout.codec_eos)
            kw["stop_token_ids"] = [layout.codec_eos]
        kw["allowed_token_ids"] = allowed
        kw["detokenize"] = False
    else:
        _text_only(request, kw)
        if structured is not None:
            kw["structured_outputs"] = structured
    return SamplingParams(**kw)


def _text_only(request: GenerateRequest, kw: dict[str, Any]) -> None:
    """The parameters only text output takes: stops, logit bias, JSON."""
    p = request.params
    if p.stop:
        kw["stop"] = list(p.stop)
    if p.stop_token_ids:
        kw["stop_token_ids"] = list(p.stop_token_ids)
    if p.logit_bias:
        kw["logit_bias"] = dict(p.logit_bias)
    if p.json_schema is not None or p.json_object:
        from vllm.sampling_params import StructuredOutputsParams

        kw["structured_outputs"] = (
            StructuredOutputsParams(json=p.json_schema)
            if p.json_schema is not None
            else StructuredOutputsParams(json_object=True)
        )
