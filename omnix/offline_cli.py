"""``omnix generate``: one request through a pipeline, without HTTP.

Owns: the verb's arguments, streaming text to the terminal as it arrives,
and writing audio (WAV) and images (PNG) to files.  The work is the offline
API's (``omnix.api.Omni``); this module only adapts a command line to it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from omnix.pipelines.registry import DEFAULT_PIPELINE
from omnix.usage import UsageError, int_in

if TYPE_CHECKING:
    import numpy as np

    from omnix.api import Omni
    from omnix.events.types import RequestSpec
    from omnix.pipelines.config import PipelineConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the text prompt")
    parser.add_argument(
        "--pipeline",
        default=DEFAULT_PIPELINE,
        help=f"built-in name or config path (default {DEFAULT_PIPELINE})",
    )
    parser.add_argument(
        "--outputs",
        default=None,
        help="comma-separated modalities (default: every output the pipeline has)",
    )
    parser.add_argument(
        "--seed",
        type=int_in(0, 2**63 - 1, "a seed"),
        default=None,
        help="sampling seed (default: random, printed)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int_in(1, what="a token count"),
        default=None,
        help="max tokens for every AR stage",
    )
    parser.add_argument(
        "--audio-out", type=Path, default=Path("omnix-out.wav"), help="where audio goes (WAV)"
    )
    parser.add_argument(
        "--image-out", type=Path, default=Path("omnix-out.png"), help="where an image goes (PNG)"
    )
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="keep the event log here (for `omnix trace export`)",
    )
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="where the tiny models are (built if missing)"
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds the workers get to load their models (default 600)",
    )


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_generate(args))


async def _generate(args: argparse.Namespace) -> int:
    from omnix.api import NotReady, Omni
    from omnix.events.disklog import LogError
    from omnix.events.types import Rejected
    from omnix.models.prepare import prepare_models
    from omnix.pipelines.plan import RequestError, validate_request
    from omnix.pipelines.validate import PipelineError, load_pipeline
    from omnix.stages.options import RuntimeOptions
    from omnix.stages.runtime import WorkerStartError

    try:
        pipeline = load_pipeline(args.pipeline)
        omni = Omni(
            pipeline,
            log_dir=args.log_dir,
            runtime_options=RuntimeOptions(start_timeout_s=args.start_timeout),
        )
    except (PipelineError, LogError) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # --log-dir
        raise UsageError(
            f"--log-dir {args.log_dir}: cannot keep the log there ({exc.strerror or exc})"
        ) from None
    spec = _spec(args, pipeline)
    try:
        # Everything the user gave is checked before the workers start (and
        # long before the run ends): the request, and where its outputs go.
        validate_request(omni.graph, spec)
        _check_outputs(args, spec.outputs)
        prepare_models(pipeline, args.model_dir)
    except RequestError as exc:
        omni.log.close()
        raise UsageError(exc.message) from None
    except BaseException:
        omni.log.close()
        raise
    print(f"pipeline {pipeline.name}, seed {spec.seed}; starting workers...", file=sys.stderr)
    try:
        await omni.start()
        await omni.wait_ready(args.start_timeout)
    except (WorkerStartError, NotReady) as exc:
        await omni.shutdown()
        raise UsageError(f"the pipeline did not start: {exc}", code=1) from None
    try:
        ev = omni.submit(spec)
        if isinstance(ev, Rejected):
            print(f"refused: {ev.reason}: {ev.message}", file=sys.stderr)
            return 1
        print(f"request {ev.request_id}", file=sys.stderr)
        image = await _stream(omni, ev.request_id)
        result = await omni.collect(ev.request_id)
        print()
        _write_outputs(args, omni, result.audio, image)
        print(f"{result.status}{': ' + result.reason if result.reason else ''}", file=sys.stderr)
        return 0 if result.ok else 1
    finally:
        await omni.shutdown()


def _spec(args: argparse.Namespace, pipeline: PipelineConfig) -> RequestSpec:
    from omnix.api import new_seed
    from omnix.events.types import RequestSpec, StageParams

    outputs = tuple(args.outputs.split(",")) if args.outputs else tuple(pipeline.outputs)
    params = {}
    if args.max_tokens is not None:
        params = {
            st.name: StageParams(max_tokens=args.max_tokens)
            for st in pipeline.stages
            if type(st.engine).__struct_config__.tag in ("vllm", "scripted")
        }
    seed = new_seed() if args.seed is None else args.seed
    return RequestSpec(
        prompt=args.prompt, outputs=outputs, stage_params=params, seed=seed, api="offline"
    )


def _check_outputs(args: argparse.Namespace, outputs: tuple[str, ...]) -> None:
    """The files the request's audio and image go to can be written."""
    wanted = (
        ("audio", "--audio-out", args.audio_out, "wav"),
        ("image", "--image-out", args.image_out, "png"),
    )
    for modality, flag, path, suffix in wanted:
        if modality not in outputs:
            continue
        folder = path.parent
        if path.is_dir():
            raise UsageError(
                f"{flag} {path} is a folder: give a file, e.g. {path / f'out.{suffix}'}"
            )
        if not folder.is_dir():
            raise UsageError(
                f"{flag} {path}: there is no folder {folder}: create it or give another path"
            )
        if not os.access(folder, os.W_OK):
            raise UsageError(f"{flag} {path}: the folder {folder} is not writable")


async def _stream(omni: Omni, rid: str) -> bytes:
    """Print text as it streams; the last image (audio is collected whole)."""
    image = b""
    async for out in omni.stream(rid):
        if out.modality == "text":
            sys.stdout.write(out.text)
            sys.stdout.flush()
        elif out.modality == "image":
            image = out.data
    return image


def _write_outputs(
    args: argparse.Namespace, omni: Omni, audio: np.ndarray | None, image: bytes
) -> None:
    pipeline = omni.pipeline
    if audio is not None:
        import soundfile

        sr = getattr(pipeline.stage(pipeline.outputs["audio"]).engine, "sample_rate", 24000)
        soundfile.write(args.audio_out, audio, sr)
        print(f"audio: {args.audio_out} ({len(audio) / sr:.2f} s at {sr} Hz)", file=sys.stderr)
    if image:
        args.image_out.write_bytes(image)
        print(f"image: {args.image_out}", file=sys.stderr)
