"""``omnix frontend``: the HTTP API on any host, for a pipeline led elsewhere.

Owns: the verb's arguments and the process lifecycle of a stateless
frontend: follow the replicated log (``NatsLog.follow``), read the
pipeline its leader serves from the lease (``LeaderInfo``; waiting for a
leader up to ``--leader-timeout``), serve every route with a
``RemoteOmni`` (reads from the followed log, appends through the leader),
and on Ctrl-C / SIGTERM stop.  A frontend holds no state of its own: kill
one and a client resumes its stream on another with ``Last-Event-ID``.

    omnix frontend --log nats://HOST:PORT[,...] [--log-name NAME] [--host H] [--port P]
                   [--api-key KEY] [--allowed-origins ...] [--leader-timeout S]

A frontend reads the same model folder its leader's pipeline names for
the prompt tokenizer and media processors (``OMNIX_MODEL_DIR``).

Does not own the handlers (``omnix.http.routes``), the calls
(``omnix.cluster``) or the log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from omnix.usage import UsageError

if TYPE_CHECKING:
    from omnix.cluster.wire import LeaderInfo
    from omnix.events.lease import LeaderLease

log = logging.getLogger("omnix.frontend")

DEFAULT_PORT = 8092


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from omnix.http.serve_cluster import log_location_flags
    from omnix.http.serve_flags import (
        http_flags,
        listen_flags,
        max_body_flag,
        output_flags,
        resume_grace_flag,
    )

    log_location_flags(parser, required=True)
    listen_flags(parser, DEFAULT_PORT)
    parser.add_argument(
        "--leader-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds to wait at start for a leader to read the pipeline from (default 60)",
    )
    resume_grace_flag(parser)
    max_body_flag(parser)
    http_flags(parser)
    output_flags(parser)


async def _leader_info(lease: LeaderLease, name: str, url: str, timeout_s: float) -> LeaderInfo:
    """What the leader publishes with its lease (waiting for one to lead)."""
    from omnix.cluster.wire import LeaderInfo
    from omnix.events.lease import LeaseInfo

    deadline = time.monotonic() + timeout_s
    while True:
        current: LeaseInfo[LeaderInfo] | None = await lease.current(LeaderInfo)
        if current is not None:
            return current.endpoints
        if time.monotonic() >= deadline:
            raise UsageError(
                f"--log {url}: no server leads log {name!r} after {timeout_s:g} s: start "
                "`omnix serve --log ...` first, or check --log-name",
                code=1,
            )
        await asyncio.sleep(0.2)


async def frontend(args: argparse.Namespace) -> int:
    from omnix.cluster.remote import RemoteOmni
    from omnix.events.lease import LeaderLease
    from omnix.events.natslog import NatsLog
    from omnix.events.segments import LogError
    from omnix.http.app import HttpServer
    from omnix.http.serve import stop_on_signals
    from omnix.http.serve_options import http_options

    t0 = time.perf_counter()
    try:
        followed = await NatsLog.follow(args.log, name=args.log_name)
    except LogError as bad:
        raise UsageError(f"--log: {bad}", code=1) from None
    try:
        lease = await LeaderLease.open(followed.conn, name=args.log_name)
        info = await _leader_info(lease, args.log_name, args.log, args.leader_timeout)
        options = http_options(args, info.served_model_names)
        remote = RemoteOmni(info, followed, followed.blobs, followed.conn.nc, args.log_name)
        await remote.start()
        server = HttpServer(remote, options, host=args.host, port=args.port)
        try:
            await server.start()
        except OSError as exc:
            raise UsageError(
                f"cannot listen on {args.host}:{args.port} ({exc.strerror or exc}): pick a free "
                "--port (0: any free one) or another --host",
                code=1,
            ) from None
        server.mark_serving()
        log.info(
            "listening on %s (frontend for log %r on %s, pipeline %r, led by %s)",
            server.url,
            args.log_name,
            args.log,
            info.pipeline.name,
            info.http_url,
        )
        log.info("ready in %.1f s (Ctrl-C to stop)", time.perf_counter() - t0)
        await stop_on_signals().wait()
        server.mark_stopping()
        await remote.shutdown()
        await server.close()
    finally:
        with contextlib.suppress(Exception):
            await followed.aclose()
    return 0


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return asyncio.run(frontend(args))
    except KeyboardInterrupt:
        return 130
