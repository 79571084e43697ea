"""Sampling parameters per stage: which a stage's engine honours, and the
fields chat and completions share.

Owns: ``sampling_params_list`` as a map by stage (``stage_params``), the
top-level parameters put on a stage under its explicit overrides
(``put``), the 400 for a parameter a stage's engine cannot honour
(``check_engines``: vLLM's extras, the diffusion-only fields, ``speed``;
``check_speech``; ``check_diffusion``, judged on the model the stage's
folder describes), and the mapping of the sampling fields chat and
completions share onto the text stage (``sampling_extras``,
``text_params``).

Does not own the pipeline's own validation of a spec
(``omnix.pipelines.plan.validate_request``, which ``Omni.submit_group``
runs) nor any route's other fields.
"""

from __future__ import annotations

from typing import Final

import msgspec

from omnix.engines.diffusers_model import refusal
from omnix.events.types import StageParams
from omnix.http.common.fields import (
    JsonObjectFormat,
    JsonSchemaResponseFormat,
    SamplingFields,
    SamplingParamsList,
    Stop,
)
from omnix.http.common.plan import PlanContext
from omnix.http.core.errors import ApiError
from omnix.pipelines.plan import merge_params

#: ``StageParams`` fields (schema v5) that only some engines honour.
EXTRA_PARAMS: Final = (
    "min_tokens",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "stop_token_ids",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "ignore_eos",
    "logit_bias",
    "logprobs",
    "json_schema",
    "json_object",
)
#: Which of them each engine kind honours (the scripted test engine makes
#: deterministic fake logprobs, so rendering is testable without a model).
ENGINE_PARAMS: Final[dict[str, frozenset[str]]] = {
    "vllm": frozenset(EXTRA_PARAMS),
    "scripted": frozenset({"logprobs"}),
    # Qwen3-Omni's and Qwen3-TTS's talkers: the reference's penalty over
    # their own codes, and frames before the end of speech may come.
    "qwen3_omni_talker": frozenset({"repetition_penalty", "min_tokens"}),
    "qwen3_tts_talker": frozenset({"repetition_penalty", "min_tokens"}),
}
#: ``StageParams`` fields only a diffusers stage honours (schema v5; v7: an
#: edit's strength, partial images, a video's frames and rate).
DIFFUSION_PARAMS: Final = (
    "negative_prompt",
    "true_cfg_scale",
    "output_format",
    "strength",
    "partial_images",
    "num_frames",
    "fps",
)
#: The request field a ``StageParams`` field comes from, where they differ.
_HTTP_NAME: Final = {"json_schema": "response_format", "json_object": "response_format"}
#: At most this many ``logit_bias`` entries (OpenAI's limit).
MAX_LOGIT_BIAS: Final = 300

#: Speech parameters and the engine kinds whose stages honour them.  None
#: of omnix's engines changes the speaking rate (Qwen3-Omni's talker has
#: speakers, not rates; the decoders turn codes into samples); only
#: Qwen3-TTS's talker takes instructions and a language: a request that
#: needs one no stage honours is refused, naming the stages, rather than
#: answered as if it were honoured.
SPEECH_ENGINE_PARAMS: Final[dict[str, frozenset[str]]] = {
    "speed": frozenset(),
    "instructions": frozenset({"qwen3_tts_talker"}),
    "language": frozenset({"qwen3_tts_talker"}),
}
_SPEECH_WHAT: Final = {
    "speed": "can change the speaking rate; omit speed (or send 1.0)",
    "instructions": "takes voice instructions (a Qwen3-TTS talker does); omit instructions",
    "language": "takes a language (a Qwen3-TTS talker does); omit language",
}


def unsupported(param: str, why: str) -> ApiError:
    return ApiError(
        400, f"{param} is not supported: {why}", param=param, code="unsupported_parameter"
    )


def bad(param: str, why: str) -> ApiError:
    return ApiError(400, why, param=param, code="invalid_value")


def stage_params(served: PlanContext, given: SamplingParamsList | None) -> dict[str, StageParams]:
    """``sampling_params_list`` as a map by stage name."""
    if given is None:
        return {}
    if isinstance(given, dict):
        return dict(given)  # unknown names: validate_request says which exist
    names = served.graph.stage_names
    if len(given) != len(names):
        raise ApiError(
            400,
            f"sampling_params_list has {len(given)} entries but pipeline {served.model!r} has "
            f"{len(names)} stages ({', '.join(names)}): give one entry (or null) per stage, "
            "in this order, or a map from stage name to parameters.",
            param="sampling_params_list",
            code="invalid_value",
        )
    return {n: p for n, p in zip(names, given, strict=True) if p is not None}


def put(params: dict[str, StageParams], stage: str, base: StageParams) -> None:
    """``base`` under the explicit per-stage overrides for ``stage``
    (``sampling_params_list`` is the more specific, so it wins)."""
    if base == StageParams():
        return
    params[stage] = merge_params(base, params.get(stage))


def check_speech(served: PlanContext, param: str, stages: tuple[str, ...]) -> None:
    """400 unless one of ``stages`` (the speech stages) honours ``param``."""
    can = SPEECH_ENGINE_PARAMS[param]
    if any(served.engine_of(st) in can for st in stages):
        return
    named = ", ".join(f"{st!r} ({served.engine_of(st)})" for st in stages) or "none"
    raise ApiError(
        400,
        f"{param} is not supported by pipeline {served.model!r}: none of its speech stages "
        f"[{named}] {_SPEECH_WHAT[param]}.",
        param=param,
        code="unsupported_parameter",
    )


def check_engines(served: PlanContext, params: dict[str, StageParams]) -> None:
    """400 for a sampling parameter a stage's engine cannot honour
    (``ENGINE_PARAMS``, the diffusion fields, ``speed``), naming the
    parameter and the stage."""
    for stage, p in params.items():
        kind = served.engine_of(stage)
        can = ENGINE_PARAMS.get(kind, frozenset())
        for field in EXTRA_PARAMS:
            if getattr(p, field) is not None and field not in can:
                param = _HTTP_NAME.get(field, field)
                raise ApiError(
                    400,
                    f"{param} is not supported by stage {stage!r} of pipeline {served.model!r}: "
                    f"its engine ({kind}) cannot honour it (only vLLM stages take vLLM's "
                    "sampling extras); omit it.",
                    param=param,
                    code="unsupported_parameter",
                )
        if kind != "diffusers":  # the image-only fields (every route)
            for field in DIFFUSION_PARAMS:
                if getattr(p, field) is not None:
                    raise ApiError(
                        400,
                        f"{field} is not supported by stage {stage!r} of pipeline "
                        f"{served.model!r}: its engine ({kind}) is not a diffusers pipeline; "
                        "omit it.",
                        param=field,
                        code="unsupported_parameter",
                    )
        if p.speed is not None and p.speed != 1.0:
            check_speech(served, "speed", (stage,))


def check_diffusion(served: PlanContext, params: dict[str, StageParams]) -> None:
    """400 for a diffusion parameter a diffusers stage's pipeline would
    ignore (``diffusers_engine.refusal``, judged on the stage's defaults
    with the request's values on top, as the engine will run it).  The
    fields only diffusers stages take, on another engine: ``check_engines``."""
    names = set(served.graph.stage_names)
    for stage, p in params.items():
        if stage not in names or served.engine_of(stage) != "diffusers":
            continue  # validate_request names the stages that exist
        model = served.diffusion_model(stage)
        if model is None:
            continue  # the engine judges it (it raises rather than ignore)
        merged = merge_params(served.pipeline.stage(stage).sampling, p)
        refused = refusal(model, merged)
        if refused is not None:
            param, why = refused
            raise ApiError(
                400,
                f"{param} is not supported by stage {stage!r} of pipeline {served.model!r}: {why}.",
                param=param,
                code="unsupported_parameter",
            )


# --------------------------------------------------------------------------
# The sampling fields of chat and completions
# --------------------------------------------------------------------------


def _logit_bias(body: SamplingFields) -> dict[int, float] | None:
    if body.logit_bias is None:
        return None
    if len(body.logit_bias) > MAX_LOGIT_BIAS:
        raise bad("logit_bias", f"logit_bias has more than {MAX_LOGIT_BIAS} entries.")
    out: dict[int, float] = {}
    for key, v in body.logit_bias.items():
        if not key.isascii() or not key.isdigit() or len(key) > 9:
            raise bad(
                "logit_bias",
                f"logit_bias key {key!r} is not a token id: keys are token ids as strings "
                '(e.g. {"50256": -100}).',
            )
        out[int(key)] = v
    return out or None


def sampling_extras(
    body: SamplingFields,
    *,
    temperature: float | None,
    top_p: float | None,
    stop: Stop | None,
    max_tokens: int | None,
    logprobs: int | None,
) -> StageParams:
    """The body's sampling fields as the text stage's ``StageParams``
    (``None``: not given, the stage's default); the fields chat and
    completions spell differently come as arguments."""
    json_schema = None
    json_object = None
    fmt = body.response_format
    if isinstance(fmt, JsonObjectFormat):
        json_object = True
    elif isinstance(fmt, JsonSchemaResponseFormat):
        json_schema = msgspec.json.encode(fmt.json_schema.schema).decode()
    # min_tokens above max_tokens is capped at it by the engine.
    return StageParams(
        temperature=temperature,
        top_p=top_p,
        top_k=body.top_k,
        max_tokens=max_tokens,
        stop=(stop,) if isinstance(stop, str) else (tuple(stop) if stop is not None else None),
        min_tokens=body.min_tokens,
        min_p=body.min_p,
        repetition_penalty=body.repetition_penalty,
        frequency_penalty=body.frequency_penalty,
        presence_penalty=body.presence_penalty,
        stop_token_ids=tuple(body.stop_token_ids) if body.stop_token_ids is not None else None,
        include_stop_str_in_output=body.include_stop_str_in_output,
        skip_special_tokens=body.skip_special_tokens,
        spaces_between_special_tokens=body.spaces_between_special_tokens,
        ignore_eos=body.ignore_eos,
        logit_bias=_logit_bias(body),
        logprobs=logprobs,
        json_schema=json_schema,
        json_object=json_object,
    )


def text_params(
    served: PlanContext, given: SamplingParamsList | None, stage: str, base: StageParams
) -> dict[str, StageParams]:
    """Every stage's parameters: ``sampling_params_list``, the top-level
    ones put on the text ``stage``; 400 for one a stage's engine cannot
    honour."""
    params = stage_params(served, given)
    put(params, stage, base)
    check_engines(served, params)
    return params
