"""``omnix bench duplex``: full-duplex frame latency, user frame in to model frame out.

Two measurements of the ``moshi_duplex`` engine, at each number of
sessions in ``--levels``, ``--runs`` times (3), the figures the median of
the runs with the smallest beside them (``*_min``) and every run's
(``*_runs``), keyed by sessions:

* Served (the default, ``--device cpu``, no ``--sizes``): ``omnix serve``
  of a Moshi folder (``--model``; default the tiny ``moshi``, built if
  missing) in a process of its own, and that many clients at once on real
  WebSockets speaking the duplex protocol (``duplex_client.talk``), each
  sending ``--frames`` frames of 24 kHz 16-bit PCM in real time, 80 ms a
  frame.  Their phases are spread evenly over a frame (``--aligned``: all
  at once), as independent clients' are, so a frame may wait for the
  engine's next tick.  A frame's latency: from its
  ``input_audio_buffer.append`` written to the model's answer to it read
  by the client.  The levels stop at the engine's ``max_sessions`` (8).
  The server's log is in memory unless ``--log-dir`` (on disk, as a
  session that outlives a restart needs: each frame then waits for its
  events to be durable before it is sent).
* The engine's tick alone (``--sizes tiny|real``, any ``--device``):
  ``duplex_ticks.py``; ``--device cuda --sizes real`` is Moshi at its
  published size (7B temporal transformer) with random weights, and also
  gives ``card``, ``peak_gpu_gib`` and the parts of a tick (``encode_ms``,
  ``step_ms``, ``decode_ms``).

Figures (``--json``: one object on the last line): ``frame_latency_ms_p50``
and ``frame_latency_ms_p99``, ``frames_late`` (over 80 ms, a run's count)
and ``frames_late_fraction``, by sessions; ``sessions_held``: the most
sessions whose p99 (median of the runs) is under 80 ms (0: none);
``frames_missing`` (frames sent and never answered: must be 0) and the
first ``errors``; ``load_avg_1m_start`` / ``_end`` and ``cpu_count``
(a shared machine's load is part of the figure).

Does not measure the log's cost per frame (docs/http.md, "In the log"),
nor a session's start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any

from omnix.bench.loop import run_on_loop
from omnix.usage import UsageError, counts

#: A frame is late past this: the next frame's audio is due.
FRAME_MS = 80.0
SERVED_LEVELS = (1, 4, 8)
TICK_LEVELS = (1, 2, 4, 8, 16, 32, 64)
#: The served engine's sessions at most (``DuplexArgs.max_sessions``).
SERVED_MAX = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu (default), or cuda for the engine's tick alone (with --sizes)",
    )
    parser.add_argument(
        "--sizes",
        choices=("tiny", "real"),
        default=None,
        help="measure the engine's tick alone in this process, on random weights at the tiny "
        "or the published (7B) size; unset: the served path (omnix serve and WebSocket clients)",
    )
    parser.add_argument(
        "--levels",
        default=None,
        help="sessions at once, e.g. 1,4,8 (default 1,4,8 served; 1,2,4,...,64 the tick alone)",
    )
    parser.add_argument("--runs", type=int, default=3, help="times each level is measured")
    parser.add_argument(
        "--frames", type=int, default=50, help="frames a session speaks (80 ms each; default 50)"
    )
    parser.add_argument(
        "--model", default=None, help="served: a Moshi folder (default: the tiny moshi)"
    )
    parser.add_argument(
        "--aligned", action="store_true", help="served: sessions send in phase (default spread)"
    )
    parser.add_argument(
        "--log-dir",
        default=None,
        help="served: keep the server's log on disk there (what a session that survives the "
        "server's restart needs; default: in memory)",
    )
    parser.add_argument(
        "--dtype", default=None, help="the tick alone: float32 on cpu, bfloat16 on cuda (default)"
    )
    parser.add_argument(
        "--context-frames",
        type=int,
        default=250,
        help="the tick alone: frames each session has behind it when timing starts (default 250, "
        "20 s of conversation)",
    )
    parser.add_argument(
        "--warmup", type=int, default=5, help="the tick alone: ticks before the timed ones"
    )


def _log(msg: str) -> None:
    print(f"[bench duplex] {msg}", file=sys.stderr, flush=True)


def _levels(text: str | None, default: tuple[int, ...], top: int) -> tuple[int, ...]:
    if text is None:
        return tuple(n for n in default if n <= top)
    try:
        return counts(text, top, "1,4,8")
    except ValueError as exc:
        raise UsageError(f"--levels {exc}") from None


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    import numpy as np

    return round(float(np.percentile(np.asarray(xs, dtype=float), q)), 2)


def _one(latencies: list[float]) -> dict[str, Any]:
    """One run of one level's figures."""
    late = sum(1 for x in latencies if x > FRAME_MS)
    return {
        "p50": _pct(latencies, 50),
        "p99": _pct(latencies, 99),
        "late": late,
        "late_fraction": round(late / len(latencies), 4) if latencies else None,
    }


def _by_level(
    runs: list[dict[int, dict[str, Any]]], levels: tuple[int, ...], name: str, key: str
) -> dict[str, Any]:
    """``name``, ``name_min`` and ``name_runs`` by level, from each run's ``key``."""
    out: dict[str, Any] = {name: {}, f"{name}_min": {}, f"{name}_runs": {}}
    for n in levels:
        xs = [r[n][key] for r in runs if n in r]
        got = [x for x in xs if x is not None]
        out[name][n] = round(statistics.median(got), 4) if got else None
        out[f"{name}_min"][n] = min(got) if got else None
        out[f"{name}_runs"][n] = xs
    return out


def _held(p99: dict[int, float | None]) -> int:
    """The most sessions whose p99 is under a frame, the levels below it
    too (0: none)."""
    held = 0
    for n in sorted(p99):
        x = p99[n]
        if x is None or x >= FRAME_MS:
            break
        held = n
    return held


def _summary(runs: list[dict[int, dict[str, Any]]], levels: tuple[int, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, key in (
        ("frame_latency_ms_p50", "p50"),
        ("frame_latency_ms_p99", "p99"),
        ("frames_late", "late"),
        ("frames_late_fraction", "late_fraction"),
    ):
        out |= _by_level(runs, levels, name, key)
    out["sessions_held"] = _held(out["frame_latency_ms_p99"])
    return out


# -- served ----------------------------------------------------------------------


async def _level(
    http: Any, url: str, n: int, frames: int, aligned: bool
) -> tuple[dict[str, Any], list[str], int]:
    """``n`` sessions at once: (the run's figures, errors, frames missing)."""
    from omnix.bench.duplex_client import FRAME_S, speech, talk

    talks = await asyncio.gather(
        *(
            talk(
                http,
                url,
                "moshi",
                speech(frames, pitch=110.0 + 7 * i),
                delay_s=0.0 if aligned else i * FRAME_S / n,
            )
            for i in range(n)
        ),
        return_exceptions=True,
    )
    latencies: list[float] = []
    errors: list[str] = []
    missing = 0
    for t in talks:
        if isinstance(t, BaseException):
            errors.append(repr(t))
            missing += frames
            continue
        latencies += t.latencies_ms()
        missing += t.missing
        errors += t.errors
        if t.closed != "client_close":
            errors.append(f"the session closed {t.closed or 'without session.closed'}")
    return _one(latencies), errors, missing


async def _served(args: argparse.Namespace, levels: tuple[int, ...]) -> dict[str, Any]:
    import aiohttp

    from omnix.testing.served import ServeProcess

    folder = _folder(args.model)
    load = round(os.getloadavg()[0], 2)
    extra = ("--log-dir", args.log_dir) if args.log_dir else ()
    proc = await ServeProcess.start(str(folder), "--served-model-name", "moshi", *extra)
    runs: list[dict[int, dict[str, Any]]] = []
    errors: list[str] = []
    missing = 0
    try:
        url = await proc.ready(timeout=600)
        _log(f"serving {folder} at {url}; {levels} sessions x {args.runs} runs")
        async with aiohttp.ClientSession() as http:
            await _level(http, url, 1, 10, True)  # warm-up: first allocations, not measured
            for r in range(args.runs):
                one: dict[int, dict[str, Any]] = {}
                for n in levels:
                    one[n], errs, miss = await _level(http, url, n, args.frames, args.aligned)
                    errors += errs
                    missing += miss
                    _log(f"run {r + 1}, {n} sessions: {one[n]}")
                    await asyncio.sleep(0.5)  # the sessions' slots released
                runs.append(one)
    finally:
        await proc.stop(grace_s=30)
    return {
        **_summary(runs, levels),
        "path": "served",
        "model": str(folder),
        "phases": "aligned" if args.aligned else "spread",
        "log": "disk" if args.log_dir else "memory",
        "frames_missing": missing,
        "errors": errors[:5],
        "load_avg_1m_start": load,
    }


def _folder(model: str | None) -> Any:
    from omnix.models.build import ensure_models
    from omnix.models.paths import resolve_model

    if model is None:
        ensure_models(names=("moshi",))
        return resolve_model("moshi")
    try:
        return resolve_model(model)
    except FileNotFoundError as exc:
        raise UsageError(f"--model {model}: {exc}") from None


# -- the tick alone ----------------------------------------------------------------


def _ticks(args: argparse.Namespace, levels: tuple[int, ...]) -> dict[str, Any]:
    from omnix.bench import duplex_ticks as ticks

    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.device == "cpu":
        import torch

        # As a worker runs its engine (omnix.stages.worker_process): one
        # intra-op thread unless OMP_NUM_THREADS says otherwise.
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    load = round(os.getloadavg()[0], 2)
    t0 = time.perf_counter()
    _log(f"building Moshi at the {args.sizes} size on {args.device} ({dtype})")
    model, params = ticks.build(args.sizes, args.device, dtype)
    build_s = round(time.perf_counter() - t0, 1)
    runs: list[dict[int, dict[str, Any]]] = [{} for _ in range(args.runs)]
    measured: list[int] = []
    for n in levels:
        for r in range(args.runs):
            got = ticks.run_level(model, n, args.frames, args.warmup, args.context_frames, seed=r)
            one = _one(got.tick)
            for part in ("encode", "step", "decode"):
                xs = getattr(got, part)
                one[f"{part}_p50"], one[f"{part}_p99"] = _pct(xs, 50), _pct(xs, 99)
            runs[r][n] = one
            _log(f"{n} sessions, run {r + 1}: {one}")
        measured.append(n)
        p99 = statistics.median(runs[r][n]["p99"] for r in range(args.runs))
        if p99 >= FRAME_MS:
            break  # more sessions only take longer
    done = tuple(measured)
    res = _summary(runs, done)
    for part in ("encode", "step", "decode"):
        for q in ("p50", "p99"):
            res |= _by_level(runs, done, f"{part}_ms_{q}", f"{part}_{q}")
    res["sessions_held_step_alone"] = _held(res["step_ms_p99"])
    res |= {
        "path": "tick",
        "sizes": args.sizes,
        "dtype": dtype,
        "parameters": params,
        "context_frames": args.context_frames,
        "build_s": build_s,
        "card": _card(args.device),
        "load_avg_1m_start": load,
        "frames_missing": 0,
        "errors": [],
    }
    if args.device.startswith("cuda"):
        import torch

        res["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return res


def _card(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return str(torch.cuda.get_device_name(device))
    import platform

    return platform.processor() or platform.machine() or "cpu"


def run(args: argparse.Namespace) -> int:
    if args.runs < 1 or args.frames < 2 or args.warmup < 0 or args.context_frames < 0:
        raise UsageError("--runs must be >= 1, --frames >= 2, --warmup and --context-frames >= 0")
    if args.sizes is None:
        if args.device != "cpu":
            raise UsageError(
                f"--device {args.device}: the served path runs on cpu; the engine's tick "
                "alone on a GPU is --sizes real (or tiny)"
            )
        levels = _levels(args.levels, SERVED_LEVELS, SERVED_MAX)
        res = run_on_loop(_served(args, levels))
    else:
        if args.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise UsageError(f"--device {args.device}: torch sees no CUDA GPU here")
        levels = _levels(args.levels, TICK_LEVELS, 1024)
        res = _ticks(args, levels)
    res |= {
        "sessions": list(levels),
        "runs": args.runs,
        "frames_per_session": args.frames,
        "cpu_count": os.cpu_count(),
        "load_avg_1m_end": round(os.getloadavg()[0], 2),
    }
    if not getattr(args, "json", False):
        print(
            f"frame latency p50 {res['frame_latency_ms_p50']} ms, p99 "
            f"{res['frame_latency_ms_p99']} ms, late {res['frames_late']} by sessions; "
            f"{res['sessions_held']} sessions held under {FRAME_MS:.0f} ms; "
            f"load {res['load_avg_1m_start']}"
        )
    print(json.dumps(res))
    return 0 if not res["frames_missing"] and not res["errors"] else 1
