"""``omnix bench serve``'s results: each request as the client saw it, and what they add up to.

Owns: ``RequestRecord`` (one request's clock readings and counts), the
summary ``--json`` prints (``ServeBenchSummary``: vLLM's key names where
it has them, vLLM-Omni's for audio) and the result ``--result-file``
saves (``ServeBenchResult``, every request beside it), the percentiles
per figure, summing a run's records into them (``summarize``) and the
table printed without ``--json`` (``summary_table``).  Does not own the
requests (``serve_client``) nor the run (``serve_run``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
import numpy as np

#: How many distinct error messages the summary keeps.
FIRST_ERRORS = 5


class RequestRecord(msgspec.Struct, kw_only=True):
    """One request as the client saw it (seconds; None where not measured)."""

    index: int
    kind: str
    ok: bool
    error: str = ""
    status: int = 0
    start_s: float = 0.0  # since the run started
    e2el_s: float = 0.0
    ttft_s: float | None = None
    tpot_s: float | None = None
    itl_s: list[float] = []
    ttfp_s: float | None = None
    audio_s: float = 0.0
    audio_rtf: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    images: int = 0


class KindSummary(msgspec.Struct, kw_only=True):
    completed: int = 0
    failed: int = 0
    mean_e2el_ms: float | None = None


class ServeBenchSummary(msgspec.Struct, kw_only=True):
    """What ``--json`` prints.  Latency stats are None without samples."""

    date: str
    base_url: str
    model_id: str
    kind: str
    kinds: list[str]
    num_prompts: int
    request_rate: float | str  # "inf" as vLLM writes it
    max_concurrency: int | None
    seed: int
    speech_stream: str  # the speech mode used ("" when no speech was sent)
    duration: float
    completed: int
    failed: int
    first_errors: list[str]
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    total_audio_duration_s: float
    audio_throughput: float  # audio seconds per second
    total_images: int
    image_throughput: float
    per_kind: dict[str, KindSummary]
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    std_ttft_ms: float | None = None
    p50_ttft_ms: float | None = None
    p90_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    std_tpot_ms: float | None = None
    p50_tpot_ms: float | None = None
    p90_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    std_itl_ms: float | None = None
    p50_itl_ms: float | None = None
    p90_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    mean_e2el_ms: float | None = None
    median_e2el_ms: float | None = None
    std_e2el_ms: float | None = None
    p50_e2el_ms: float | None = None
    p90_e2el_ms: float | None = None
    p99_e2el_ms: float | None = None
    mean_audio_ttfp_ms: float | None = None
    median_audio_ttfp_ms: float | None = None
    std_audio_ttfp_ms: float | None = None
    p50_audio_ttfp_ms: float | None = None
    p90_audio_ttfp_ms: float | None = None
    p99_audio_ttfp_ms: float | None = None
    mean_audio_rtf: float | None = None
    median_audio_rtf: float | None = None
    std_audio_rtf: float | None = None
    p50_audio_rtf: float | None = None
    p90_audio_rtf: float | None = None
    p99_audio_rtf: float | None = None
    mean_audio_duration_s: float | None = None
    median_audio_duration_s: float | None = None
    std_audio_duration_s: float | None = None
    p50_audio_duration_s: float | None = None
    p90_audio_duration_s: float | None = None
    p99_audio_duration_s: float | None = None


class ServeBenchResult(ServeBenchSummary, kw_only=True):
    """What ``--result-file`` saves: the summary plus every request."""

    requests: list[RequestRecord] = []


#: (key stem, what it is in seconds -> reported scale)
_STATS: tuple[tuple[str, float], ...] = (
    ("ttft_ms", 1000.0),
    ("tpot_ms", 1000.0),
    ("itl_ms", 1000.0),
    ("e2el_ms", 1000.0),
    ("audio_ttfp_ms", 1000.0),
    ("audio_rtf", 1.0),
    ("audio_duration_s", 1.0),
)


def _stats(stem: str, values: list[float], scale: float) -> dict[str, float | None]:
    if not values:
        return {}
    arr = np.asarray(values, dtype=np.float64) * scale
    p50, p90, p99 = (float(v) for v in np.percentile(arr, [50, 90, 99]))
    return {
        f"mean_{stem}": float(arr.mean()),
        f"median_{stem}": p50,
        f"std_{stem}": float(arr.std()),
        f"p50_{stem}": p50,
        f"p90_{stem}": p90,
        f"p99_{stem}": p99,
    }


def _first_errors(failed: list[RequestRecord]) -> list[str]:
    """The first distinct messages, each with how many requests got it."""
    counts: dict[tuple[str, str], int] = {}
    for r in failed:
        counts[(r.kind, r.error)] = counts.get((r.kind, r.error), 0) + 1
    return [
        f"{kind} ({n} requests): {msg}" for (kind, msg), n in list(counts.items())[:FIRST_ERRORS]
    ]


def summarize(
    args: argparse.Namespace,
    base: str,
    model: str,
    kinds: Sequence[str],
    speech: str,
    records: list[RequestRecord],
    duration: float,
) -> ServeBenchResult:
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    dur = max(duration, 1e-9)
    total_in = sum(r.prompt_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    audio = sum(r.audio_s for r in ok)
    images = sum(r.images for r in ok)
    samples: dict[str, list[float]] = {
        "ttft_ms": [r.ttft_s for r in ok if r.ttft_s is not None],
        "tpot_ms": [r.tpot_s for r in ok if r.tpot_s is not None],
        "itl_ms": [x for r in ok for x in r.itl_s],
        "e2el_ms": [r.e2el_s for r in ok],
        "audio_ttfp_ms": [r.ttfp_s for r in ok if r.ttfp_s is not None],
        "audio_rtf": [r.audio_rtf for r in ok if r.audio_rtf is not None],
        "audio_duration_s": [r.audio_s for r in ok if r.audio_s > 0],
    }
    stats: dict[str, float | None] = {}
    for stem, scale in _STATS:
        stats.update(_stats(stem, samples[stem], scale))
    per_kind: dict[str, KindSummary] = {}
    for kind in dict.fromkeys(r.kind for r in records):
        mine = [r for r in records if r.kind == kind]
        good = [r.e2el_s for r in mine if r.ok]
        per_kind[kind] = KindSummary(
            completed=len(good),
            failed=len(mine) - len(good),
            mean_e2el_ms=float(np.mean(good)) * 1000.0 if good else None,
        )
    rate = float(args.request_rate)
    res = ServeBenchResult(
        date=datetime.now(UTC).strftime("%Y%m%d-%H%M%S"),
        base_url=base,
        model_id=model,
        kind=args.kind,
        kinds=list(kinds),
        num_prompts=len(records),
        request_rate=rate if math.isfinite(rate) else "inf",
        max_concurrency=args.concurrency or None,
        seed=args.seed,
        speech_stream=speech,
        duration=duration,
        completed=len(ok),
        failed=len(failed),
        first_errors=_first_errors(failed),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=len(ok) / dur,
        output_throughput=total_out / dur,
        total_token_throughput=(total_in + total_out) / dur,
        total_audio_duration_s=audio,
        audio_throughput=audio / dur,
        total_images=images,
        image_throughput=images / dur,
        per_kind=per_kind,
        requests=sorted(records, key=lambda r: r.index),
    )
    for key, value in stats.items():
        setattr(res, key, value)
    return res


def summary_table(res: ServeBenchSummary) -> str:
    lines = ["{s:{c}^{n}}".format(s=" omnix bench serve ", n=56, c="=")]

    def row(label: str, value: Any, fmt: str = "") -> None:
        lines.append(f"{label:<42} {format(value, fmt) if value is not None else '-'}")

    row("Server / model:", f"{res.base_url} / {res.model_id}")
    row(
        "Kinds:",
        ", ".join(res.kinds) + (f" (speech: {res.speech_stream})" if res.speech_stream else ""),
    )
    row("Successful requests:", res.completed)
    row("Failed requests:", res.failed)
    row("Maximum request concurrency:", res.max_concurrency)
    row("Request rate (req/s):", res.request_rate)
    row("Benchmark duration (s):", res.duration, ".2f")
    row("Total input tokens:", res.total_input_tokens)
    row("Total generated tokens:", res.total_output_tokens)
    row("Request throughput (req/s):", res.request_throughput, ".2f")
    row("Output token throughput (tok/s):", res.output_throughput, ".2f")
    if res.total_audio_duration_s:
        row("Total audio generated (s):", res.total_audio_duration_s, ".2f")
        row("Audio throughput (audio s/s):", res.audio_throughput, ".2f")
    if res.total_images:
        row("Total images:", res.total_images)
        row("Image throughput (images/s):", res.image_throughput, ".2f")
    for stem, title, unit in (
        ("ttft_ms", "Time to First Token", "TTFT (ms)"),
        ("tpot_ms", "Time per Output Token (excl. 1st)", "TPOT (ms)"),
        ("itl_ms", "Inter-token Latency", "ITL (ms)"),
        ("audio_ttfp_ms", "Time to First Audio (packet)", "TTFP (ms)"),
        ("audio_rtf", "Audio Real-Time Factor", "RTF"),
        ("e2el_ms", "End-to-end Latency", "E2EL (ms)"),
    ):
        if getattr(res, f"mean_{stem}") is None:
            continue
        lines.append("{s:{c}^{n}}".format(s=title, n=56, c="-"))
        for stat in ("mean", "p50", "p90", "p99"):
            row(
                f"{stat.capitalize() if stat == 'mean' else stat.upper()} {unit}:",
                getattr(res, f"{stat}_{stem}"),
                ".3f" if stem == "audio_rtf" else ".2f",
            )
    if len(res.per_kind) > 1:
        lines.append("{s:{c}^{n}}".format(s="Per kind", n=56, c="-"))
        for kind, ks in res.per_kind.items():
            mean = f"{ks.mean_e2el_ms:.2f}" if ks.mean_e2el_ms is not None else "-"
            lines.append(
                f"{kind:<12} completed {ks.completed:<6} failed {ks.failed:<6} mean E2EL (ms) {mean}"
            )
    if res.first_errors:
        lines.append("{s:{c}^{n}}".format(s="First errors", n=56, c="-"))
        lines.extend(res.first_errors)
    lines.append("=" * 56)
    return "\n".join(lines)
