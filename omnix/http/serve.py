"""``omnix serve``: run a pipeline behind the OpenAI-compatible HTTP API.

Owns: the verb's process lifecycle: bind the port first (a busy port fails
in a second, not after model loading), start the pipeline (at once, or on
a replicated log once it leads), serve, and on Ctrl-C / SIGTERM stop
admitting, let in-flight requests finish for ``--grace`` seconds, cancel
the rest, stop the workers (a server another one took the log from stops
at once); and the log lines an operator needs (where it listens, which
pipeline, how long loading took; the runtime logs where workers connect).

Does not own the flags (``serve_flags.py``; ``add_arguments`` is this
verb's, from there), what they become (``serve_options.py``: the ``Omni``,
its ``RuntimeOptions``, the ``HttpOptions``), the value parsers
(``quantities.py``), the config file (``serve_config.py``), leading a
replicated log (``serve_cluster.py``), the runtime
(``Omni``/``StageRuntime``), the handlers (``omnix.http.routes``) or
model building (``omnix.models``).

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
import signal
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from omnix.http.serve_cluster import STEPPED_DOWN, Replicated, check_log_flags, follow, lead
from omnix.http.serve_config import ConfigError, apply_config
from omnix.http.serve_flags import add_arguments
from omnix.http.serve_options import build_omni, http_options
from omnix.http.serve_pipeline import served_pipeline
from omnix.usage import UsageError

if TYPE_CHECKING:
    from omnix.api import Omni
    from omnix.http.app import HttpServer

__all__ = ["add_arguments", "run", "serve", "stop_on_signals"]

log = logging.getLogger("omnix.serve")


async def serve(args: argparse.Namespace) -> int:
    from omnix.http.app import HttpServer

    check_log_flags(args)
    served = served_pipeline(args)
    options = http_options(args, served.names)
    cluster = Replicated(args) if args.log else None
    followed = await follow(cluster)
    omni = build_omni(args, served, followed)
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
    stop = stop_on_signals()
    if cluster is None:
        code = await _serve_until_stopped(omni, server, omni.start(), stop)
    else:
        code = await _serve_until_stopped(omni, server, lead(cluster, omni, server), stop, cluster)
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


def stop_on_signals() -> asyncio.Event:
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
