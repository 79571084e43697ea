"""What ``omnix serve`` serves: the pipeline its flags name, their settings on it.

Owns ``served_pipeline``: which pipeline (a model folder given as ``PATH``
or ``--model``, derived by ``omnix.pipelines.folder``; else ``--pipeline``,
a built-in name or a file; else the default); vLLM's engine flags the
command line gave, put into every vLLM stage's ``engine_args`` (over the
stage's own) and ``--chat-template`` into their ``chat_template``;
vLLM's parser flags (``--enable-auto-tool-choice``, ``--tool-call-parser``,
``--reasoning-parser``) into every vLLM stage writing text;
``--stage-devices`` into the stages' ``devices``; ``--cache``,
``--cfg-batch`` and ``--compile`` into the diffusion stages' ``cache``,
``cfg_batch`` and ``compile``;
the names the server
answers to (``--served-model-name``, else the folder's or pipeline's
name; the pipeline is named after the first, so every response, log line
and trace says what the client asked for); validation of the result; and
``check_with_vllm``: vLLM's own verdict on each vLLM stage before any
engine starts (``omnix.engines.vllm_check``), skipped for a built-in
pipeline served as shipped.  Every problem is a one-line ``UsageError``.

Does not own the flags' definitions (``serve.py``, and vLLM's own via
``omnix.pipelines.vllm_args``) nor what a stage's settings mean.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from omnix.pipelines.config import DiffusersArgs, PipelineConfig, StageConfig, VllmArgs
from omnix.usage import UsageError


@dataclass(frozen=True)
class ServedPipeline:
    pipeline: PipelineConfig
    #: the names the server answers to; the first is the pipeline's
    names: tuple[str, ...]
    #: a built-in served as shipped: nothing the user wrote reaches vLLM
    shipped: bool


def engine_flags(args: argparse.Namespace) -> dict[str, Any]:
    """vLLM's engine flags the command line (or ``--config``) gave."""
    return {d: getattr(args, d) for d in getattr(args, "_vllm_dests", ()) if hasattr(args, d)}


def served_pipeline(args: argparse.Namespace) -> ServedPipeline:
    from omnix.pipelines.folder import FolderError, derive_pipeline
    from omnix.pipelines.registry import DEFAULT_PIPELINE, builtin_path
    from omnix.pipelines.validate import PipelineError, load_pipeline, validate_pipeline

    folder = _model_folder(args)
    flags = engine_flags(args)
    try:
        if folder is not None:
            from omnix.pipelines.devices import visible_gpus

            pipeline = derive_pipeline(folder, gpu=bool(visible_gpus()))
        else:
            pipeline = load_pipeline(args.pipeline or DEFAULT_PIPELINE)
    except (FolderError, PipelineError) as bad:
        raise UsageError(str(bad)) from None
    names = _names(flags.get("served_model_name"), pipeline.name)
    pipeline = _with_flags(pipeline, flags, args.chat_template, args.stage_devices or [])
    pipeline = _with_parsers(pipeline, _parser_flags(args))
    pipeline = _with_caches(pipeline, getattr(args, "cache", None) or [])
    pipeline = _with_cfg_batch(pipeline, getattr(args, "cfg_batch", None) or [])
    pipeline = _with_compile(pipeline, getattr(args, "compile", None) or [])
    pipeline = msgspec.structs.replace(pipeline, name=names[0])
    try:
        validate_pipeline(pipeline, "(as served)")
    except PipelineError as bad:
        raise UsageError(str(bad)) from None
    shipped = (
        folder is None
        and builtin_path(args.pipeline or DEFAULT_PIPELINE) is not None
        and not os.path.exists(args.pipeline or DEFAULT_PIPELINE)
        and not flags
        and not args.chat_template
        and not _parser_flags(args)
    )
    return ServedPipeline(pipeline, names, shipped)


def check_with_vllm(served: ServedPipeline) -> None:
    """vLLM's verdict on each vLLM stage (``UsageError``, vLLM's message)."""
    if served.shipped or not any(isinstance(s.engine, VllmArgs) for s in served.pipeline.stages):
        return
    from omnix.engines.vllm_check import vllm_problems

    problems = vllm_problems(served.pipeline)
    if problems:
        raise UsageError("; ".join(problems))


def check_diffusion_caches(pipeline: PipelineConfig) -> None:
    """A diffusion stage's cache asked of a pipeline family diffusers'
    hooks do not run on, or ``cfg_batch`` on one omnix does not batch the
    guidance of: one ``UsageError`` line naming what works (the model
    folder's pipeline class, read without torch)."""
    from omnix.engines.diffusers_model import describe_model
    from omnix.pipelines.diffusion_cache import cfg_batch_problem, family_problem

    for st in pipeline.stages:
        eng = st.engine
        if isinstance(eng, DiffusersArgs) and (eng.cache is not None or eng.cfg_batch):
            model = describe_model(eng)
            if model is None:
                continue
            problem = family_problem(eng.cache, model.pipeline) or cfg_batch_problem(
                eng.cfg_batch, model.pipeline
            )
            if problem is not None:
                raise UsageError(f"stage {st.name!r}: {problem}")


def _model_folder(args: argparse.Namespace) -> str | None:
    given = [p for p in (args.model_path, args.model) if p]
    if len(set(given)) > 1:
        raise UsageError(
            f"two model folders: {given[0]} and --model {given[1]}: give one (PATH or --model)"
        )
    if given and args.pipeline:
        raise UsageError(
            f"a model folder ({given[0]}) and --pipeline {args.pipeline}: give one; to serve a "
            "folder with an edited pipeline, save `omnix pipelines show --model PATH`, edit it "
            "and give --pipeline FILE"
        )
    return given[0] if given else None


def _names(given: Any, default: str) -> tuple[str, ...]:
    if isinstance(given, str):
        given = [given]
    names = tuple(dict.fromkeys(str(n) for n in given or () if str(n).strip()))
    return names or (default,)


def _with_flags(
    pipeline: PipelineConfig, flags: dict[str, Any], chat_template: str | None, devices: list[str]
) -> PipelineConfig:
    """The pipeline with the command line's settings on its stages."""
    placed = _stage_devices(pipeline, devices)
    template = chat_template or ""
    if template and os.path.isfile(template):
        template = os.path.abspath(template)  # the workers may run elsewhere in the tree
    stages = []
    for st in pipeline.stages:
        changes: dict[str, Any] = {}
        if st.name in placed:
            changes["devices"] = placed[st.name]
        eng = st.engine
        if isinstance(eng, VllmArgs) and (flags or template):
            more: dict[str, Any] = {"engine_args": {**eng.engine_args, **flags}}
            if template:
                more["chat_template"] = template
            changes["engine"] = msgspec.structs.replace(eng, **more)
        stages.append(msgspec.structs.replace(st, **changes) if changes else st)
    _check_flags_apply(pipeline.stages, flags)
    return msgspec.structs.replace(pipeline, stages=tuple(stages))


def _parser_flags(args: argparse.Namespace) -> dict[str, Any]:
    """vLLM's parser flags given on the command line, as ``VllmArgs`` fields."""
    given = {
        "enable_auto_tool_choice": getattr(args, "enable_auto_tool_choice", None),
        "tool_call_parser": getattr(args, "tool_call_parser", None),
        "reasoning_parser": getattr(args, "reasoning_parser", None),
    }
    return {k: v for k, v in given.items() if v is not None}


def _with_parsers(pipeline: PipelineConfig, parsers: dict[str, Any]) -> PipelineConfig:
    """The parser flags on every vLLM stage that writes text (a talker's
    codes are not parsed)."""
    if not parsers:
        return pipeline

    def text(st: StageConfig) -> bool:
        return isinstance(st.engine, VllmArgs) and st.engine.output_modality == "text"

    if not any(text(st) for st in pipeline.stages):
        raise UsageError(
            f"{', '.join('--' + k.replace('_', '-') for k in parsers)}: the pipeline "
            f"{pipeline.name!r} has no vLLM stage writing text to parse"
        )
    stages = tuple(
        msgspec.structs.replace(st, engine=msgspec.structs.replace(st.engine, **parsers))
        if text(st)
        else st
        for st in pipeline.stages
    )
    return msgspec.structs.replace(pipeline, stages=stages)


def _check_flags_apply(stages: tuple[StageConfig, ...], flags: dict[str, Any]) -> None:
    """Engine flags for a pipeline without a vLLM stage would be dropped:
    an error, but for --served-model-name, which names the server too."""
    engine = [k for k in flags if k != "served_model_name"]
    if engine and not any(isinstance(st.engine, VllmArgs) for st in stages):
        shown = ", ".join("--" + k.replace("_", "-") for k in engine)
        raise UsageError(f"{shown}: vLLM's engine flags, but the pipeline has no vLLM stage")


def _with_caches(pipeline: PipelineConfig, specs: list[str]) -> PipelineConfig:
    """``--cache [STAGE:]KIND[,OPT=VALUE...]`` on the diffusion stages it
    names (all of them without a stage), over the file's own ``cache``."""
    from omnix.pipelines.diffusion_cache import parse_cache_spec

    return _on_diffusion_stages(pipeline, "--cache", "cache", specs, parse_cache_spec)


def _with_cfg_batch(pipeline: PipelineConfig, specs: list[str]) -> PipelineConfig:
    """``--cfg-batch [STAGE:]on|off`` on the diffusion stages it names (all
    of them without a stage), over the file's own ``cfg_batch``."""
    from omnix.pipelines.diffusion_cache import parse_cfg_batch_spec

    return _on_diffusion_stages(pipeline, "--cfg-batch", "cfg_batch", specs, parse_cfg_batch_spec)


def _with_compile(pipeline: PipelineConfig, specs: list[str]) -> PipelineConfig:
    """``--compile [STAGE:]off|blocks|model`` on the diffusion stages it
    names (all of them without a stage), over the file's own ``compile``."""
    from omnix.pipelines.diffusion_cache import parse_compile_spec

    return _on_diffusion_stages(pipeline, "--compile", "compile", specs, parse_compile_spec)


def _on_diffusion_stages(
    pipeline: PipelineConfig,
    flag: str,
    field: str,
    specs: list[str],
    parse: Callable[[str], tuple[str | None, Any]],
) -> PipelineConfig:
    """Each ``flag`` spec (``[STAGE:]VALUE``, parsed by ``parse``) sets the
    engine ``field`` of the diffusion stage it names, or of every one."""
    diffusion = [st.name for st in pipeline.stages if isinstance(st.engine, DiffusersArgs)]
    chosen: dict[str, Any] = {}
    for spec in specs:
        try:
            stage, value = parse(spec)
        except ValueError as bad:
            raise UsageError(str(bad)) from None
        if stage is not None and stage not in diffusion:
            raise UsageError(
                f"{flag} {spec!r}: {stage!r} is not a diffusion stage of the pipeline "
                f"(diffusion stages: {', '.join(diffusion) or 'none'})"
            )
        if not diffusion:
            raise UsageError(f"{flag} {spec!r}: the pipeline has no diffusion stage")
        for name in [stage] if stage is not None else diffusion:
            chosen[name] = value
    stages = []
    for st in pipeline.stages:
        if st.name in chosen and isinstance(st.engine, DiffusersArgs):
            engine = msgspec.structs.replace(st.engine, **{field: chosen[st.name]})
            st = msgspec.structs.replace(st, engine=engine)
        stages.append(st)
    return msgspec.structs.replace(pipeline, stages=tuple(stages))


def _stage_devices(pipeline: PipelineConfig, given: list[str]) -> dict[str, str]:
    """``--stage-devices thinker=0,1`` -> ``{"thinker": "0,1"}``."""
    names = [st.name for st in pipeline.stages]
    out: dict[str, str] = {}
    for item in given:
        stage, sep, devices = item.partition("=")
        if not sep or stage.strip() not in names:
            raise UsageError(
                f"--stage-devices {item!r}: give STAGE=DEVICES with a stage of the pipeline "
                f"({', '.join(names)}), e.g. {names[0]}=0,1"
            )
        out[stage.strip()] = devices.strip()
    return out
