"""``omnix serve``: run a pipeline behind the OpenAI-compatible HTTP API.

Owns: the verb's arguments, building the tiny models a built-in pipeline
needs when they are missing, the process lifecycle (bind the port first so
a busy port fails in a second, not after model loading; start the runtime;
serve; on Ctrl-C / SIGTERM stop admitting, let in-flight requests finish
for ``--grace`` seconds, cancel the rest, stop the workers) and the log
lines an operator needs (where it listens, which pipeline, how long loading
took; the runtime logs where workers connect).

Does not own the runtime (``Omni``/``StageRuntime``), the handlers
(``omnix.http.routes``) or model building (``omnix.models``).

    omnix serve [--pipeline NAME|PATH] [--host 127.0.0.1] [--port 8091]
                [--api-key KEY] [--log-dir DIR] [--model-dir DIR]
                [--workers-endpoint tcp://0.0.0.0:PORT] [--spawn all|none|STAGE,...]
                [--worker-token TOKEN] [--placement spawn|ray] [--ray-address auto|HOST:PORT]
                [--allowed-origins ORIGIN,...] [--max-batch N]
                [--allowed-media-domains HOST,...] [--max-body-mb MB]
                [--retain 10m] [--retain-requests N] [--retain-bytes 512MB] [--archive]

The event log lives in memory unless ``--log-dir`` is given (then
``DIR/events`` and ``DIR/blobs`` are durable and traces survive restarts).
Either way ended requests are kept for a retention window (the ``--retain``
flags, docs/retention.md) and then released; asking about one afterwards
is 410 Gone.  Every flag can also come from a file (``--config FILE``,
``serve_config.py``), as ``vllm serve --config`` takes them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnix.http.options import DEFAULT_MAX_BATCH, DEFAULT_MAX_BODY, HttpOptions
from omnix.http.serve_cluster import STEPPED_DOWN, Replicated, add_log_flags, check_log_flags
from omnix.http.serve_config import ConfigError, apply_config, defaults_of
from omnix.http.serve_pipeline import ServedPipeline, check_with_vllm, served_pipeline
from omnix.pipelines.vllm_args import add_engine_flags
from omnix.transport.sockets import check_endpoint
from omnix.usage import UsageError, arg_type, port_number

if TYPE_CHECKING:
    from omnix.api import Omni
    from omnix.events.disklog import LogConfig
    from omnix.events.natslog import NatsLog
    from omnix.events.retention import RetentionPolicy
    from omnix.http.app import HttpServer

log = logging.getLogger("omnix.serve")

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
        help="a local model folder to serve, as `vllm serve PATH`: its config.json or "
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
        "--stage-devices",
        action="append",
        default=None,
        metavar="STAGE=DEVICES",
        help="the GPUs a stage's replicas use, e.g. thinker=0,1 (repeat per stage; over the "
        "pipeline's own devices; ignored on a machine without a GPU)",
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
        help="require 'Authorization: Bearer KEY' on every route but /health (default: $OMNIX_API_KEY)",
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


def _http_options(args: argparse.Namespace, names: tuple[str, ...] = ()) -> HttpOptions:
    """The HTTP layer's options from the flags; ``UsageError`` (one line
    naming the flag) for a value that is not one."""
    from omnix.http.core.cors import parse_origins

    try:
        origins = parse_origins(args.allowed_origins)
    except ValueError as bad:
        raise UsageError(f"--allowed-origins: {bad}") from None
    if args.max_batch < 1:
        raise UsageError(f"--max-batch must be at least 1 (got {args.max_batch})")
    if args.max_body_mb <= 0:
        raise UsageError(f"--max-body-mb must be positive (got {args.max_body_mb})")
    return HttpOptions(
        api_key=args.api_key,
        max_body=int(args.max_body_mb * 1024 * 1024),
        max_batch=args.max_batch,
        resume_grace_s=args.resume_grace,
        allowed_origins=origins,
        allowed_media_domains=_domains(args.allowed_media_domains),
        served_model_names=names,
    )


def _build_omni(
    args: argparse.Namespace, served: ServedPipeline, log: NatsLog | None = None
) -> Omni:
    """The pipeline's models and the ``Omni`` serving it, as the flags
    say; ``UsageError`` for what the operator must fix, in one line.
    ``log``: a replicated log this server follows (a standby until it leads)."""
    from omnix.api import Omni
    from omnix.events.disklog import LogError
    from omnix.models.prepare import prepare_models
    from omnix.pipelines.validate import PipelineError
    from omnix.stages.options import RuntimeOptions
    from omnix.stages.runtime import RuntimeConfigError

    try:
        retention = retention_policy(args.retain, args.retain_requests, args.retain_bytes)
    except ValueError as bad:
        raise UsageError(str(bad)) from None
    if args.archive and args.log_dir is None:
        raise UsageError("--archive moves released log segments aside: it needs --log-dir DIR")
    try:
        pipeline = served.pipeline
        spawn = _spawn_choice(args.spawn)
        prepare_models(pipeline, args.model_dir, build=not args.no_build)
        check_with_vllm(served)
        return Omni(
            pipeline,
            log_dir=args.log_dir,
            log=log,
            blobs=log.blobs if log is not None else None,
            standby=log is not None,
            # pin_server: this process joins the frontend CPUs of the runtime's
            # placement (docs/runtime.md), away from the vLLM engine cores.
            runtime_options=RuntimeOptions(
                start_timeout_s=args.start_timeout,
                pin_server=True,
                endpoint=args.workers_endpoint,
                spawn=spawn,
                worker_token=args.worker_token,
                profile_dir=args.profile_dir,
                placement=args.placement,
                ray_address=args.ray_address,
            ),
            resume_within_s=args.resume_within,
            retention=retention,
            log_config=_log_config(args.archive),
        )
    except (PipelineError, LogError, RuntimeConfigError) as bad:
        raise UsageError(str(bad)) from None
    except OSError as bad:  # --log-dir
        raise UsageError(
            f"--log-dir {args.log_dir}: cannot keep the log there ({bad.strerror or bad})"
        ) from None


async def serve(args: argparse.Namespace) -> int:
    from omnix.http.app import HttpServer

    check_log_flags(args)
    served = served_pipeline(args)
    options = _http_options(args, served.names)
    cluster = Replicated(args) if args.log else None
    followed = await _follow(cluster)
    omni = _build_omni(args, served, followed)
    pipeline = omni.pipeline
    server = HttpServer(omni, options, host=args.host, port=args.port, access_log=args.access_log)
    try:
        await server.start()
    except OSError as exc:
        omni.log.close()
        if cluster is not None:
            await cluster.close(leading=False)
        raise UsageError(
            f"cannot listen on {args.host}:{args.port} ({exc.strerror or exc}): pick a free "
            "--port (0: any free one) or another --host",
            code=1,
        ) from None
    log.info(
        "listening on %s (pipeline %r: %s; log: %s; auth: %s; browser origins: %s); loading...",
        server.url,
        pipeline.name,
        " -> ".join(st.name for st in pipeline.stages),
        args.log or args.log_dir or "memory",
        "api key" if args.api_key else "none",
        ",".join(sorted(options.allowed_origins)) or "none",
    )
    stop = _stop_on_signals()
    if cluster is None:
        code = await _serve_until_stopped(omni, server, omni.start(), stop)
    else:
        code = await _serve_until_stopped(omni, server, _lead(cluster, omni, server), stop, cluster)
    t1 = time.perf_counter()
    server.mark_stopping()
    if cluster is not None and cluster.lost.is_set():
        # Another server leads the log now: nothing more may be appended.
        log.error("stepping down: %s", cluster.why)
        await omni.runtime.shutdown()
        await server.close()
        await cluster.close(leading=False)
        return STEPPED_DOWN
    await omni.shutdown(grace_s=args.grace)
    await server.close()
    if cluster is not None:
        await cluster.close(leading=True)
    log.info("stopped in %.1f s", time.perf_counter() - t1)
    return code


async def _follow(cluster: Replicated | None) -> NatsLog | None:
    """The replicated log, followed (None without ``--log``)."""
    if cluster is None:
        return None
    from omnix.events.segments import LogError

    try:
        followed = await cluster.open()
        await cluster.check_leader()
    except LogError as bad:
        await cluster.close(leading=False)
        raise UsageError(f"--log: {bad}", code=1) from None
    except BaseException:
        await cluster.close(leading=False)
        raise
    return followed


async def _lead(cluster: Replicated, omni: Omni, server: HttpServer) -> None:
    """A server on a replicated log: its workers load, then it leads (at
    once, or when the leader it stands by for stops), then it answers
    its frontends."""
    from omnix.cluster.door import FrontDoor

    await omni.warm()
    await cluster.lead(omni, server)
    assert cluster.log is not None
    await FrontDoor(omni, cluster.log.conn.nc, cluster.name).open()


def _stop_on_signals() -> asyncio.Event:
    """Set on the first SIGINT or SIGTERM (shut down gracefully); the second exits at once."""
    stop = asyncio.Event()
    signals = 0

    def on_signal(sig: signal.Signals) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info("%s: shutting down (again to force)", sig.name)
            stop.set()
        else:
            log.warning("%s again: exiting now", sig.name)
            os._exit(130)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on_signal, sig)
    return stop


async def _serve_until_stopped(
    omni: Omni,
    server: HttpServer,
    start: Coroutine[Any, Any, object],
    stop: asyncio.Event,
    cluster: Replicated | None = None,
) -> int:
    """Start the pipeline (``start``) and serve until ``stop`` is set (or
    the server stops leading its log); 1 when the pipeline failed to
    start, else 0."""
    t0 = time.perf_counter()
    starting = asyncio.create_task(start)
    waiting = asyncio.create_task(_either(stop, cluster.lost if cluster else None))
    await asyncio.wait({starting, waiting}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if starting.done() and starting.exception() is None:
        server.mark_serving()
        log.info(
            "ready in %.1f s: %s serving %r at %s (Ctrl-C to stop)",
            time.perf_counter() - t0,
            "omnix",
            omni.pipeline.name,
            server.url,
        )
        await waiting
    elif starting.done():
        err = starting.exception()
        log.error("the pipeline failed to start: %s", err)
        code = 1
    else:
        starting.cancel()
        with contextlib.suppress(BaseException):
            await starting
    waiting.cancel()
    return code


async def _either(a: asyncio.Event, b: asyncio.Event | None) -> None:
    if b is None:
        await a.wait()
        return
    waits = {asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())}
    _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()


def _spawn_choice(text: str) -> bool | list[str]:
    """``--spawn``: all, none, or a comma-separated list of stages (the
    runtime checks the names against the pipeline)."""
    word = text.strip().lower()
    if word == "all":
        return True
    if word == "none":
        return False
    return [name for name in (part.strip() for part in text.split(",")) if name]


def run(args: argparse.Namespace) -> int:
    if args.config:
        try:
            apply_config(args, args._serve_options, args.config, frozenset(args._vllm_dests))
        except ConfigError as bad:
            raise UsageError(str(bad)) from None
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    runner: Callable[[Coroutine[Any, Any, int]], int]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    try:
        return runner(serve(args))
    except KeyboardInterrupt:
        return 130


_DURATION = re.compile(r"^([0-9]+(?:[.][0-9]*)?|[.][0-9]+)\s*(s|m|h|)$")
_SIZE = re.compile(r"^([0-9]+(?:[.][0-9]*)?|[.][0-9]+)\s*(b|kb|mb|gb|tb|kib|mib|gib|tib|)$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_UNIT_B = {
    "": 1, "b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}  # fmt: skip
_OFF = ("off", "none", "inf", "unlimited")


def parse_duration(text: str, flag: str = "--retain") -> float | None:
    """``90``, ``90s``, ``10m``, ``2h`` -> seconds; ``off`` -> None."""
    word = text.strip().lower()
    if word in _OFF:
        return None
    m = _DURATION.match(word)
    if m is None:
        raise ValueError(
            f"{flag} {text!r} is not a duration: give seconds with an optional unit s, m or h "
            "(90s, 10m, 2h), 0 to release at once, or off for no time bound"
        )
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def parse_size(text: str, flag: str = "--retain-bytes") -> int | None:
    """``512MB``, ``2GB``, ``100KB``, ``4096`` -> bytes (binary units:
    1 KB = 1024 bytes); ``off`` -> None."""
    word = text.strip().lower()
    if word in _OFF:
        return None
    m = _SIZE.match(word)
    if m is None:
        raise ValueError(
            f"{flag} {text!r} is not a size: give bytes with an optional unit KB, MB or GB "
            "(512MB, 2GB), or off for no byte bound"
        )
    return int(float(m.group(1)) * _UNIT_B[m.group(2)])


def parse_count(text: str, flag: str = "--retain-requests") -> int | None:
    """``2000`` -> 2000; ``off`` -> None."""
    word = text.strip().lower()
    if word in _OFF:
        return None
    if not word.isdigit():
        raise ValueError(
            f"{flag} {text!r} is not a count: give a whole number of requests (0 or more), "
            "or off for no count bound"
        )
    return int(word)


def retention_policy(retain: str, requests: str, size: str) -> RetentionPolicy:
    """The ``RetentionPolicy`` the ``--retain*`` flags ask for; ``ValueError``
    (one line naming the flag) for a value that is not one."""
    from omnix.events.retention import RetentionPolicy

    return RetentionPolicy(
        window_s=parse_duration(retain),
        max_requests=parse_count(requests),
        max_bytes=parse_size(size),
    )


def _log_config(archive: bool) -> LogConfig | None:
    if not archive:
        return None
    from omnix.events.disklog import LogConfig

    return LogConfig(archive=True)


def _domains(value: str) -> frozenset[str]:
    """``--allowed-media-domains``: exact host names, case-folded."""
    return frozenset(d.strip().lower().rstrip(".") for d in value.split(",") if d.strip())
