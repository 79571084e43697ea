"""``omnix bench tts``: Qwen3-TTS served by omnix against the reference, qwen-tts.

Owns one run of both on the same checkpoint (``--model``: a Qwen3-TTS
CustomVoice or VoiceDesign folder, default the tiny CustomVoice one), the
same texts and voice, greedy, ``--max-tokens`` talker codes an answer
(``--max-tokens - 1`` frames of 80 ms: the random-weight talker never ends
by itself):

* the reference: qwen-tts's own ``generate_custom_voice`` (or
  ``generate_voice_design``) in its environment (``.venv-ref``, a
  subprocess: ``omnix.testing.qwen3_tts_oracle``), timed there, torch on
  one thread: per run the first text alone (c=1; it does not stream, so
  its first packet is its whole answer) and each level's texts as one
  batched call (its own batching).
* omnix: a real ``omnix serve PATH`` (server and worker processes), the
  first text once for the oracle, then per run each level's texts as
  concurrent ``/v1/audio/speech`` requests streamed as SSE (PCM), timed
  by the client to the first audio bytes.

Figures (``--json``: one object on the last line), medians over
``--runs`` (and minimums, ``*_min``): ``oracle_equal`` (the server's
talker codes for the first text equal the reference's, every group of
every frame), ``ttfp_ms`` and ``rtf`` (end to end over audio seconds) at
c=1, ``audio_s_per_s`` by level; the reference's ``ref_ttfp_ms``,
``ref_rtf``, ``ref_audio_s_per_s`` by level (``ref_streams``: false);
``ttfp_ratio_vs_reference`` (omnix's over the reference's, c=1) and
``throughput_ratio_vs_reference`` (audio s/s, omnix over the reference, at
c=4, else the largest level: ``throughput_level``); ``load_avg_before``
and ``load_avg_after``.  Targets (reported, not gated): ``ttfp_target``
(ratio <= 0.25) and ``throughput_target`` (ratio >= 3).

Does not own the server's side (``tts_served.py``) nor the reference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from omnix.bench import tts_stages
from omnix.bench.loop import run_on_loop
from omnix.bench.report import finish
from omnix.bench.tts_texts import bench_texts, parse_levels
from omnix.usage import UsageError, int_in

DEFAULT_LEVELS = (1, 4, 16)
THROUGHPUT_LEVEL = 4
TTFP_TARGET = 0.25
THROUGHPUT_TARGET = 3.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="qwen3_tts_custom_voice",
        help="a Qwen3-TTS CustomVoice or VoiceDesign folder, or a tiny model's name "
        "(default qwen3_tts_custom_voice)",
    )
    parser.add_argument(
        "--levels",
        default=None,
        help="concurrency levels, e.g. 1,4,16 (the default; on a GPU 1,16,64)",
    )
    parser.add_argument(
        "--runs", type=int_in(1), default=3, help="repetitions, median and min (default 3)"
    )
    parser.add_argument(
        "--max-tokens",
        type=int_in(2, 4096),
        default=64,
        help="talker codes an answer: that many less one frames of 80 ms (default 64)",
    )
    parser.add_argument(
        "--words", type=int_in(1), default=0, help="cut each text to its first N words"
    )
    parser.add_argument("--voice", default="vivian", help="a CustomVoice speaker (default vivian)")
    parser.add_argument(
        "--instructions",
        default="",
        help="CustomVoice's instruction; VoiceDesign's voice description (its default: "
        "a calm, clear voice)",
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds for the server's start, a request"
    )
    tts_stages.add_arguments(parser)


def _voice(folder: Path, args: argparse.Namespace) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(the speech body's voice, its other voice fields, the reference's
    case fields) for the folder's variant."""
    config = json.loads((folder / "config.json").read_text())
    if config.get("tts_model_type") == "voice_design":
        how = args.instructions or "A calm, clear voice."
        return "default", {"instructions": how}, {"instruct": how}
    speakers = sorted(k.lower() for k in config.get("talker_config", {}).get("spk_id") or {})
    if args.voice.lower() not in speakers:
        raise UsageError(f"--voice {args.voice!r}: the checkpoint's speakers are {speakers}")
    body: dict[str, Any] = {"instructions": args.instructions} if args.instructions else {}
    case: dict[str, Any] = {"speaker": args.voice}
    if args.instructions:
        case["instruct"] = args.instructions
    return args.voice, body, case


def _reference(
    folder: Path, args: argparse.Namespace, levels: tuple[int, ...], case: dict[str, Any]
) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """The reference's run: (the first text's codes, per run: TTFP, RTF,
    audio s/s by level)."""
    from omnix.testing.qwen3_tts_oracle import run_reference

    def row(text: str) -> dict[str, Any]:
        return {**case, "text": text, "max_new_tokens": args.max_tokens}

    first = bench_texts(1, args.words)[0]
    cases: list[dict[str, Any]] = [row(first)]  # the oracle's, and the warm-up
    for _ in range(args.runs):
        cases.append({**row(first), "timed": True})
        cases += [
            {"batch": [row(t) for t in bench_texts(c, args.words)], "timed": True}
            for c in levels
            if c > 1
        ]
    with tempfile.TemporaryDirectory(prefix="omnix-bench-tts-") as tmp:
        data = run_reference(folder, cases, Path(tmp), timeout=args.timeout * 10)
    results = data["results"]
    codes: list[list[int]] = results[0]["codes"]
    runs, i = [], 1
    for _ in range(args.runs):
        alone = results[i]
        audio = alone["samples"][0] / alone["sample_rate"]
        one = {
            "ttfp": alone["seconds"],
            "rtf": alone["seconds"] / audio,
            "audio_s_per_s": {1: audio / alone["seconds"]},
        }
        i += 1
        for c in levels:
            if c > 1:
                r = results[i]
                one["audio_s_per_s"][c] = sum(r["samples"]) / r["sample_rate"] / r["seconds"]
                i += 1
        runs.append(one)
    return codes, runs


async def _omnix(
    folder: Path, args: argparse.Namespace, levels: tuple[int, ...], voice: str, body: dict
) -> tuple[list[list[int]], int, list[dict[str, Any]], float]:
    """(the first text's codes from the server's log, its PCM samples, per
    run: TTFP, RTF at c=1 and audio s/s by level, seconds to ready)."""
    from omnix.bench.tts_served import extra_body, serve

    t0 = time.perf_counter()
    async with serve(
        folder, voice, extra_body(body, args.max_tokens), args.timeout, args.timeout
    ) as served:
        ready_s = time.perf_counter() - t0
        codes, samples = await served.codes(bench_texts(1, args.words)[0])
        await served.wave(bench_texts(max(levels), args.words))  # warm-up: every batch shape
        runs = []
        for r in range(args.runs):
            one: dict[str, Any] = {"audio_s_per_s": {}}
            for c in levels:
                wall, recs = await served.wave(bench_texts(c, args.words))
                one["audio_s_per_s"][c] = sum(x.audio_s for x in recs) / wall
                if c == 1:
                    one["ttfp"] = recs[0].ttfp_s or 0.0
                    one["rtf"] = recs[0].e2el_s / recs[0].audio_s
                print(
                    f"[bench tts] omnix run {r + 1}/{args.runs} c={c}: "
                    f"{one['audio_s_per_s'][c]:.2f} audio s/s",
                    file=sys.stderr,
                    flush=True,
                )
            runs.append(one)
    return codes, samples, runs, ready_s


def _summary(prefix: str, runs: list[dict[str, Any]], levels: tuple[int, ...]) -> dict[str, Any]:
    med = statistics.median
    out: dict[str, Any] = {}
    for name, f in (("median", med), ("min", min)):
        tail = "" if name == "median" else "_min"
        out[f"{prefix}ttfp_ms{tail}"] = round(f(r["ttfp"] for r in runs) * 1000, 1)
        out[f"{prefix}rtf{tail}"] = round(f(r["rtf"] for r in runs), 3)
        out[f"{prefix}audio_s_per_s{tail}"] = {
            c: round(f(r["audio_s_per_s"][c] for r in runs), 3) for c in levels
        }
    return out


async def _bench(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    levels = parse_levels(args.levels)
    if 1 not in levels:
        levels = (1, *levels)  # TTFP and RTF are c=1's
    voice, body, case = _voice(folder, args)
    load_before = os.getloadavg()[0]
    print("[bench tts] the reference (qwen-tts in .venv-ref)...", file=sys.stderr, flush=True)
    ref_codes, ref_runs = await asyncio.to_thread(_reference, folder, args, levels, case)
    print(
        f"[bench tts] reference: TTFP {ref_runs[0]['ttfp'] * 1000:.0f} ms; omnix serve...",
        file=sys.stderr,
        flush=True,
    )
    codes, samples, runs, ready_s = await _omnix(folder, args, levels, voice, body)
    res: dict[str, Any] = {
        "oracle_equal": codes == ref_codes and samples == len(codes) * 1920,
        "oracle_frames": len(ref_codes),
    }
    res |= _summary("", runs, levels)
    res |= _summary("ref_", ref_runs, levels)
    top = THROUGHPUT_LEVEL if THROUGHPUT_LEVEL in levels else levels[-1]
    res["ttfp_ratio_vs_reference"] = round(res["ttfp_ms"] / res["ref_ttfp_ms"], 3)
    res["throughput_ratio_vs_reference"] = round(
        res["audio_s_per_s"][top] / res["ref_audio_s_per_s"][top], 3
    )
    res |= {
        "throughput_level": top,
        "ttfp_target": res["ttfp_ratio_vs_reference"] <= TTFP_TARGET,
        "throughput_target": res["throughput_ratio_vs_reference"] >= THROUGHPUT_TARGET,
        "ref_streams": False,
        "ref_threads": 1,
        "levels": list(levels),
        "runs": args.runs,
        "max_tokens": args.max_tokens,
        "audio_s_per_answer": round((args.max_tokens - 1) * 0.08, 2),
        "serve_ready_s": round(ready_s, 1),
        "load_avg_before": round(load_before, 2),
        "load_avg_after": round(os.getloadavg()[0], 2),
        "model": str(folder),
    }
    return res


def run(args: argparse.Namespace) -> int:
    from omnix.models.paths import resolve_model

    if tts_stages.wanted(args):
        return tts_stages.run(args)
    args.levels = args.levels or ",".join(map(str, DEFAULT_LEVELS))
    parse_levels(args.levels)  # a bad flag fails before anything starts
    if args.model in ("qwen3_tts_custom_voice", "qwen3_tts_voice_design"):
        from omnix.models.build import ensure_models

        ensure_models(names=(args.model,))
    try:
        folder = resolve_model(args.model)
    except FileNotFoundError as exc:
        raise UsageError(f"--model {args.model}: {exc}") from None
    if not (folder / "config.json").is_file():
        raise UsageError(f"--model {args.model}: {folder} has no config.json")
    _voice(folder, args)  # a speaker the checkpoint lacks fails here
    try:
        res = run_on_loop(_bench(args, folder))
    except (RuntimeError, TimeoutError) as exc:  # the reference or the server failed
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        raise UsageError(" ".join(dict.fromkeys([lines[0], lines[-1]])), code=1) from None
    line = (
        f"omnix: TTFP {res['ttfp_ms']} ms, RTF {res['rtf']}, audio s/s "
        f"{res['audio_s_per_s']}; qwen-tts: TTFP {res['ref_ttfp_ms']} ms (whole answer), "
        f"audio s/s {res['ref_audio_s_per_s']}; oracle_equal {res['oracle_equal']}"
    )
    return finish(args, res, line, "omnix's greedy codes differ from the reference's")
