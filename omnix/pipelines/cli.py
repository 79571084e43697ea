"""``omnix pipelines``: list, show and validate pipeline configs.

Owns: the verb's arguments and printing (a summary, JSON, or a TOML
pipeline file; ``show --model PATH`` prints what ``omnix serve PATH``
serves).  Loading and validation are ``validate.py``'s, deriving a
folder's pipeline ``folder.py``'s.
"""

from __future__ import annotations

import argparse
import sys

import msgspec

from omnix.pipelines.config import (
    DiffusersArgs,
    PipelineConfig,
    ReplicaRange,
    engine_kind,
    engine_model,
)
from omnix.pipelines.diffusion_cache import cache_kind
from omnix.pipelines.registry import DEFAULT_PIPELINE, builtin_names
from omnix.pipelines.toml_out import pipeline_toml
from omnix.pipelines.validate import PipelineError, load_pipeline, stage_output_modality
from omnix.usage import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.add_parser("list", help="list the built-in pipelines")
    show = sub.add_parser("show", help="print a pipeline's stages, edges and outputs")
    show.set_defaults(_prog=show.prog)
    show.add_argument(
        "pipeline",
        nargs="?",
        default=None,
        help=f"built-in name or config path (default: {DEFAULT_PIPELINE})",
    )
    show.add_argument(
        "--model",
        default=None,
        metavar="PATH",
        help="the pipeline `omnix serve PATH` derives from a model folder, as TOML that "
        "`omnix serve --pipeline FILE` serves unchanged",
    )
    show.add_argument("--json", action="store_true", help="print the decoded config as JSON")
    show.add_argument(
        "--toml", action="store_true", help="print the config as TOML (a pipeline file)"
    )
    val = sub.add_parser(
        "validate", help="check config files (all of them); exit 1 if any is invalid"
    )
    val.add_argument("pipelines", nargs="+", help="built-in names or config paths")


def _shown(args: argparse.Namespace) -> PipelineConfig:
    """The pipeline ``show`` prints: derived from ``--model``, else loaded."""
    if args.model and args.pipeline:
        raise UsageError(f"give a pipeline ({args.pipeline}) or --model {args.model}, not both")
    try:
        if args.model:
            from omnix.pipelines.devices import visible_gpus
            from omnix.pipelines.folder import FolderError, derive_pipeline

            try:
                return derive_pipeline(args.model, gpu=bool(visible_gpus()))
            except FolderError as exc:
                raise UsageError(str(exc)) from None
        return load_pipeline(args.pipeline or DEFAULT_PIPELINE)
    except PipelineError as exc:
        raise UsageError(str(exc)) from None


def _header(args: argparse.Namespace) -> str:
    if not args.model:
        return ""
    return (
        f"The pipeline `omnix serve {args.model}` serves (derived on this machine).\n"
        f"Edit it and serve it with: omnix serve --pipeline THIS_FILE"
    )


def run(args: argparse.Namespace) -> int:
    action = args.action or "list"
    if action == "list":
        for name in builtin_names():
            cfg = load_pipeline(name)
            mark = " (default)" if name == DEFAULT_PIPELINE else ""
            print(f"{name:12s} {cfg.description}{mark}")
        return 0
    if action == "show":
        cfg = _shown(args)
        if args.json:
            print(msgspec.json.format(msgspec.json.encode(cfg).decode()))
            return 0
        if args.toml or args.model:
            print(pipeline_toml(cfg, _header(args)), end="")
            return 0
        print(f"pipeline {cfg.name}: {cfg.description}")
        for st in cfg.stages:
            kind = engine_kind(st.engine)
            model = engine_model(st.engine) or ""
            out = stage_output_modality(cfg, st.name) or "?"
            print(
                f"  stage {st.name:10s} {kind:9s} {model:12s} -> {out:6s} replicas={_replicas(st.replicas)} "
                f"timeout={st.timeout_s:g}s retry={'yes, up to ' + str(st.max_retries) if st.retries else 'no'}"
            )
            eng = st.engine
            if isinstance(eng, DiffusersArgs) and (
                eng.cache is not None or eng.compile != "off" or eng.cfg_batch is not None
            ):
                cache = cache_kind(eng.cache) if eng.cache is not None else "none"
                paired = {None: "auto", True: "on", False: "off"}[eng.cfg_batch]
                print(f"        step cache {cache}, compile {eng.compile}, cfg batch {paired}")
        media = cfg.input_media
        if media is not None:
            kinds = [k for k, on in (("audio", media.audio), ("image", media.image)) if on]
            print(
                f"  input text+{'+'.join(kinds)}: up to {media.max_part_bytes / 2**20:g} MB a part, "
                f"{media.max_audio_seconds:g} s of audio, {media.max_pixels:,} pixels"
            )
        for e in cfg.edges:
            how = (
                f"every {e.every} chunks"
                if e.forward == "chunk"
                else ("at sentence ends" if e.forward == "sentence" else "when the source finishes")
            )
            print(f"  edge  {e.source} -> {e.target}: forward {how}")
        for m, s in cfg.outputs.items():
            print(f"  output {m}: {s}")
        return 0
    bad = 0
    for p in args.pipelines:
        try:
            load_pipeline(p)
            print(f"ok       {p}")
        except PipelineError as exc:
            print(exc, file=sys.stderr)
            bad += 1
    return 1 if bad else 0


def _replicas(r: int | ReplicaRange) -> str:
    """``2``, or ``1..4`` for a stage that scales."""
    return str(r) if isinstance(r, int) else f"{r.min}..{r.max}"
