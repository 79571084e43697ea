"""What one request needs from a pipeline, and whether it may ask for it.

Owns: ``PipelineGraph`` (the config's edges as ordered adjacency, computed
once), ``needed_stages`` (the stages on the paths to the requested
outputs), request validation against the pipeline (``RequestError``) and
merging stage defaults with per-request overrides.  Pure functions of the
config: the orchestrator's decisions rely on them.
"""

from __future__ import annotations

from functools import cached_property

import msgspec

from omnix.events.types import RequestSpec, StageParams
from omnix.pipelines.config import EdgeConfig, PipelineConfig

_MODALITIES = ("text", "audio", "image", "codec")


class RequestError(ValueError):
    """A request the pipeline cannot serve.  ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class PipelineGraph:
    """Ordered views of a validated pipeline's graph (declaration order)."""

    def __init__(self, cfg: PipelineConfig) -> None:
        self.cfg = cfg
        self.stage_names: tuple[str, ...] = tuple(st.name for st in cfg.stages)
        self.order = {n: i for i, n in enumerate(self.stage_names)}
        self.in_edges: dict[str, tuple[EdgeConfig, ...]] = {
            n: tuple(e for e in cfg.edges if e.target == n) for n in self.stage_names
        }
        self.out_edges: dict[str, tuple[EdgeConfig, ...]] = {
            n: tuple(e for e in cfg.edges if e.source == n) for n in self.stage_names
        }
        self._needed: dict[tuple[str, ...], tuple[str, ...]] = {}

    @cached_property
    def modalities(self) -> tuple[str, ...]:
        return tuple(self.cfg.outputs)

    def needed_stages(self, outputs: tuple[str, ...]) -> tuple[str, ...]:
        """Stages needed to produce ``outputs``, in declaration order."""
        key = tuple(outputs)
        hit = self._needed.get(key)
        if hit is not None:
            return hit
        need: set[str] = set()
        todo = [self.cfg.outputs[m] for m in key if m in self.cfg.outputs]
        while todo:
            n = todo.pop()
            if n in need:
                continue
            need.add(n)
            todo.extend(e.source for e in self.in_edges[n])
        result = tuple(n for n in self.stage_names if n in need)
        self._needed[key] = result
        return result

    def sources(self, needed: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(n for n in needed if not self.in_edges[n])


def merge_params(defaults: StageParams, override: StageParams | None) -> StageParams:
    """Stage defaults with the request's non-None fields on top."""
    if override is None:
        return defaults
    changes = {
        f: getattr(override, f)
        for f in override.__struct_fields__
        if getattr(override, f) is not None
    }
    return msgspec.structs.replace(defaults, **changes) if changes else defaults


def validate_request(graph: PipelineGraph, spec: RequestSpec) -> None:
    """Raise ``RequestError`` for a request this pipeline cannot serve."""
    cfg = graph.cfg
    if not spec.outputs:
        raise RequestError("at least one output modality is required", "modalities")
    for m in spec.outputs:
        if m not in cfg.outputs:
            can = ", ".join(cfg.outputs) or "nothing"
            raise RequestError(
                f"pipeline {cfg.name!r} cannot produce {m!r} output (it produces: {can}): "
                f"ask for {can} only, or serve a pipeline with a {m} output",
                "modalities",
                "unsupported_modality",
            )
    if len(set(spec.outputs)) != len(spec.outputs):
        raise RequestError("each output modality may be asked for once", "modalities")
    if not spec.prompt and not spec.messages and not spec.input_streams:
        # (A request whose input streams may start with none: a full-duplex
        # session's comes frame by frame.)
        raise RequestError("the request has no input: give a prompt or messages", "messages")
    needed = graph.needed_stages(tuple(spec.outputs))
    for stage, params in spec.stage_params.items():
        if stage not in graph.order:
            raise RequestError(
                f"sampling parameters for unknown stage {stage!r} "
                f"(stages: {', '.join(graph.stage_names)})",
                "sampling_params_list",
            )
        _check_params(params, f"sampling_params_list.{stage}")
    if spec.deadline_ms < 0:
        raise RequestError("deadline must be >= 0 ms", "deadline_ms")
    if not (0 <= spec.seed < 2**63):
        raise RequestError("seed must be in [0, 2**63)", "seed")
    del needed


def _check_params(p: StageParams, where: str) -> None:
    def bad(field: str, why: str) -> RequestError:
        return RequestError(f"{where}.{field} {why}", field)

    if p.temperature is not None and not (0.0 <= p.temperature <= 2.0):
        raise bad("temperature", "must be between 0 and 2")
    if p.top_p is not None and not (0.0 < p.top_p <= 1.0):
        raise bad("top_p", "must be in (0, 1]")
    if p.top_k is not None and not (-1 <= p.top_k < 2**31):
        raise bad("top_k", "must be -1 (off) or a positive 32-bit integer")
    if p.max_tokens is not None and not (1 <= p.max_tokens <= 1_000_000):
        raise bad("max_tokens", "must be a positive integer")
    if p.num_inference_steps is not None and not (1 <= p.num_inference_steps <= 1000):
        raise bad("num_inference_steps", "must be between 1 and 1000")
    for dim, v in (("width", p.width), ("height", p.height)):
        if v is not None and not (8 <= v <= 4096 and v % 8 == 0):
            raise bad(dim, "must be a multiple of 8 between 8 and 4096")
    if p.speed is not None and not (0.25 <= p.speed <= 4.0):
        raise bad("speed", "must be between 0.25 and 4.0")
    if p.seed is not None and not (0 <= p.seed < 2**63):
        raise bad("seed", "must be in [0, 2**63)")
    # schema v5: vLLM's and OpenAI's sampling extras (the HTTP body's ranges)
    if p.min_tokens is not None and not (0 <= p.min_tokens <= 1_000_000):
        raise bad("min_tokens", "must be between 0 and 1000000")
    if p.min_p is not None and not (0.0 <= p.min_p <= 1.0):
        raise bad("min_p", "must be between 0 and 1")
    if p.repetition_penalty is not None and not (0.0 < p.repetition_penalty <= 10.0):
        raise bad("repetition_penalty", "must be in (0, 10]")
    for name, pen in (
        ("frequency_penalty", p.frequency_penalty),
        ("presence_penalty", p.presence_penalty),
    ):
        if pen is not None and not (-2.0 <= pen <= 2.0):
            raise bad(name, "must be between -2 and 2")
    if p.stop_token_ids is not None and (
        len(p.stop_token_ids) > 64 or any(not (0 <= t < 2**31) for t in p.stop_token_ids)
    ):
        raise bad("stop_token_ids", "must be at most 64 token ids, each in [0, 2**31)")
    if p.logit_bias is not None and (
        len(p.logit_bias) > 300
        or any(not (0 <= k < 10**9) or not (-100.0 <= v <= 100.0) for k, v in p.logit_bias.items())
    ):
        raise bad("logit_bias", "must map at most 300 token ids to biases between -100 and 100")
    if p.logprobs is not None and not (0 <= p.logprobs <= 20):
        raise bad("logprobs", "must be between 0 and 20")
    # schema v7: diffusion (the HTTP bodies' ranges)
    if p.strength is not None and not (0.0 < p.strength <= 1.0):
        raise bad("strength", "must be in (0, 1]")
    if p.partial_images is not None and not (0 <= p.partial_images <= 3):
        raise bad("partial_images", "must be between 0 and 3")
    if p.num_frames is not None and not (1 <= p.num_frames <= 10000):
        raise bad("num_frames", "must be between 1 and 10000")
    if p.fps is not None and not (1 <= p.fps <= 120):
        raise bad("fps", "must be between 1 and 120")
    if p.json_schema is not None:
        try:
            schema = msgspec.json.decode(p.json_schema)
        except msgspec.DecodeError:
            schema = None
        if not isinstance(schema, dict):
            raise bad("json_schema", "must be a JSON Schema object, as JSON text")
