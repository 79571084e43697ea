"""``omnix bench engines``: what omnix costs on top of the engine it drives.

Owns two measurements on real engines and the tiny models, in one run:

* ``tiny-text`` through omnix vs vLLM's ``AsyncLLM`` driven directly, on
  the same ``thinker`` folder with the very ``AsyncEngineArgs`` omnix's
  ``VllmEngine`` builds (``omnix.engines.vllm_engine.engine_args``): TTFT
  p50 (the batch's start to the first streamed token) and tokens/s (output tokens over
  the wall time of a batch of ``c`` simultaneous requests) at concurrency
  1, 8 and 32.  Same prompts (through the same chat template), same
  sampling (the stage's defaults, a fixed ``max_tokens``), the same seed per
  request index, so both sides generate the same tokens; the run reports
  how many requests matched token for token.  Targets: omnix
  TTFT p50 <= 1.10 x direct + 2 ms, tokens/s >= 0.95 x direct.
* ``tiny-omni`` TTFP (submit to the first audio chunk) with async chunk
  forwarding on (the built-in config) and off (the same config with every
  edge's ``forward = "finish"``); target: forwarding at least halves it.
  Both variants run on the same workers, placed by the runtime's default
  (``--vllm-cpu-placement``).

Fairness on a small shared machine: both sides run the same engine
layout and placement (``--vllm-cpu-placement``, docs/runtime.md): the
direct engine core is started on the CPUs omnix's runtime gives its
worker's engine core, and this process, the client of both sides and
omnix's server, is pinned to the frontend CPUs (``pin_server``).  Both
sides are started (one after the other), then measured in alternating
rounds (the order swapped every round), so a change in the machine's load
hits both; between rounds the bench sleeps ``--settle`` seconds (with
vLLM's ``mp`` layout its model process busy-polls for 1 s after its last
step).  Each request's TTFT counts from its batch's start on both sides
(``_batch``).  The load average is printed before and after.

A quick run of the bench's own code (``tests/bench/test_smoke.py``):
``--levels 1 --rounds 1 --requests 1`` and ``--ttfp-pipeline`` a scripted
thinker -> talker -> code2wav (the figures then mean nothing).

This module is the verb: its flags, the run of both parts and their
table and JSON.  Beside it: the tiny-text part (``engines_text``), the
TTFP part (``engines_ttfp``), what both send and omnix's side of them
(``engines_sides``) and CPU time by process role (``cpu_meter``).

Does not own the engines, the runtime or the API it drives (it uses
``Omni`` and ``AsyncLLM`` as a user would), nor the HTTP layer (``omnix
bench http``) or a hop's floor (``omnix bench hop``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from typing import Any

from omnix.bench.engines_text import LEVELS, TTFT_RATIO, TTFT_SLACK_MS, text_figures, text_phase
from omnix.bench.engines_ttfp import TTFP_CUT, ttfp_phase
from omnix.bench.loop import run_on_loop
from omnix.bench.pipeline_arg import load_pipeline_arg, prepare_pipeline_models
from omnix.usage import arg_type, count, counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _text_flags(parser)
    _ttfp_flags(parser)
    _setup_flags(parser)


def _levels(text: str) -> tuple[int, ...]:
    return counts(text, example="1,8,32")


def _text_flags(parser: argparse.ArgumentParser) -> None:
    """The tiny-text comparison: tokens, rounds, batches, levels."""
    parser.add_argument(
        "--max-tokens",
        type=count,
        default=48,
        help="tokens per tiny-text request (default %(default)s)",
    )
    # Many short rounds: the host's speed drifts over seconds (an engine
    # core's CPU per token moved 144-195 us between 2-second stretches of
    # one process), and finer alternation cancels more of it than a few
    # long rounds.
    parser.add_argument(
        "--rounds",
        type=count,
        default=16,
        help="alternating rounds per concurrency level (default %(default)s)",
    )
    parser.add_argument(
        "--requests",
        type=count,
        default=6,
        metavar="N",
        help="requests per side per round at concurrency 1 (at c > 1: max(B, N // c) batches of c, "
        "B from --batches; default %(default)s)",
    )
    # A burst's TTFT p50 swings from batch to batch (20-60 ms at c=32: how
    # vLLM groups arrivals into prefill steps), so the pooled p50 needs many
    # batches (rounds x B) to hold still from run to run.
    parser.add_argument(
        "--batches",
        type=count,
        default=2,
        metavar="B",
        help="at least this many batches of c per side per round at concurrency > 1 "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=0.3,
        metavar="S",
        help="pause between rounds, default %(default)s (use 1.2 with cpu_executor = "
        '"mp": vLLM\'s model process then busy-polls for 1 s after its last step)',
    )
    parser.add_argument(
        "--levels",
        type=arg_type(_levels, "levels"),
        default=LEVELS,
        metavar="C,...",
        help="concurrency levels of the tiny-text part (default 1,8,32; a quick run: 1)",
    )


def _ttfp_flags(parser: argparse.ArgumentParser) -> None:
    """The TTFP comparison: requests, tokens, the talker's CPUs, the pipeline."""
    parser.add_argument(
        "--ttfp-requests",
        type=count,
        default=16,
        help="tiny-omni requests per variant (default %(default)s)",
    )
    parser.add_argument(
        "--thinker-tokens",
        type=count,
        default=96,
        help="tiny-omni thinker max_tokens (default %(default)s)",
    )
    parser.add_argument(
        "--talker-tokens",
        type=count,
        default=64,
        help="tiny-omni talker max_tokens per piece (default %(default)s)",
    )
    parser.add_argument(
        "--talker-cpus",
        default="",
        metavar="LIST",
        help="pin tiny-omni's talker worker (and its vLLM processes) to these CPUs, e.g. 1, "
        "instead of the runtime's placement (docs/runtime.md)",
    )
    parser.add_argument(
        "--ttfp-pipeline",
        default="tiny-omni",
        metavar="NAME|PATH",
        help="the thinker -> talker -> code2wav pipeline of the TTFP part (default tiny-omni; "
        "a scripted one makes a quick run of the bench itself)",
    )


def _setup_flags(parser: argparse.ArgumentParser) -> None:
    """Placement, which parts run, models and start-up."""
    parser.add_argument(
        "--vllm-cpu-placement",
        choices=("spread", "vllm"),
        default="spread",
        help="the runtime's placement on CPU (docs/runtime.md), applied to both sides: spread "
        "(default: vLLM engine cores on CPUs of their own, this process and the workers on the "
        "rest) or vllm (no placement: vLLM's and the OS's own choice)",
    )
    parser.add_argument("--skip-text", action="store_true", help="only the TTFP part")
    parser.add_argument("--skip-ttfp", action="store_true", help="only the tiny-text part")
    parser.add_argument(
        "--model-dir", default=None, help="tiny model dir (default $OMNIX_MODEL_DIR)"
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="bound on engine start-up (slow on a busy 2-core machine)",
    )


# -- entry point ----------------------------------------------------------------------------


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    text = load_pipeline_arg("tiny-text")
    omni = load_pipeline_arg(args.ttfp_pipeline)
    for p in (text, omni):  # builds what is missing (seconds), exports OMNIX_MODEL_DIR
        prepare_pipeline_models(p, args.model_dir)
    # A worker is declared lost after 2 s without heartbeats by default; on
    # a 2-core machine shared with other work (and vLLM's busy-polling
    # processes) a starved worker went silent that long during its first
    # request.  A loss is not what this bench measures: tolerate 10 s.
    # pin_server: this process is omnix's server (and the direct client):
    # the runtime puts it on the frontend CPUs as ``omnix serve`` does.
    from omnix.stages.options import RuntimeOptions

    options = RuntimeOptions(
        start_timeout_s=args.start_timeout,
        lost_after_s=10.0,
        vllm_cpu_placement=args.vllm_cpu_placement,
        pin_server=True,
    )
    res: dict[str, Any] = {"load_average_start": round(os.getloadavg()[0], 2)}
    if not args.skip_text:
        res.update(text_figures(await text_phase(args, text, options)))
        res["max_tokens"] = args.max_tokens
        res["levels"] = list(args.levels)
    if not args.skip_ttfp:
        res.update(await ttfp_phase(args, omni, options))
    res["load_average_end"] = round(os.getloadavg()[0], 2)
    res["cpus"] = os.cpu_count()
    return res


def _table(res: dict[str, Any]) -> None:
    if "ttft_p50_ratio_c1" in res:
        print(f"tiny-text, {res['max_tokens']} tokens per request, omnix vs vLLM AsyncLLM direct")
        print(
            f"{'c':>3} {'TTFT p50 direct':>16} {'omnix':>9} {'ratio':>7} {'target':>8}"
            f" {'tok/s direct':>13} {'omnix':>9} {'ratio':>7}  same tokens"
        )
        for c in res["levels"]:
            d, o = res[f"ttft_p50_ms_direct_c{c}"], res[f"ttft_p50_ms_omnix_c{c}"]
            target = TTFT_RATIO * d + TTFT_SLACK_MS
            ok_t = "ok" if res[f"ttft_ok_c{c}"] else "MISSED"
            ok_r = "ok" if res[f"tokens_per_s_ok_c{c}"] else "MISSED"
            print(
                f"{c:>3} {d:>13.1f} ms {o:>6.1f} ms {res[f'ttft_p50_ratio_c{c}']:>7.3f} "
                f"{target:>5.1f} ms {res[f'tokens_per_s_direct_c{c}']:>13.0f} "
                f"{res[f'tokens_per_s_omnix_c{c}']:>9.0f} {res[f'tokens_per_s_ratio_c{c}']:>7.3f}  "
                f"{res[f'same_tokens_c{c}']}/{res[f'requests_c{c}']}   TTFT {ok_t}, tok/s {ok_r}"
            )
        print(
            "omnix TTFT split (p50, from log stamps): submit -> worker Started in the log / "
            "-> first Chunk in the log"
        )
        for c in res["levels"]:
            print(
                f"{c:>3} {res[f'omnix_to_started_p50_ms_c{c}']:>8.2f} ms / "
                f"{res[f'omnix_to_first_chunk_p50_ms_c{c}']:.2f} ms"
            )
        print(
            "CPU per output token (us; moves far less with load than wall time), by process: bench = this process "
            "(direct: the AsyncLLM client; omnix: orchestrator, log, client); host steal = time "
            "the hypervisor took from this machine's CPUs"
        )
        for c in res["levels"]:
            parts = []
            for side in ("direct", "omnix"):
                roles = [
                    ("bench", "bench"),
                    ("omnix_worker", "worker"),
                    ("engine_core", "engine core"),
                    ("model", "model"),
                    ("steal", "host steal"),
                ]
                vals = [
                    f"{label} {res[k]:.0f}"
                    for key, label in roles
                    if (k := f"cpu_us_per_token_{key}_{side}_c{c}") in res
                ]
                parts.append(f"{side}: " + ", ".join(vals))
            print(f"{c:>3} " + " | ".join(parts))
    if "ttfp_ms_chunked" in res:
        print(
            f"tiny-omni TTFP p50 over {res['ttfp_requests']} sequential requests (thinker "
            f"max_tokens {res['ttfp_thinker_tokens']}, talker {res['ttfp_talker_tokens']} per "
            f"piece, talker CPUs: {res['talker_cpus']}, vLLM workers placed: {res['vllm_cpus']})"
        )
        print(
            f"  async chunk on  {res['ttfp_ms_chunked']:8.1f} ms   (TTFT {res['ttft_ms_chunked']:.1f} ms)"
        )
        print(
            f"  async chunk off {res['ttfp_ms_unchunked']:8.1f} ms   (TTFT {res['ttft_ms_unchunked']:.1f} ms)"
        )
        print(
            f"  on/off {res['ttfp_cut']:.3f} (target <= {TTFP_CUT}): "
            f"{'ok' if res['ttfp_ok'] else 'MISSED'}"
        )
    print(
        f"load average (1 min) {res['load_average_start']} at start, {res['load_average_end']} "
        f"at end, on {res['cpus']} CPUs"
    )


def run(args: argparse.Namespace) -> int:
    # What the runtime gives its workers (so the direct engine's processes,
    # spawned from here, run with the same setting); vLLM sets its model
    # process's own thread count and binding either way.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        res = run_on_loop(_bench(args))
    finally:
        gc.unfreeze()  # frozen at exit, triton reports leaks (worker.exit_without_finalizing)
    _table(res)
    print(json.dumps(res))
    return 0
