"""``omnix serve --log nats://...``: lead a replicated log, or stand by to take it over.

Owns: the flags of a replicated log (``--log``, ``--log-name``,
``--log-replicas``, ``--standby``, ``--lease-ttl``) and the life of a
server on one: it follows the log (``NatsLog.follow``), starts its workers
(``Omni.warm``: they load while it is not leading), takes the lease
(``LeaderLease``: at once, or as a standby when the leader's lapses),
promotes the log, takes it over as a restart does (``Omni.start``: the old
leader's replicas are recorded lost, its requests in flight continue on
this server's workers), and answers its frontends' calls (``FrontendCallAnswerer``).
A server whose lease went unrenewed (NATS did not answer) takes it back
when NATS answers; one that another server took the lease from, or whose
appends another leader fenced, stops at once without appending (exit
status 3): a supervisor restarts it as a standby.

Does not own the log or the lease (``omnix.events.natslog``,
``omnix.events.lease``), the pipeline (``Omni``) or the HTTP handlers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
import time
from typing import TYPE_CHECKING

from omnix.usage import UsageError

if TYPE_CHECKING:
    from omnix.api import Omni
    from omnix.events.lease import LeaderLease
    from omnix.events.natslog import NatsLog
    from omnix.http.app import HttpServer

log = logging.getLogger("omnix.serve")

#: The exit status of a server that stopped leading (another took over).
STEPPED_DOWN = 3


def log_location_flags(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """Which replicated log: ``--log`` and ``--log-name`` (serve and frontend)."""
    parser.add_argument(
        "--log",
        required=required,
        default=None,
        metavar="nats://HOST:PORT[,...]",
        help="the event log replicated on NATS JetStream (docs/multihost.md): one server leads, "
        "--standby servers take over when it stops, `omnix frontend` serves the API from it"
        + ("" if required else " (default: the log is this process's, in memory or --log-dir)"),
    )
    parser.add_argument(
        "--log-name",
        default="omnix",
        metavar="NAME",
        help="the log's name on NATS: its stream, lease and calls (default omnix)",
    )


def add_log_flags(parser: argparse.ArgumentParser) -> None:
    """Where the log is replicated, and this server's part in it."""
    log_location_flags(parser, required=False)
    parser.add_argument(
        "--log-replicas",
        type=int,
        default=1,
        choices=(1, 3, 5),
        help="copies JetStream keeps of the log: 3 on a three-node cluster survives a node "
        "(default 1)",
    )
    parser.add_argument(
        "--standby",
        action="store_true",
        help="with --log: follow the log and take it over when its leader stops (without it, "
        "a log another server leads is an error)",
    )
    parser.add_argument(
        "--lease-ttl",
        type=float,
        default=1.5,
        metavar="S",
        help="with --log: the leader's lease; a standby takes over about this long after the "
        "leader dies (default 1.5)",
    )


def check_log_flags(args: argparse.Namespace) -> None:
    """One-line errors for flags that do not go together."""
    if args.log is None:
        if args.standby:
            raise UsageError("--standby follows a replicated log: give --log nats://HOST:PORT")
        return
    if not args.log.startswith("nats://"):
        raise UsageError(f"--log {args.log}: the replicated log is nats://HOST:PORT[,HOST:PORT...]")
    if args.log_dir is not None:
        raise UsageError(
            "--log and --log-dir both say where the log lives: NATS keeps a --log log "
            "(drop --log-dir)"
        )
    if not 0.1 <= args.lease_ttl <= 600:
        raise UsageError(f"--lease-ttl must be 0.1 to 600 seconds (got {args.lease_ttl:g})")


class Replicated:
    """A server on a replicated log: follow, warm, lead (see the module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.url: str = args.log
        self.name: str = args.log_name
        self.log: NatsLog | None = None
        self.lease: LeaderLease | None = None
        self.lost = asyncio.Event()  # fenced, or the lease lost: stop at once
        self.why = ""

    async def open(self) -> NatsLog:
        """Follow the log (a one-line error naming the URL when NATS is not there)."""
        from omnix.events.natslog import NatsLog

        self.log = await NatsLog.follow(
            self.url,
            name=self.name,
            replicas=self.args.log_replicas,
            on_fenced=lambda exc: self._stop(str(exc)),
        )
        return self.log

    async def check_leader(self) -> None:
        """A server without ``--standby`` refuses a log another server leads."""
        current = await self._lease_info()
        if current is not None and not self.args.standby:
            raise UsageError(
                f"--log {self.url}: log {self.name!r} is led by {current} already; start this "
                "server with --standby to take over when it stops, or pick another --log-name",
                code=1,
            )

    async def _lease_info(self) -> str | None:
        from omnix.cluster.wire import LeaderInfo
        from omnix.events.lease import LeaderLease, LeaseInfo

        assert self.log is not None
        probe = await LeaderLease.open(self.log.conn, name=self.name, ttl=self.args.lease_ttl)
        info: LeaseInfo[LeaderInfo] | None = await probe.current(LeaderInfo)
        return None if info is None else f"{info.holder} ({info.endpoints.http_url})"

    async def lead(self, omni: Omni, server: HttpServer) -> None:
        """Take the lease (waiting for it as a standby), promote the log
        and take it over; returns once this server leads."""
        from omnix.cluster.wire import LeaderInfo
        from omnix.events.lease import LeaderLease

        assert self.log is not None
        holder = f"{socket.gethostname()}:{server.port}"
        info = LeaderInfo(
            holder=holder,
            http_url=server.url,
            workers_endpoint=getattr(omni.runtime, "endpoint", ""),
            pipeline=omni.pipeline,
            served_model_names=server.state.options.served_model_names,
        )
        self.lease = await LeaderLease.open(
            self.log.conn,
            name=self.name,
            holder=holder,
            endpoints=info,
            ttl=self.args.lease_ttl,
            replicas=self.args.log_replicas,
            on_lost=self._take_back,
        )
        if not await self.lease.acquire():
            if not self.args.standby:
                raise UsageError(
                    f"--log {self.url}: another server took the lease of log {self.name!r} "
                    "first; start this one with --standby",
                    code=1,
                )
            log.info("standing by: log %r on %s is led by another server", self.name, self.url)
            await self.lease.acquire_when_free()
        t0 = time.perf_counter()
        await self.log.promote()
        await omni.start()
        log.info(
            "leading log %r (took it over at position %d in %.2f s)",
            self.name,
            omni.recovered_from,
            time.perf_counter() - t0,
        )

    async def _take_back(self, lost: Exception) -> None:
        """The lease was lost: another server took it, or it went unrenewed
        while NATS did not answer.  Take it back as soon as NATS answers
        (nothing appended meanwhile was acknowledged, so no worker acted on
        it and no client saw it); step down when another server holds it."""
        assert self.lease is not None
        log.warning("lease of log %r lost (%s); taking it back when NATS answers", self.name, lost)
        while not self.lost.is_set():
            try:
                if await self.lease.acquire():
                    log.info("lease of log %r held again", self.name)
                else:
                    self._stop(f"another server leads log {self.name!r} now ({lost})")
                return
            except Exception:  # NATS still away
                await asyncio.sleep(self.args.lease_ttl / 3)

    def _stop(self, why: str) -> None:
        if not self.lost.is_set():
            self.why = why
            self.lost.set()

    async def close(self, leading: bool) -> None:
        """Let the lease go (a standby takes over at once) and disconnect."""
        if self.lease is not None:
            with contextlib.suppress(Exception):
                if leading and not self.lost.is_set():
                    await self.lease.release()
                await self.lease.close()
        if self.log is not None:
            with contextlib.suppress(Exception):
                await self.log.aclose()


async def follow(cluster: Replicated | None) -> NatsLog | None:
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


async def lead(cluster: Replicated, omni: Omni, server: HttpServer) -> None:
    """A server on a replicated log: its workers load, then it leads (at
    once, or when the leader it stands by for stops), then it answers
    its frontends."""
    from omnix.cluster.answerer import FrontendCallAnswerer

    await omni.warm()
    await cluster.lead(omni, server)
    assert cluster.log is not None
    await FrontendCallAnswerer(omni, cluster.log.conn.nc, cluster.name).open()
