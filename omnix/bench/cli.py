"""``omnix bench NAME``: dispatch to one benchmark module.

Owns: the bench sub-verbs.  Each benchmark lives in ``omnix/bench/NAME.py``
with ``add_arguments(parser)`` and ``run(args) -> int``; every one accepts
``--json`` and then prints its figures as one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import importlib

BENCHES = {
    "log": "appends/s to the memory and disk logs, fold rate, state size",
    "hop": "one orchestration hop's latency and chunk events/s through a worker",
    "engines": "omnix vs direct vLLM (TTFT, tokens/s) and TTFP with/without async chunk",
    "http": "SSE streams/s and events/s through the HTTP layer",
    "media": "TTFT of chat with image/audio input, admission cost per MB, text beside 5 MB images",
    "replay": "fold and drive replay speed on a 1M-event trace",
    "telemetry": "throughput with telemetry on vs off",
    "failover": "client-seen gap of a mid-stream migration; resume after a server restart",
    "serve": "load a live OpenAI-compatible server: chat, audio, speech, images (TTFT, TTFP, RTF, E2EL)",
    "soak": "server RSS growth per request over 2,000 chat requests with audio (retention)",
    "speech": "Qwen3-Omni speech against transformers: oracle equality, TTFP, RTF, throughput",
    "tts": "Qwen3-TTS served (omnix serve PATH) against qwen-tts: oracle equality, TTFP, RTF, "
    "throughput",
    "diffusion": "images/s alone and 4 at a time (batched), steps run after a cancel",
    "realtime": "voice sessions over /v1/realtime: TTFA against HTTP, barge-in gap, sessions ok",
    "duplex": "full-duplex frame latency (user frame in -> model frame out) p50/p99, frames "
    "late, by sessions: served, or the engine's tick alone (--sizes real: Moshi 7B on a GPU)",
    "placement": "--placement ray: start to /ready against spawn, a node lost -> its replica back",
    "startup": "omnix serve start to ready, and the CPU its processes spent, warm workers "
    "(forked from a zygote) against cold",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name, help_ in BENCHES.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_prog=p.prog)
        p.add_argument(
            "--json", action="store_true", help="print figures as one JSON object on the last line"
        )
        importlib.import_module(f"omnix.bench.{name}").add_arguments(p)


def run(args: argparse.Namespace) -> int:
    return int(importlib.import_module(f"omnix.bench.{args.bench}").run(args) or 0)
