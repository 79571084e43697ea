"""``omnix bench serve``: a load generator a user points at a live server.

Owns: what ``vllm bench serve`` does not measure, against any
OpenAI-compatible server (omnix, vLLM, vLLM-Omni): streamed chat (text),
chat with audio output (``modalities: ["text", "audio"]``), chat with an
audio input part (a short generated WAV), speech (``/v1/audio/speech``,
streamed where the server streams it) and image generation, sent at a
bounded ``--concurrency`` and/or a Poisson ``--request-rate`` (seeded), and
the figures of the run: percentiles of TTFT, TPOT, ITL, TTFP (first audio),
audio RTF and E2EL, throughput, failures with their first messages.  JSON
keys follow ``vllm bench serve`` where it has one (``completed``,
``mean_ttft_ms``, ``p99_e2el_ms``...) and vLLM-Omni's for audio
(``mean_audio_ttfp_ms``, ``mean_audio_rtf``, ``audio_throughput``).

Definitions (per request; the clock starts when the request is sent):

* TTFT: first chunk with non-empty text (``delta.content``).  vLLM's bench
  counts the first chunk with any choice, which omnix sends at admission
  (the role chunk), so it would measure admission, not the first token.
* ITL: gaps between successive text chunks; TPOT: (last text chunk - TTFT)
  / (output tokens - 1), tokens from ``usage`` (``stream_options``), else
  the number of text chunks.
* TTFP: first audio *sample* bytes (past any WAV header); audio seconds
  from the WAV header's rate (``pcm``: ``--sample-rate``); RTF: (last audio
  byte - start) / audio seconds.
* E2EL: until the response ended.

This module is the verb: its flags, ``run`` (the exit status, the table
or ``--json``, ``--result-file``) and ``bench``, handed on from
``serve_run`` for callers in Python.  Beside it: the run's pacing
(``serve_run``), a request (``serve_client``), what servers send
(``serve_wire``), counting audio (``audio_meter``) and the figures
(``serve_results``).

Does not own the server nor any omnix internals: it only speaks HTTP, so it
imports nothing from the product.  A request the server refuses or fails
(e.g. an ``input_audio`` part a server does not take) is counted in
``failed`` with its message; nothing is worked around.
"""

from __future__ import annotations

import argparse
import os
import sys

import msgspec

from omnix.bench.loop import run_on_loop
from omnix.bench.serve_client import KINDS
from omnix.bench.serve_results import ServeBenchResult, ServeBenchSummary, summary_table
from omnix.bench.serve_run import BenchError, bench

__all__ = ["add_arguments", "bench", "run"]


_EPILOG = """\
examples:
  omnix bench serve --base-url http://127.0.0.1:8091 --kind audio-out --num-prompts 50 --concurrency 4
  omnix bench serve --base-url http://127.0.0.1:8091 --kind mix --request-rate 2 --seed 1 --json
  omnix bench serve --base-url http://gpu-host:8000 --model Qwen/Qwen3-Omni --kind speech \\
      --result-file result.json

kinds: text (streamed chat), audio-out (streamed chat with modalities text+audio),
audio-in (chat with an input_audio part: a generated WAV), speech (/v1/audio/speech),
image (/v1/images/generations), mix (a seeded random draw among --mix).

Exit status: 0 all requests completed, 1 some failed, 2 the run could not start.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Load a live OpenAI-compatible server (omnix, vLLM, vLLM-Omni) with chat,\n"
        "audio, speech and image requests; report TTFT, TPOT, ITL, TTFP, audio RTF\n"
        "and E2EL percentiles, throughput and failures."
    )
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    # One group per concern, in the order --help lists them.
    _target_flags(parser)
    _load_flags(parser)
    _audio_flags(parser)
    _request_flags(parser)


def _target_flags(parser: argparse.ArgumentParser) -> None:
    """Which server and model, and what kinds of request."""
    parser.add_argument(
        "--base-url",
        required=True,
        help="the server, e.g. http://127.0.0.1:8091 (a trailing /v1 is ignored)",
    )
    parser.add_argument(
        "--model", default="", help="model name (default: the first of GET /v1/models)"
    )
    parser.add_argument(
        "--kind", choices=(*KINDS, "mix"), default="text", help="what to send (default: text)"
    )
    parser.add_argument(
        "--mix",
        default="text,audio-out,speech",
        help="kinds drawn by --kind mix, comma-separated (default: text,audio-out,speech)",
    )


def _load_flags(parser: argparse.ArgumentParser) -> None:
    """How many requests, how fast, and what each generates."""
    parser.add_argument(
        "--num-prompts", type=_positive_int, default=100, help="requests to send (default: 100)"
    )
    parser.add_argument(
        "--concurrency",
        "--max-concurrency",
        dest="concurrency",
        type=_non_negative_int,
        default=8,
        help="requests in flight at most; 0: unbounded (default: 8)",
    )
    parser.add_argument(
        "--request-rate",
        type=_positive_float,
        default=float("inf"),
        help="Poisson arrivals at this many requests/s (default: inf, all at once up to --concurrency)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the prompts, the mix and the arrivals (default: 0)",
    )
    parser.add_argument(
        "--max-tokens",
        type=_non_negative_int,
        default=64,
        help="max_completion_tokens of chat requests; 0: not sent (default: 64)",
    )
    parser.add_argument(
        "--prompt-words",
        type=_positive_int,
        default=16,
        help="words per generated prompt (default: 16)",
    )


def _audio_flags(parser: argparse.ArgumentParser) -> None:
    """The audio asked for and sent."""
    parser.add_argument(
        "--voice", default="alloy", help="voice of audio-out and speech requests (default: alloy)"
    )
    parser.add_argument(
        "--audio-format",
        choices=("wav", "pcm"),
        default="wav",
        help="audio asked for: wav, or raw 16-bit PCM (chat: pcm16) (default: wav)",
    )
    parser.add_argument(
        "--sample-rate",
        type=_positive_int,
        default=24000,
        help="rate of raw PCM audio, to count its seconds (default: 24000)",
    )
    parser.add_argument(
        "--speech-stream",
        choices=("auto", "audio", "sse", "stream", "none"),
        default="auto",
        help="speech: stream_format audio|sse, vLLM-Omni's stream=true, or whole files; auto: the first of audio, stream, none the server does not refuse with 400/422 (default: auto)",
    )
    parser.add_argument(
        "--input-audio-seconds",
        type=_positive_float,
        default=1.0,
        help="length of the generated WAV of audio-in requests (default: 1.0)",
    )


def _request_flags(parser: argparse.ArgumentParser) -> None:
    """Images, extra body, auth, timeouts and where the result goes."""
    parser.add_argument(
        "--image-size", default="", help="size of image requests, e.g. 256x256 (default: not sent)"
    )
    parser.add_argument(
        "--extra-body", default="", help="a JSON object merged into every request body"
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY", ""),
        help="sent as Authorization: Bearer KEY (default: $OPENAI_API_KEY)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=600.0,
        help="seconds a request may take in all (default: 600)",
    )
    parser.add_argument(
        "--result-file",
        default="",
        help="save the full result (summary and every request) as JSON to this path",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _summary_json(res: ServeBenchResult) -> bytes:
    summary = {f: getattr(res, f) for f in ServeBenchSummary.__struct_fields__}
    return msgspec.json.encode(ServeBenchSummary(**summary))


def run(args: argparse.Namespace) -> int:
    try:
        res = run_on_loop(bench(args))
    except BenchError as exc:
        print(f"omnix bench serve: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("omnix bench serve: interrupted", file=sys.stderr)
        return 130
    if args.result_file:
        try:
            with open(args.result_file, "wb") as f:
                f.write(msgspec.json.format(msgspec.json.encode(res), indent=2))
        except OSError as exc:
            print(f"omnix bench serve: cannot write {args.result_file}: {exc}", file=sys.stderr)
            return 2
    if getattr(args, "json", False):
        print(_summary_json(res).decode())
    else:
        print(summary_table(res))
        if args.result_file:
            print(f"full result saved to {args.result_file}")
    return 0 if res.failed == 0 else 1
