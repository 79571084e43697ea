"""``omnix serve``'s command line: the argparse flags, one group per concern.

Owns: building the verb's parser (``add_arguments``) in the order
``--help`` lists the groups (what is served, lifecycle, workers, the
replicated log's flags from ``serve_cluster.py``, HTTP, retention, the
operator's), the flag groups ``omnix frontend`` shares (``listen_flags``,
``max_body_flag``, ``resume_grace_flag``, ``http_flags``,
``output_flags``), and adding vLLM's own engine flags only when the
command line may name one (their import takes seconds).

Does not own what the flags' values become (``serve_options.py``), the
value parsers (``quantities.py``), the config file (``serve_config.py``)
nor the process lifecycle (``serve.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from omnix.http.options import DEFAULT_MAX_BATCH, DEFAULT_MAX_BODY
from omnix.http.serve_cluster import add_log_flags
from omnix.http.serve_config import defaults_of
from omnix.pipelines.vllm_args import add_engine_flags
from omnix.transport.sockets import check_endpoint
from omnix.usage import arg_type, port_number

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8091


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # One group of flags per concern, in the order --help lists them.
    for group in (
        _pipeline_flags,
        _lifecycle_flags,
        _worker_flags,
        add_log_flags,
        http_flags,
        _retention_flags,
        _operator_flags,
    ):
        group(parser)
    # vLLM's engine flags come from the installed vLLM, whose import takes
    # seconds: only when the command line may hold one (or asks for help).
    dests = add_engine_flags(parser) if _may_name_engine_flags(parser) else []
    parser.usage = (
        "%(prog)s [PATH] [--pipeline NAME|FILE] [--host H] [--port P] [--api-key KEY] "
        "[vLLM engine flags] [...]  (%(prog)s --help lists every flag)"
    )
    parser.set_defaults(_serve_options=defaults_of(parser), _vllm_dests=dests)


def _may_name_engine_flags(parser: argparse.ArgumentParser) -> bool:
    """Whether the command line has a flag that is not omnix's own (or
    asks for help, or reads flags from a file)."""
    own = set(parser._option_string_actions)
    for token in _serve_argv():
        if token == "--":
            break
        name = token.split("=", 1)[0]
        if name in ("-h", "--help", "--config") or (
            token.startswith("-") and name not in own and not _is_number(token)
        ):
            return True
    return False


def _serve_argv() -> list[str]:
    """This process's command line after ``serve`` when it is ``omnix
    serve ...`` (``omnix.cli`` sets ``sys.argv`` for a call too), else
    nothing: a parser built for another purpose gets omnix's flags only."""
    argv = sys.argv[1:]
    verb = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    return argv[verb + 1 :] if verb is not None and argv[verb] == "serve" else []


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _pipeline_flags(parser: argparse.ArgumentParser) -> None:
    """What is served, where it listens, who may call it, where it keeps its log and models."""
    from omnix.pipelines.registry import DEFAULT_PIPELINE

    parser.add_argument(
        "model_path",
        nargs="?",
        default=None,
        metavar="PATH",
        help="a local model folder to serve, or a Hugging Face id ORG/NAME in the local "
        "Hugging Face cache (never downloaded), as `vllm serve PATH`: its config.json or "
        "model_index.json decides the pipeline (docs/models.md, 'Serving a model folder')",
    )
    parser.add_argument(
        "--model", default=None, metavar="PATH", help="the model folder, as PATH gives it"
    )
    parser.add_argument(
        "--pipeline",
        default=None,
        metavar="NAME|PATH",
        help="built-in pipeline name or a TOML/YAML/JSON config file (default, with no model "
        f"folder: {DEFAULT_PIPELINE})",
    )
    parser.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE|TEMPLATE",
        help="vLLM's --chat-template: the chat template of every vLLM stage, a file or the "
        "template itself (default: the tokenizer's own)",
    )
    parser.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        default=None,
        help="vLLM's flag: tool_choice 'auto' on the text stages, their tool calls read by "
        "--tool-call-parser (default: the pipeline's, by the model's architecture)",
    )
    parser.add_argument(
        "--tool-call-parser",
        default=None,
        metavar="NAME",
        help="vLLM's flag: the tool-call parser of the text stages, one of the installed "
        "vLLM's (hermes, qwen3_xml, ...; default: the pipeline's)",
    )
    parser.add_argument(
        "--reasoning-parser",
        default=None,
        metavar="NAME",
        help="vLLM's flag: the reasoning parser of the text stages, one of the installed "
        "vLLM's (qwen3, deepseek_r1, ...; default: the pipeline's)",
    )
    parser.add_argument(
        "--stage-devices",
        action="append",
        default=None,
        metavar="STAGE=DEVICES",
        help="the GPUs a stage's replicas use, e.g. thinker=0,1 (repeat per stage; over the "
        "pipeline's own devices; ignored on a machine without a GPU)",
    )
    parser.add_argument(
        "--cache",
        action="append",
        default=None,
        metavar="[STAGE:]KIND[,OPT=VALUE...]",
        help="a diffusion stage's step cache (diffusers' hooks), over the pipeline's own: "
        "first_block, taylorseer, pyramid_attention_broadcast or none, with diffusers' options, "
        "e.g. image:first_block,threshold=0.1 (no STAGE: every diffusion stage)",
    )
    parser.add_argument(
        "--cfg-batch",
        action="append",
        default=None,
        metavar="[STAGE:]on|off",
        help="a diffusion stage's classifier-free guidance forwards run as one batch, over the "
        "pipeline's own (default: on for Wan, which omnix batches), e.g. video:off "
        "(no STAGE: every diffusion stage)",
    )
    parser.add_argument(
        "--compile",
        action="append",
        default=None,
        metavar="[STAGE:]off|blocks|model",
        help="torch.compile of a diffusion stage's denoiser, over the pipeline's own: blocks "
        "(each transformer block; works with every cache) or model (the whole transformer; "
        "not with a cache); refused at start on a device that cannot compile (no Triton on "
        "CUDA, no C++ compiler on a CPU), e.g. video:blocks (no STAGE: every diffusion stage)",
    )
    listen_flags(parser, DEFAULT_PORT)
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="keep the event log and blobs in DIR (default: in memory, lost on exit)",
    )
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="where the tiny models are (built there if missing; default: $OMNIX_MODEL_DIR "
        "or ~/.cache/omnix/models)",
    )
    parser.add_argument(
        "--no-build", action="store_true", help="fail instead of building missing tiny models"
    )


def _lifecycle_flags(parser: argparse.ArgumentParser) -> None:
    """How long shutdown and start-up may take; the largest body."""
    parser.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="seconds in-flight requests get to finish on shutdown",
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=600.0,
        help="seconds the workers get to load their models (default 600)",
    )
    max_body_flag(parser)


def _worker_flags(parser: argparse.ArgumentParser) -> None:
    """Where workers connect and which this server starts; resuming requests."""
    parser.add_argument(
        "--workers-endpoint",
        default=None,
        type=arg_type(check_endpoint, "endpoint"),
        metavar="ENDPOINT",
        help="where stage workers connect: tcp://0.0.0.0:PORT to take workers from other hosts "
        "(default: a private ipc:// socket, this host only)",
    )
    parser.add_argument(
        "--spawn",
        default="all",
        metavar="all|none|STAGE,...",
        help="the stages whose workers this server starts itself; the others wait for "
        "`omnix worker --connect ENDPOINT --stage NAME` (default: all)",
    )
    parser.add_argument(
        "--cold-workers",
        action="store_true",
        help="start each spawned worker in a fresh Python rather than forking it from a process "
        'that imported its engine\'s modules once (docs/runtime.md, "Warm starts")',
    )
    parser.add_argument(
        "--worker-token",
        default=os.environ.get("OMNIX_WORKER_TOKEN") or None,
        metavar="TOKEN",
        help="a shared secret every worker must present (required when the workers endpoint "
        "is tcp and not loopback-only; default: $OMNIX_WORKER_TOKEN)",
    )
    parser.add_argument(
        "--placement",
        choices=("spawn", "ray"),
        default="spawn",
        help="how the spawned stages' replicas run: spawn, local processes of this server "
        "(default); ray, each replica a Ray actor on a node of a Ray cluster that offers its "
        "stage's placement table (docs/ray.md)",
    )
    parser.add_argument(
        "--ray-address",
        default="auto",
        metavar="auto|HOST:PORT",
        help="with --placement ray: the Ray cluster to join (default auto: $RAY_ADDRESS or the "
        "cluster `ray start` made on this host; local: start one here)",
    )
    parser.add_argument(
        "--resume-within",
        type=float,
        default=300.0,
        metavar="S",
        help="restarted on a --log-dir, continue the requests in flight that were admitted at "
        "most S seconds ago; older ones fail (reason not_resumed) (default 300)",
    )
    resume_grace_flag(parser)


def listen_flags(parser: argparse.ArgumentParser, port: int) -> None:
    """Where the API listens and the key it asks for (serve and frontend)."""
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to bind (default: {DEFAULT_HOST})"
    )
    parser.add_argument(
        "--port",
        type=port_number,
        default=port,
        help=f"port (default: {port}; 0: any free)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OMNIX_API_KEY") or None,
        help="require 'Authorization: Bearer KEY' on every route but the probes /health and "
        "/ready (default: $OMNIX_API_KEY)",
    )


def max_body_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-body-mb",
        type=float,
        default=DEFAULT_MAX_BODY / (1024 * 1024),
        help="largest request body accepted, MiB; room for media parts sent inline "
        f"(default {DEFAULT_MAX_BODY // (1024 * 1024)})",
    )


def resume_grace_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--resume-grace",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds a streamed request keeps running after its client drops, for the client "
        "to resume with GET /v1/requests/ID/stream and Last-Event-ID (default 30; 0: cancel at once)",
    )


def output_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--access-log", action="store_true", help="log one line per HTTP request")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")


def http_flags(parser: argparse.ArgumentParser) -> None:
    """Which browsers and media hosts the API trusts; the largest batch."""
    parser.add_argument(
        "--allowed-origins",
        default="",
        metavar="ORIGIN,...",
        help="browser origins allowed to call the API (CORS), comma-separated, e.g. "
        "http://localhost:3000; * for any (default: none, browsers are refused)",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=DEFAULT_MAX_BATCH,
        metavar="N",
        help="the most requests one call may submit (a chat batch of conversations, images n); "
        f"a larger batch is 400 (default {DEFAULT_MAX_BATCH})",
    )
    parser.add_argument(
        "--allowed-media-domains",
        default="",
        metavar="HOST,...",
        help="hosts whose http(s) image/audio URLs the server may fetch, comma-separated, "
        "exact names (default: none, media come inline as data: URLs or base64)",
    )


def _retention_flags(parser: argparse.ArgumentParser) -> None:
    """How long ended requests are kept (docs/retention.md)."""
    parser.add_argument(
        "--retain",
        default="10m",
        metavar="DURATION",
        help="keep an ended request's events, blobs and trace this long after it ended, then "
        "release it (asking about it is then 410 Gone): 90s, 10m, 2h, 0 (release at once) or "
        "off (no time bound) (default 10m)",
    )
    parser.add_argument(
        "--retain-requests",
        default="2000",
        metavar="N",
        help="keep at most N ended requests (the oldest go first); off: no count bound "
        "(default 2000)",
    )
    parser.add_argument(
        "--retain-bytes",
        default="512MB",
        metavar="SIZE",
        help="keep at most this much of ended requests' events and blobs in memory: 512MB, "
        "2GB, 100KB or bytes; off: no byte bound (default 512MB)",
    )
    parser.add_argument(
        "--archive",
        action="store_true",
        help="with --log-dir: move log segments that hold only released requests to "
        "DIR/events/archive/ instead of deleting them (omnix trace export and omnix replay "
        "read them there)",
    )


def _operator_flags(parser: argparse.ArgumentParser) -> None:
    """Profiling, logging, and taking the flags from a file."""
    parser.add_argument(
        "--profile-dir",
        default=None,
        metavar="DIR",
        help="enable POST /start_profile and /stop_profile: each selected stage's workers run "
        "torch's profiler and write traces under DIR/<stage>/<replica>/ (default: off)",
    )
    output_flags(parser)
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="take options from a TOML/YAML/JSON file whose keys are these options' names "
        "(e.g. retain-requests = 200); flags on the command line win",
    )
