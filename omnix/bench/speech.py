"""``omnix bench speech``: Qwen3-Omni's speech path, omnix against transformers.

Owns one run of both on the same checkpoint (``--model``: a Qwen3-Omni
folder, default the tiny ``omni``), the same prompts (text chats), greedy
everywhere, answers long enough to matter (``--thinker-tokens`` >= 128,
``--talker-tokens`` frames of 80 ms):

* transformers: ``Qwen3OmniMoeForConditionalGeneration.generate(...,
  return_audio=True)`` per prompt (c=1), then the first ``--concurrency``
  prompts as one batch (c=N).  It returns the waveform when it is done, so
  its time to first audio is the whole call.
* omnix: tiny-omni's three stages (thinker on vLLM, talker, Code2Wav) over
  the same folder, in this process with real workers: each prompt alone
  (c=1), then ``--concurrency`` at once.  Time to first audio is from the
  submission to the first Code2Wav chunk in the log.

Figures (``--json``: one object on the last line): ``oracle_equal`` (every
prompt's thinker ids and talker codes at c=1 equal transformers'),
``ttfp_ms`` and ``rtf`` (wall time over audio seconds) at c=1, medians;
``ttfp_ratio_vs_transformers`` (omnix's TTFP over transformers', c=1) and
``throughput_ratio_vs_transformers`` (audio seconds produced per wall
second, omnix over transformers, at c=N); the load average before and
after.  Runs real engines: on a shared machine wrap it in ``flock
/tmp/omnix-engine.lock``.

Does not own the engines or the reference (``omnix.testing.speech_oracle``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

import msgspec

from omnix.bench.loop import run_on_loop
from omnix.bench.report import finish
from omnix.events.types import (
    ChatMessage,
    Chunk,
    Finished,
    RequestSpec,
    StageParams,
    is_terminal,
)
from omnix.usage import UsageError, int_in

PROMPTS = (
    "Tell me a story about a cat who learns to sail.",
    "What makes the sea salty? Explain it to a child.",
    "Describe a walk through a busy market in the morning.",
    "Give me three reasons to learn to play the piano.",
    "Why do leaves change colour in autumn?",
    "Plan a picnic for four friends on a windy day.",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from omnix.bench import speech_stages

    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu (default): the whole pipeline, its thinker on vLLM, against transformers; "
        "cuda: the speech stages alone on the GPU (talker, code predictor, Code2Wav)",
    )
    parser.add_argument(
        "--sizes",
        choices=("tiny", "real"),
        default="tiny",
        help="the speech stages' sizes: the tiny checkpoint, or the published "
        "Qwen3-Omni-30B-A3B sizes with random weights (stages alone)",
    )
    parser.add_argument(
        "--stages",
        action="store_true",
        help="the speech stages alone, thinker's side given (implied by --device cuda "
        "or --sizes real)",
    )
    parser.add_argument(
        "--dtype", default="", help="the stages' dtype (default bfloat16 on CUDA, else float32)"
    )
    speech_stages.add_arguments(parser)
    parser.add_argument(
        "--model", default="omni", help="a Qwen3-Omni folder, or the tiny 'omni' (default)"
    )
    parser.add_argument(
        "--prompts", type=int_in(1, len(PROMPTS)), default=4, help="prompts at c=1 (default 4)"
    )
    parser.add_argument(
        "--concurrency", type=int_in(1, len(PROMPTS)), default=4, help="N for c=N (default 4)"
    )
    parser.add_argument(
        "--thinker-tokens", type=int_in(1), default=128, help="thinker tokens (default 128)"
    )
    parser.add_argument(
        "--talker-tokens",
        type=int_in(2),
        default=160,
        help="talker steps: at most this many less one frames of 80 ms (default 160)",
    )


class _Side(msgspec.Struct):
    ttfp_s: list[float]
    wall_s: list[float]
    audio_s: list[float]
    batch_wall_s: float = 0.0
    batch_audio_s: float = 0.0


def _transformers(folder: Path, args: argparse.Namespace) -> tuple[_Side, list[Any]]:
    from omnix.testing.speech_oracle import Reference

    ref = Reference(folder)
    speaker = ref.model.config.talker_config.speaker_id
    voice = min(speaker, key=lambda k: speaker[k])
    side = _Side([], [], [])
    spoken = []
    for text in PROMPTS[: args.prompts]:
        s = ref.speak(
            text,
            speaker=voice,
            thinker_max_tokens=args.thinker_tokens,
            talker_max_tokens=args.talker_tokens,
        )
        spoken.append(s)
        side.ttfp_s.append(s.seconds)  # its audio comes when generate returns
        side.wall_s.append(s.seconds)
        side.audio_s.append(len(s.waveform) / 24000)
    side.batch_wall_s, side.batch_audio_s = _transformers_batch(ref, voice, args)
    return side, spoken


def _transformers_batch(ref: Any, voice: str, args: argparse.Namespace) -> tuple[float, float]:
    """The first ``concurrency`` prompts as one batched generate (left
    padded): (wall seconds, audio seconds)."""
    import torch

    texts = list(PROMPTS[: args.concurrency])
    tok = ref.processor.tokenizer
    tok.padding_side = "left"
    chats = [
        tok.apply_chat_template(
            [{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True
        )
        for t in texts
    ]
    inputs = ref.processor(text=chats, return_tensors="pt", padding=True)
    start = time.perf_counter()
    with torch.no_grad():
        _, wavs = ref.model.generate(
            **inputs,
            speaker=voice,
            return_audio=True,
            thinker_max_new_tokens=args.thinker_tokens,
            thinker_eos_token_id=ref.model.generation_config.eos_token_id,
            thinker_do_sample=False,
            talker_do_sample=False,
            talker_max_new_tokens=args.talker_tokens,
        )
    wall = time.perf_counter() - start
    rows = wavs if isinstance(wavs, list) else [w.reshape(-1) for w in wavs]
    return wall, sum(int(w.numel()) for w in rows) / 24000


def _pipeline(folder: Path) -> Any:
    from omnix.pipelines.validate import load_pipeline, validate_pipeline

    base = load_pipeline("tiny-omni")
    cfg = msgspec.structs.replace(
        base,
        name="bench-speech",
        stages=tuple(
            msgspec.structs.replace(s, engine=msgspec.structs.replace(s.engine, model=str(folder)))
            for s in base.stages
        ),
    )
    validate_pipeline(cfg)
    return cfg


def _spec(text: str, args: argparse.Namespace, seed: int) -> RequestSpec:
    return RequestSpec(
        messages=(ChatMessage(role="user", content=text),),
        outputs=("text", "audio"),
        stage_params={
            "thinker": StageParams(temperature=0.0, max_tokens=args.thinker_tokens),
            "talker": StageParams(temperature=0.0, max_tokens=args.talker_tokens),
        },
        seed=seed,
        api="bench",
    )


async def _one(omni: Any, text: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    start = time.perf_counter()
    ev = omni.submit(_spec(text, args, seed))
    first, samples = 0.0, 0
    thinker: list[int] = []
    codes: list[list[int]] = []
    async for e in omni.events(ev.request_id):
        if type(e) is Chunk:
            if e.stage == "code2wav" and e.blob is not None:
                first = first or time.perf_counter() - start
                samples += e.blob.shape[0]
            elif e.stage == "thinker" and e.modality == "text":
                thinker.extend(e.token_ids)
            elif e.stage == "talker" and e.token_ids:
                codes.append(list(e.token_ids))
        elif is_terminal(e) and type(e) is not Finished:
            raise RuntimeError(f"request {ev.request_id} ended {e!r}")
    wall = time.perf_counter() - start
    return {"ttfp": first, "wall": wall, "audio": samples / 24000, "ids": thinker, "codes": codes}


async def _omnix(folder: Path, args: argparse.Namespace) -> tuple[_Side, list[dict[str, Any]]]:
    from omnix.api import Omni
    from omnix.stages.options import RuntimeOptions

    omni = Omni(_pipeline(folder), runtime_options=RuntimeOptions(start_timeout_s=600.0))
    await omni.start()
    try:
        await omni.wait_ready(600.0)
        await _one(omni, PROMPTS[0], args, 0)  # warm-up: first-request costs off the figures
        side, runs = _Side([], [], []), []
        for i, text in enumerate(PROMPTS[: args.prompts]):
            r = await _one(omni, text, args, i)
            runs.append(r)
            side.ttfp_s.append(r["ttfp"])
            side.wall_s.append(r["wall"])
            side.audio_s.append(r["audio"])
        start = time.perf_counter()
        batch = await asyncio.gather(
            *(_one(omni, t, args, i) for i, t in enumerate(PROMPTS[: args.concurrency]))
        )
        side.batch_wall_s = time.perf_counter() - start
        side.batch_audio_s = sum(r["audio"] for r in batch)
        return side, runs
    finally:
        await omni.shutdown()


def _equal(runs: list[dict[str, Any]], spoken: list[Any]) -> bool:
    return all(
        r["ids"] == s.thinker_ids and r["codes"] == s.codes.tolist()
        for r, s in zip(runs, spoken, strict=True)
    )


def _figures(ours: _Side, theirs: _Side, equal: bool) -> dict[str, Any]:
    med = statistics.median
    ttfp = med(ours.ttfp_s)
    ref_ttfp = med(theirs.ttfp_s)
    rate = ours.batch_audio_s / ours.batch_wall_s
    ref_rate = theirs.batch_audio_s / theirs.batch_wall_s
    return {
        "oracle_equal": equal,
        "ttfp_ms": round(ttfp * 1000, 1),
        "rtf": round(med(w / a for w, a in zip(ours.wall_s, ours.audio_s, strict=True)), 3),
        "ttfp_ratio_vs_transformers": round(ttfp / ref_ttfp, 3),
        "throughput_ratio_vs_transformers": round(rate / ref_rate, 3),
        "transformers_ttfp_ms": round(ref_ttfp * 1000, 1),
        "transformers_rtf": round(
            med(w / a for w, a in zip(theirs.wall_s, theirs.audio_s, strict=True)), 3
        ),
        "audio_s_per_s": round(rate, 3),
        "transformers_audio_s_per_s": round(ref_rate, 3),
        "audio_s_per_answer": round(med(ours.audio_s), 2),
    }


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from omnix.models.paths import resolve_model

    folder = resolve_model(args.model)
    if not (folder / "config.json").is_file():
        raise UsageError(f"--model {args.model}: {folder} has no config.json")
    load_before = os.getloadavg()[0]
    theirs, spoken = await asyncio.to_thread(_transformers, folder, args)
    ours, runs = await _omnix(folder, args)
    res = _figures(ours, theirs, _equal(runs, spoken))
    res |= {
        "concurrency": args.concurrency,
        "prompts": args.prompts,
        "thinker_tokens": args.thinker_tokens,
        "talker_tokens": args.talker_tokens,
        "load_avg_before": round(load_before, 2),
        "load_avg_after": round(os.getloadavg()[0], 2),
        "model": str(folder),
    }
    return res


def run(args: argparse.Namespace) -> int:
    if args.stages or args.device != "cpu" or args.sizes == "real":
        from omnix.bench import speech_stages

        args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
        return speech_stages.run(args)
    if args.model == "omni":
        from omnix.models.build import ensure_models

        ensure_models(names=("omni",))
    res = run_on_loop(_bench(args))
    line = (
        f"omnix: TTFP {res['ttfp_ms']} ms, RTF {res['rtf']}, "
        f"{res['audio_s_per_s']} audio s/s at c={res['concurrency']}; transformers: TTFP "
        f"{res['transformers_ttfp_ms']} ms, {res['transformers_audio_s_per_s']} audio s/s; "
        f"oracle_equal {res['oracle_equal']}"
    )
    return finish(args, res, line, "omnix's greedy output differs from transformers'")
