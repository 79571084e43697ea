"""``omnix bench tts --device cuda --sizes real``: Qwen3-TTS's stages alone
on one device, at the published 12Hz-1.7B sizes.

Owns one run of omnix's Qwen3-TTS talker (``Qwen3TTSEngine``, its code
predictor inside each step) feeding the 12 Hz speech decoder
(``SpeechDecoderEngine``) in this process, as a worker runs them, on a
CustomVoice folder: the published sizes with random weights
(``--sizes real``, ``omnix.models.qwen3_tts_real``, built once into
``--build-dir`` and loaded from there as any checkpoint is) or the tiny
checkpoint (``--sizes tiny``, seconds on a CPU).  Greedy, voice
``--voice``, ``--max-tokens`` codes an answer (``--max-tokens - 1``
frames of 80 ms: random weights rarely end by themselves; ``frames``
says how many came), each level's requests submitted together.  No
reference runs here: qwen-tts needs an environment of its own, and the
CPU bench (``tts.py``) holds omnix's codes equal to it.

Figures (``--json``: one object on the last line), medians over
``--runs`` after one warm-up (minimums ``*_min``): ``ttfp_ms`` (a
request submitted to its first PCM, c=1), ``rtf`` by level (a request's
wall time over its audio seconds, the median request), ``audio_s_per_s``
by level (all the level's audio over its wall time),
``talker_audio_s_per_s`` (the talker alone, its frames counted, not
decoded), ``talker_ms_per_step`` and ``predictor_ms_per_frame`` by graph
bucket (each captured graph replayed alone, CUDA events), ``start_s``
(loading and capturing), ``frames``, ``parameters``, ``card``,
``peak_gpu_gib``; and ``vllm_omni``: vLLM-Omni's published H100 figures
for the same model (TTFP 47 ms and RTF 0.137 at c=1; 68.7 audio s/s at
c=64 on two H100s) with omnix's ratios to them (``ttfp_ratio_vs_vllm_omni``:
lower is better; ``throughput_ratio_vs_vllm_omni_c64``: higher is).

Does not own the engines, the CPU bench against the reference
(``tts.py``), nor the model's numbers (``qwen3_tts_real.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from omnix.bench.loop import run_on_loop
from omnix.bench.report import progress
from omnix.bench.speech_stages import FRAME_SAMPLES, SAMPLE_RATE, graph_timings, stage_summary
from omnix.bench.tts_texts import bench_texts, parse_levels
from omnix.usage import UsageError, counts, int_in

DEFAULT_LEVELS = (1, 16, 64)
#: vLLM-Omni's published figures for Qwen3-TTS-12Hz-1.7B-CustomVoice on H100s
VLLM_OMNI = {"ttfp_ms": 47.0, "rtf_c1": 0.137, "audio_s_per_s_c64": 68.7, "cards": "2x H100"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "the stages alone at a published size (--device cuda or --sizes; docs/bench.md, "
        "'Qwen3-TTS on a GPU')"
    )
    g.add_argument(
        "--device",
        default="cpu",
        help="cpu (default): omnix served against the reference; cuda: the stages alone on the GPU",
    )
    g.add_argument(
        "--sizes",
        choices=("tiny", "real"),
        default=None,
        help="the published 12Hz-1.7B sizes with random weights (needs a GPU) or the tiny "
        "checkpoint",
    )
    g.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default=None,
        help="the talker's and decoder's dtype (default bfloat16 on CUDA, float32 on a CPU)",
    )
    g.add_argument(
        "--decode",
        choices=("auto", "eager", "static", "graphs"),
        default="auto",
        help="the talker's decode mode (default auto: graphs on CUDA)",
    )
    g.add_argument("--no-compile", action="store_true", help="capture graphs without torch.compile")
    g.add_argument(
        "--buckets",
        default="",
        help="the talker's graph buckets, e.g. 1,16,64 (default: 1 and each level)",
    )
    g.add_argument(
        "--decoder-batch",
        type=int_in(0),
        default=0,
        help="requests' chunks the decoder decodes in one forward (default: the largest level)",
    )
    g.add_argument(
        "--build-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "omnix-tts-published",
        help="where the published-size folder is built once and reused",
    )


def wanted(args: argparse.Namespace) -> bool:
    """Whether the command line asks for this bench."""
    return args.sizes is not None or args.device != "cpu"


def _buckets(args: argparse.Namespace, levels: tuple[int, ...]) -> tuple[int, ...]:
    if not args.buckets:
        return tuple(sorted({1, *levels}))
    try:
        buckets = counts(args.buckets, example="1,16,64")
    except ValueError as exc:
        raise UsageError(f"--buckets {exc}") from None
    if buckets[-1] < levels[-1]:
        raise UsageError(f"--buckets {args.buckets!r}: the largest must hold {levels[-1]} rows")
    return buckets


class _Stages:
    """The two engines over one folder, and what a request asks of them."""

    def __init__(self, folder: Path, args: argparse.Namespace, levels: tuple[int, ...]) -> None:
        from omnix.engines.qwen3_tts_engine import Qwen3TTSEngine
        from omnix.engines.speech_decoder import SpeechDecoderEngine
        from omnix.events.types import StageParams
        from omnix.pipelines.config import Qwen3TTSDecoderArgs, Qwen3TTSTalkerArgs

        top = levels[-1]
        talker = Qwen3TTSTalkerArgs(
            model=str(folder),
            device=args.device,
            dtype=args.dtype,
            max_batch=top,
            decode=args.decode,
            compile=not args.no_compile,
            graph_buckets=_buckets(args, levels),
            # prompt and frames: the default 4096 positions for 64 slots at
            # 28 layers would hold 60 GB of keys and values.
            max_len=max(512, 2 * args.max_tokens + 256),
        )
        self.talker = Qwen3TTSEngine(talker)
        self.decoder = SpeechDecoderEngine(
            Qwen3TTSDecoderArgs(
                model=str(folder),
                device=args.device,
                dtype=args.dtype,
                batch_chunks=args.decoder_batch or top,
            )
        )
        self.params = StageParams(temperature=0.0, max_tokens=args.max_tokens, voice=args.voice)
        self.groups = 16  # Qwen3-TTS's code groups, every frame

    async def start(self) -> None:
        await self.talker.start()
        await self.decoder.start()

    async def close(self) -> None:
        await self.decoder.close()
        await self.talker.close()

    async def speak(self, rid: str, text: str, decode: bool = True) -> dict[str, float]:
        """One request: seconds to its first PCM (or first frame, not
        decoded), its wall seconds, its audio seconds and frames."""
        from omnix.transport.work import GenerateRequest, InputPiece

        async def text_in():
            yield InputPiece(text=text)

        frames = 0

        async def codes():
            nonlocal frames
            req = GenerateRequest(request_id=rid, stage="talker", params=self.params)
            async for out in self.talker.generate(req, text_in()):
                if out.token_ids:
                    frames += len(out.token_ids) // self.groups
                    yield InputPiece(modality="codec", token_ids=out.token_ids)

        start = time.perf_counter()
        first, samples = 0.0, 0
        if not decode:
            async for _ in codes():
                first = first or time.perf_counter() - start
            wall = time.perf_counter() - start
            return {
                "first": first,
                "wall": wall,
                "audio": frames * FRAME_SAMPLES / SAMPLE_RATE,
                "frames": frames,
            }
        req = GenerateRequest(request_id=rid, stage="code2wav", params=self.params)
        async for out in self.decoder.generate(req, codes()):
            if out.array is not None and out.array.size:
                first = first or time.perf_counter() - start
                samples += out.array.size
        wall = time.perf_counter() - start
        return {"first": first, "wall": wall, "audio": samples / SAMPLE_RATE, "frames": frames}


async def _level(stages: _Stages, tag: str, c: int, texts: list[str], decode: bool) -> Any:
    t0 = time.perf_counter()
    got = await asyncio.gather(
        *(stages.speak(f"{tag}c{c}r{i}", texts[i % len(texts)], decode) for i in range(c))
    )
    return got, time.perf_counter() - t0


async def _bench(args: argparse.Namespace, levels: tuple[int, ...]) -> dict[str, Any]:
    import torch

    cuda = args.device.startswith("cuda")
    t0 = time.perf_counter()
    if args.sizes == "real":
        from omnix.models.qwen3_tts_real import real_folder

        progress(f"the published sizes into {args.build_dir} (once)", t0)
        folder, info = await asyncio.to_thread(real_folder, args.build_dir, args.device, args.dtype)
    else:
        from omnix.models.build import ensure_models
        from omnix.models.paths import resolve_model

        ensure_models(names=("qwen3_tts_custom_voice",))
        folder, info = resolve_model("qwen3_tts_custom_voice"), {}
    texts = bench_texts(max(levels), args.words)
    stages = _Stages(folder, args, levels)
    progress("loading the engines (and capturing graphs)", t0)
    start = time.perf_counter()
    await stages.start()
    res: dict[str, Any] = {
        "card": torch.cuda.get_device_name() if cuda else "cpu",
        "sizes": args.sizes,
        "model": info.get("name", "qwen3_tts_custom_voice"),
        "dtype": args.dtype,
        "decode": args.decode,
        "compile": not args.no_compile,
        "max_tokens": args.max_tokens,
        "parameters": info.get("parameters")
        or sum(p.numel() for p in stages.talker.model.talker.parameters()),  # type: ignore[union-attr]
        "start_s": round(time.perf_counter() - start, 1),
    }
    progress(f"engines started in {res['start_s']} s; warming every level", t0)
    runs: list[dict[str, Any]] = []
    try:
        for c in levels:  # every batch and chunk shape once
            await _level(stages, "warm", c, texts, True)
        for r in range(args.runs):
            one: dict[str, Any] = {"rtf": {}, "audio_s_per_s": {}, "talker_audio_s_per_s": {}}
            for c in levels:
                alone, wall = await _level(stages, f"t{r}", c, texts, False)
                one["talker_audio_s_per_s"][c] = sum(g["audio"] for g in alone) / wall
                got, wall = await _level(stages, f"n{r}", c, texts, True)
                one["rtf"][c] = statistics.median(g["wall"] / g["audio"] for g in got)
                one["audio_s_per_s"][c] = sum(g["audio"] for g in got) / wall
                one.setdefault("frames", statistics.median(g["frames"] for g in got))
                if c == 1:
                    one["first"] = got[0]["first"]
                progress(
                    f"run {r + 1}/{args.runs} c={c}: RTF {one['rtf'][c]:.3f}, "
                    f"{one['audio_s_per_s'][c]:.1f} audio s/s (the talker alone "
                    f"{one['talker_audio_s_per_s'][c]:.1f})",
                    t0,
                )
            graphs = stages.talker._graphs
            if graphs is not None and graphs.capture:
                loop = asyncio.get_running_loop()
                one["graphs"] = await loop.run_in_executor(
                    stages.talker._pool, graph_timings, graphs, 50
                )
            runs.append(one)
    finally:
        await stages.close()
    res |= _summary(runs, levels)
    if cuda:
        res["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return res


def _summary(runs: list[dict[str, Any]], levels: tuple[int, ...]) -> dict[str, Any]:
    out = stage_summary(runs, levels, "ttfp_ms")
    out["frames"] = statistics.median(r["frames"] for r in runs)
    ref: dict[str, Any] = dict(VLLM_OMNI)
    if "ttfp_ms" in out:
        ref["ttfp_ratio_vs_vllm_omni"] = round(out["ttfp_ms"] / VLLM_OMNI["ttfp_ms"], 2)
        ref["rtf_ratio_vs_vllm_omni"] = round(out["rtf"][1] / VLLM_OMNI["rtf_c1"], 2)
    if 64 in levels:
        ref["throughput_ratio_vs_vllm_omni_c64"] = round(
            out["audio_s_per_s"][64] / VLLM_OMNI["audio_s_per_s_c64"], 2
        )
    out["vllm_omni"] = ref
    return out


def run(args: argparse.Namespace) -> int:
    levels = parse_levels(args.levels or ",".join(map(str, DEFAULT_LEVELS)))
    args.sizes = args.sizes or ("real" if args.device.startswith("cuda") else "tiny")
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device {args.device}: torch sees no CUDA GPU here")
    elif args.sizes == "real":
        raise UsageError("--sizes real needs --device cuda (1.7 B parameters at 80 ms a frame)")
    res = run_on_loop(_bench(args, levels))
    if not getattr(args, "json", False):
        print(
            f"{res['card']}: TTFP {res.get('ttfp_ms', '-')} ms, RTF {res['rtf']}, audio s/s "
            f"{res['audio_s_per_s']}; vLLM-Omni: {VLLM_OMNI}",
            file=sys.stderr,
        )
    print(json.dumps(res))
    return 0
