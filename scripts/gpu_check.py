"""GPU check of the torch-side engines: the codec decoder and the diffusers
engine, on CUDA, once, with figures.

Owns: nothing the product uses; a script for a machine with a GPU (no vLLM
needed).  Prints decode time per second of audio (streamed and one-shot),
whether streaming stays bit-identical to one-shot on CUDA, how far CUDA is
from CPU, and ms/step of the tiny Flux pipeline at 64x64 and 512x512 through
``DiffusersEngine`` (progress reports and abort included).

    PYTHONPATH=. python scripts/gpu_check.py --models DIR [--json OUT]

DIR holds the tiny models (``omnix models init --dir DIR``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def codec_figures(models: Path, device: str) -> dict:
    import torch

    from omnix.models.codec import CodecStream, load_codec

    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    dec = load_codec(models / "code2wav", device)
    cfg = dec.config
    frames_per_s = cfg.sample_rate / cfg.hop
    rng = np.random.default_rng(0)
    seconds = 10
    codes = rng.integers(0, cfg.codebook_size, size=int(frames_per_s * seconds) * cfg.num_codebooks)
    dec.decode(codes[: 8 * cfg.num_codebooks * 4])  # warm-up (kernels, allocator)
    _sync()
    t = time.perf_counter()
    ref = dec.decode(codes)
    _sync()
    one_shot = (time.perf_counter() - t) / seconds
    t = time.perf_counter()
    full = dec.decode_full(codes)
    _sync()
    one_pass = (time.perf_counter() - t) / seconds
    # Streamed as a talker would feed it: one frame per piece.
    t = time.perf_counter()
    stream = CodecStream(dec)
    parts = [stream.push(codes[i : i + cfg.num_codebooks]) for i in range(0, codes.size, cfg.num_codebooks)]
    _sync()
    per_frame = (time.perf_counter() - t) / seconds
    streamed = np.concatenate(parts)
    exact = [bool(np.array_equal(streamed, ref))]
    for trial in range(5):
        r = np.random.default_rng(100 + trial)
        stream, parts, i = CodecStream(dec), [], 0
        while i < codes.size:
            n = int(r.integers(1, 200))
            parts.append(stream.push(codes[i : i + n]))
            i += n
        exact.append(bool(np.array_equal(np.concatenate(parts), ref)))
    cpu = load_codec(models / "code2wav", "cpu").decode(codes[: 2 * 75 * cfg.num_codebooks])
    return {
        "device": device,
        "audio_seconds": seconds,
        "blockwise_decode_ms_per_audio_s": round(one_shot * 1e3, 3),
        "one_pass_decode_ms_per_audio_s": round(one_pass * 1e3, 3),
        "streamed_frame_by_frame_ms_per_audio_s": round(per_frame * 1e3, 3),
        "stream_equals_one_shot_bitwise": exact,
        "one_pass_vs_blockwise_max_abs": float(np.abs(full - ref).max()),
        "cuda_vs_cpu_max_abs": float(np.abs(ref[: cpu.size] - cpu).max()),
    }


async def codec_engine_figures(models: Path) -> dict:
    from omnix.engines.codec_engine import CodecEngine
    from omnix.events.types import StageParams
    from omnix.pipelines.config import CodecArgs
    from omnix.transport.work import GenerateRequest, InputPiece

    engine = CodecEngine(CodecArgs(model=str(models / "code2wav")))
    info = await engine.start()
    codes = np.random.default_rng(1).integers(0, 1024, size=2 * 750)

    async def pieces():
        for i in range(0, codes.size, 16):
            yield InputPiece(token_ids=tuple(int(c) for c in codes[i : i + 16]), modality="codec")

    t = time.perf_counter()
    outs = [o async for o in engine.generate(GenerateRequest("g", "code2wav", StageParams()), pieces())]
    wall = time.perf_counter() - t
    pcm = np.concatenate([o.array for o in outs if o.array is not None])
    equal = bool(np.array_equal(pcm, engine.decoder.decode(codes)))
    await engine.close()
    return {
        "engine_device": info.device,
        "engine_ms_per_audio_s": round(wall / 10 * 1e3, 3),
        "engine_stream_equals_one_shot": equal,
    }


async def diffusers_figures(models: Path) -> dict:
    from omnix.engines.diffusers_engine import DiffusersEngine
    from omnix.events.types import StageParams
    from omnix.pipelines.config import DiffusersArgs
    from omnix.transport.work import GenerateRequest, InputPiece

    engine = DiffusersEngine(DiffusersArgs(model=str(models / "image")))
    t = time.perf_counter()
    info = await engine.start()
    load_s = time.perf_counter() - t

    async def one(rid: str, size: int, steps: int) -> tuple[float, list[float], bytes]:
        stamps: list[float] = []

        async def feed():
            yield InputPiece(text="a red circle on a white background")

        req = GenerateRequest(rid, "image", StageParams(num_inference_steps=steps, width=size, height=size), seed=1)
        t0 = time.perf_counter()
        png = b""
        async for out in engine.generate(req, feed()):
            if out.is_progress:
                stamps.append(time.perf_counter())
            else:
                png = out.data
        return time.perf_counter() - t0, stamps, png

    res: dict = {"engine_device": info.device, "load_s": round(load_s, 2)}
    for size, steps in ((64, 50), (512, 20)):
        await one(f"warm{size}", size, 2)
        total, stamps, png = await one(f"r{size}", size, steps)
        gaps = np.diff(stamps)  # step i+1 end - step i end: one denoising step
        res[f"{size}x{size}"] = {
            "steps": steps,
            "ms_per_step_median": round(float(np.median(gaps)) * 1e3, 3),
            "total_s": round(total, 3),
            "png_bytes": len(png),
        }
    # Abort between steps on the GPU too.
    async def feed():
        yield InputPiece(text="abort me")

    seen = 0
    async for out in engine.generate(GenerateRequest("ab", "image", StageParams(num_inference_steps=1000)), feed()):
        seen = out.step
        if seen == 3:
            await engine.abort("ab")
    await asyncio.sleep(0.5)
    res["abort"] = [h for h in engine.history if h[0] == "ab"]
    await engine.close()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, required=True)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    report: dict = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
    }
    report["codec"] = codec_figures(args.models, device)
    print(json.dumps(report, indent=2), flush=True)
    report["codec"].update(asyncio.run(codec_engine_figures(args.models)))
    try:
        import diffusers

        report["diffusers_version"] = diffusers.__version__
        report["diffusers"] = asyncio.run(diffusers_figures(args.models))
    except ImportError as exc:
        report["diffusers"] = f"skipped: {exc}"
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
