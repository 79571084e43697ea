"""``omnix bench realtime``: voice sessions through ``/v1/realtime``, against the same turns over HTTP.

Owns one measurement, on a pipeline served in this process with real
worker processes (``tiny-omni`` on its real engines by default;
``--pipeline`` a scripted one for a quick run), driven by a client in a
process of its own (so the client's work stays off the server's event
loop), with the official ``openai`` SDK:

* ``--sessions`` realtime sessions at once, each: audio in (a tone of
  ``--audio-s`` seconds, appended as a microphone would, in 100 ms
  pieces; the client commits the turn), audio out (``--max-tokens``),
  then a second turn interrupted at its first audio delta
  (``response.cancel``).  ``ttfa_p50_ms``: from the commit to the turn's
  first ``response.output_audio.delta``; ``bargein_gap_p50_ms``: from the
  cancel to the last audio delta of the interrupted response (0 when none
  came after it); ``sessions_ok``: sessions whose first turn completed and
  whose second was cancelled, with no audio delta after its
  ``response.done``.
* The same turn as a streamed chat completion (the same audio as an
  ``input_audio`` part, text and audio out in pcm16), as many at once:
  ``http_ttfa_p50_ms`` from sending the request to its first audio chunk;
  ``ttfa_ratio_vs_http`` = ``ttfa_p50_ms`` / ``http_ttfa_p50_ms`` (the
  target: at most 1.1).

Each is measured ``--runs`` times (3) in one run of the bench; the figures
are the median of the runs, with the smallest beside them (``*_min``) and
every run's (``*_runs``).  ``--json`` prints one JSON object last.

Does not measure the server's throughput (``omnix bench serve``) nor VAD
(the client commits each turn: a VAD's delay is the silence it waits).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from omnix.bench.loop import run_on_loop
from omnix.bench.pipeline_arg import load_pipeline_arg, prepare_pipeline_models
from omnix.usage import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pipeline", default=None, metavar="NAME|PATH", help="default: tiny-omni")
    parser.add_argument("--sessions", type=int, default=4, help="concurrent sessions")
    parser.add_argument("--runs", type=int, default=3, help="times each part is measured")
    parser.add_argument("--max-tokens", type=int, default=24, help="text tokens of a turn")
    parser.add_argument(
        "--barge-tokens", type=int, default=400, help="text tokens of the turn interrupted"
    )
    parser.add_argument("--audio-s", type=float, default=1.0, help="seconds of audio in")
    parser.add_argument("--model-dir", default=None, help="tiny models' folder (built if missing)")


def _log(msg: str) -> None:
    print(f"[bench realtime] {msg}", file=sys.stderr, flush=True)


def _tone(seconds: float) -> bytes:
    t = np.arange(int(24000 * seconds)) / 24000
    return (np.sin(2 * np.pi * 220 * t) * 6000).astype("<i2").tobytes()


# -- the client (its own process) ------------------------------------------------


async def _turn(conn: Any, pcm: bytes, max_tokens: int) -> float:
    """Append ``pcm``, commit, respond; the time the commit was sent."""
    for i in range(0, len(pcm), 4800):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + 4800]).decode())
    t0 = time.perf_counter()
    await conn.input_audio_buffer.commit()
    await conn.response.create(response={"max_output_tokens": max_tokens})
    return t0


async def _session(base: str, model: str, pcm: bytes, a: dict[str, Any]) -> dict[str, Any]:
    import openai

    client = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0)
    out: dict[str, Any] = {"ok": False}
    async with client.realtime.connect(model=model) as conn:
        await conn.session.update(
            session={"type": "realtime", "audio": {"input": {"turn_detection": None}}}
        )
        t0 = await _turn(conn, pcm, a["max_tokens"])
        first: float | None = None
        async for ev in conn:
            if ev.type == "response.output_audio.delta" and first is None:
                first = time.perf_counter()
            elif ev.type == "response.done":
                out["status1"] = ev.response.status
                break
            elif ev.type == "error":
                out["error"] = ev.error.message
                return out
        out["ttfa_ms"] = (first - t0) * 1000 if first is not None else None
        await _turn(conn, pcm, a["barge_tokens"])
        t_cancel = last = 0.0
        async for ev in conn:
            if ev.type == "response.output_audio.delta":
                last = time.perf_counter()
                if not t_cancel:
                    t_cancel = last
                    await conn.response.cancel()
            elif ev.type == "response.done":
                out["status2"] = ev.response.status
                details = ev.response.status_details
                if ev.response.status == "failed" and details is not None:
                    out["error"] = str(details.error)
                break
            elif ev.type == "error":
                out["error"] = ev.error.message
                return out
        out["gap_ms"] = max(0.0, last - t_cancel) * 1000 if t_cancel else None
        late = await _late_audio(conn)
        out["ok"] = (
            out.get("status1") in ("completed", "incomplete")
            and out["status2"] == "cancelled"
            and not late
            and out["ttfa_ms"] is not None
        )
    await client.close()
    return out


async def _late_audio(conn: Any, wait_s: float = 0.3) -> bool:
    """Whether an audio delta comes after ``response.done`` (it must not)."""
    try:
        async with asyncio.timeout(wait_s):
            async for ev in conn:
                if ev.type == "response.output_audio.delta":
                    return True
    except TimeoutError:
        pass
    return False


async def _chat(base: str, model: str, pcm: bytes, max_tokens: int) -> float | None:
    import openai

    # Any: the SDK's overloads type no omnix model name nor dict parts.
    client: Any = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0)
    part = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(pcm).decode(), "format": "pcm16"},
    }
    t0 = time.perf_counter()
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": [part]}],
        modalities=["text", "audio"],
        audio={"format": "pcm16", "voice": "default"},
        max_tokens=max_tokens,
        stream=True,
    )
    first: float | None = None
    async for chunk in stream:
        audio = getattr(chunk.choices[0].delta, "audio", None) if chunk.choices else None
        if audio and first is None:
            first = time.perf_counter()
    await client.close()
    return (first - t0) * 1000 if first is not None else None


async def _client(base: str, model: str, a: dict[str, Any]) -> list[dict[str, Any]]:
    pcm = _tone(a["audio_s"])
    # Warm both paths up (first compilations, first allocations): not measured.
    await _session(base, model, pcm, a)
    await _chat(base, model, pcm, a["max_tokens"])
    rounds = []
    for _ in range(a["runs"]):
        sessions = await asyncio.gather(
            *(_session(base, model, pcm, a) for _ in range(a["sessions"])),
            return_exceptions=True,
        )
        http = await asyncio.gather(
            *(_chat(base, model, pcm, a["max_tokens"]) for _ in range(a["sessions"])),
            return_exceptions=True,
        )
        rounds.append(
            {
                "sessions": [
                    s if isinstance(s, dict) else {"ok": False, "error": repr(s)} for s in sessions
                ],
                "http": [h for h in http if isinstance(h, float)],
            }
        )
    return rounds


def _client_main(base: str, model: str, a: dict[str, Any], out: Any) -> None:
    try:
        out.put(asyncio.run(_client(base, model, a)))
    except BaseException as exc:
        out.put({"error": repr(exc)})
        raise


# -- the server (this process) ---------------------------------------------------


def _p50(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 2) if xs else None


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    ttfa, gap, http, ratio = [], [], [], []
    ok = total = 0
    for r in rounds:
        s = r["sessions"]
        total += len(s)
        ok += sum(1 for x in s if x.get("ok"))
        t = _p50([x["ttfa_ms"] for x in s if x.get("ttfa_ms") is not None])
        g = _p50([x["gap_ms"] for x in s if x.get("gap_ms") is not None])
        h = _p50(r["http"])
        ttfa.append(t)
        gap.append(g)
        http.append(h)
        ratio.append(round(t / h, 3) if t is not None and h else None)
    out: dict[str, Any] = {}
    for name, xs in (
        ("ttfa_p50_ms", ttfa),
        ("http_ttfa_p50_ms", http),
        ("ttfa_ratio_vs_http", ratio),
        ("bargein_gap_p50_ms", gap),
    ):
        got = [x for x in xs if x is not None]
        out[name] = round(statistics.median(got), 3) if got else None
        out[f"{name}_min"] = min(got) if got else None
        out[f"{name}_runs"] = xs
    out["sessions_ok"] = ok
    out["sessions_total"] = total
    errors = [
        x.get("error") or f"turns ended {x.get('status1')}, {x.get('status2')}"
        for r in rounds
        for x in r["sessions"]
        if not x.get("ok")
    ]
    out["errors"] = errors[:5]
    return out


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from omnix.api import Omni
    from omnix.pipelines.registry import DEFAULT_PIPELINE
    from omnix.stages.options import RuntimeOptions
    from omnix.testing.serving import serve_omni

    pipeline = load_pipeline_arg(args.pipeline or DEFAULT_PIPELINE)
    media = pipeline.input_media
    if "audio" not in pipeline.outputs or media is None or not media.audio:
        raise UsageError(
            f"--pipeline {args.pipeline}: the bench needs a pipeline that takes and makes audio "
            "(tiny-omni, or a scripted one with media = { audio = true })"
        )
    prepare_pipeline_models(pipeline, args.model_dir)
    load = round(os.getloadavg()[0], 2)
    a = {
        "sessions": args.sessions,
        "runs": args.runs,
        "max_tokens": args.max_tokens,
        "barge_tokens": args.barge_tokens,
        "audio_s": args.audio_s,
    }
    omni = Omni(
        pipeline,
        runtime_options=RuntimeOptions(forward_worker_output=False, start_timeout_s=600.0),
    )
    async with serve_omni(omni, telemetry=False, ready_timeout_s=600.0) as server:
        _log(
            f"serving {pipeline.name} at {server.url}; {args.sessions} sessions x {args.runs} runs"
        )
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        proc = ctx.Process(
            target=_client_main, args=(server.url + "/v1", pipeline.name, a, q), daemon=True
        )
        proc.start()
        # Wait on a thread: the server keeps serving on this loop.
        rounds = await asyncio.to_thread(q.get, True, 3600)
        await asyncio.to_thread(proc.join, 10)
    if isinstance(rounds, dict):
        raise RuntimeError(f"the bench's client failed: {rounds['error']}")
    return {
        **_summary(rounds),
        "sessions": args.sessions,
        "runs": args.runs,
        "pipeline": pipeline.name,
        "load_avg_1m_start": load,
        "load_avg_1m_end": round(os.getloadavg()[0], 2),
    }


def run(args: argparse.Namespace) -> int:
    if args.sessions < 1 or args.runs < 1:
        raise UsageError("--sessions and --runs must be at least 1")
    res = run_on_loop(_bench(args))
    if not getattr(args, "json", False):
        print(
            f"TTFA p50 {res['ttfa_p50_ms']} ms (HTTP {res['http_ttfa_p50_ms']} ms, "
            f"x{res['ttfa_ratio_vs_http']}); barge-in gap p50 {res['bargein_gap_p50_ms']} ms; "
            f"{res['sessions_ok']}/{res['sessions_total']} sessions ok; load {res['load_avg_1m_start']}"
        )
    print(json.dumps(res))
    return 0 if res["sessions_ok"] == res["sessions_total"] else 1
