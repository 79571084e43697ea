"""``omnix generate``: one request through a pipeline, without HTTP.

Owns: the verb's arguments, streaming text to the terminal as it arrives,
and writing audio (WAV) and images (PNG) to files.  The work is the offline
API's (``omnix.api.Omni``); this module only adapts a command line to it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from omnix.pipelines.registry import DEFAULT_PIPELINE


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
        "--seed", type=int, default=None, help="sampling seed (default: random, printed)"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="max tokens for every AR stage"
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


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_generate(args))


async def _generate(args: argparse.Namespace) -> int:
    from omnix.api import Omni, Overloaded, new_seed
    from omnix.events.types import RequestSpec, StageParams
    from omnix.models.prepare import prepare_models
    from omnix.pipelines.plan import RequestError
    from omnix.pipelines.validate import PipelineError, load_pipeline

    try:
        pipeline = load_pipeline(args.pipeline)
    except PipelineError as exc:
        print(exc, file=sys.stderr)
        return 2
    prepare_models(pipeline, args.model_dir)
    outputs = tuple(args.outputs.split(",")) if args.outputs else tuple(pipeline.outputs)
    seed = new_seed() if args.seed is None else args.seed
    params = {}
    if args.max_tokens is not None:
        params = {
            st.name: StageParams(max_tokens=args.max_tokens)
            for st in pipeline.stages
            if type(st.engine).__struct_config__.tag in ("vllm", "scripted")
        }
    spec = RequestSpec(
        prompt=args.prompt, outputs=outputs, stage_params=params, seed=seed, api="offline"
    )
    print(f"pipeline {pipeline.name}, seed {seed}; starting workers...", file=sys.stderr)
    async with Omni(pipeline, log_dir=args.log_dir) as omni:
        try:
            ev = omni.submit(spec)
        except RequestError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            return 2
        rid = ev.request_id
        print(f"request {rid}", file=sys.stderr)
        audio = []
        image = b""
        async for out in omni.stream(rid):
            if out.modality == "text":
                sys.stdout.write(out.text)
                sys.stdout.flush()
            elif out.modality == "audio" and out.array is not None:
                audio.append(out.array)
            elif out.modality == "image":
                image = out.data
        try:
            result = await omni.collect(rid)
        except Overloaded as exc:
            print(f"\nrefused: {exc}", file=sys.stderr)
            return 1
        print()
        if result.audio is not None:
            import soundfile

            sr = getattr(pipeline.stage(pipeline.outputs["audio"]).engine, "sample_rate", 24000)
            soundfile.write(args.audio_out, result.audio, sr)
            print(
                f"audio: {args.audio_out} ({len(result.audio) / sr:.2f} s at {sr} Hz)",
                file=sys.stderr,
            )
        if image:
            args.image_out.write_bytes(image)
            print(f"image: {args.image_out}", file=sys.stderr)
        print(f"{result.status}{': ' + result.reason if result.reason else ''}", file=sys.stderr)
        return 0 if result.ok else 1
