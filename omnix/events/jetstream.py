"""What a replicated log needs from NATS JetStream: URLs, names, headers, errors.

Owns: parsing a ``nats://HOST:PORT[,HOST:PORT...]`` URL (the seeds of one
cluster), connecting (``connect``: a NATS URL that cannot be reached is
one ``NatsUnreachable`` line naming it; once connected the client
reconnects by itself, forever), the names a log's JetStream objects get
(``Names``), the headers each log message carries, the stream itself
(``ensure_stream``: created with its metadata when absent, refused when
its metadata names another log or a newer schema),
and the errors of the replicated log (all ``LogError``s, so the CLI prints
one line): ``NatsUnreachable``, ``StreamRefused``, ``LogFenced``,
``ReplicaDiverged``.

Does not own the log (``natslog.py``), its snapshots (``natssnap.py``) nor
the leader lease (``lease.py``).

Layout of one log named ``NAME`` (``[A-Za-z0-9_-]+``, default ``omnix``):

* stream ``OMNIX_LOG_NAME`` on subject ``omnix.log.NAME``, file storage,
  R replicas; its metadata names the log (``omnix_log``), its id
  (``omnix_log_id``, made when the stream is created) and the schema
  version that created it; each message is one batch of consecutive
  events (``codec.encode_batches``) with the headers ``HDR_FIRST`` (its
  first position), ``HDR_COUNT``, ``HDR_LOG_ID`` and ``HDR_SCHEMA``; a
  batch bigger than the server's max payload (one huge event) is cut into
  consecutive messages marked ``HDR_PART`` (``1/3``, ``2/3``, ``3/3``); a
  blob (``BlobStore``: audio, images) is a message of its own marked
  ``HDR_BLOB`` (its digest), in parts as a batch is, published before
  any event that references it;
* object store ``omnix-snap-NAME``: the fold's snapshots (``natssnap.py``);
* KV bucket ``omnix-lease-NAME``: the leader lease (``lease.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import nats
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig, StreamInfo

from omnix.events.segments import LogError
from omnix.events.types import SCHEMA_VERSION

__all__ = [
    "HDR_BLOB",
    "HDR_COUNT",
    "HDR_FIRST",
    "HDR_LOG_ID",
    "HDR_PART",
    "HDR_SCHEMA",
    "LogFenced",
    "Names",
    "NatsConnection",
    "NatsUnreachable",
    "ReplicaDiverged",
    "StreamRefused",
    "connect",
    "ensure_stream",
    "stream_info",
    "parse_url",
]

log = logging.getLogger("omnix.events.jetstream")

HDR_FIRST = "Omnix-First-Pos"
HDR_COUNT = "Omnix-Count"
HDR_LOG_ID = "Omnix-Log-Id"
HDR_SCHEMA = "Omnix-Schema"
#: ``i/n`` on the n messages of a batch too big for one (one huge event)
HDR_PART = "Omnix-Part"
#: the digest of the blob a message carries (instead of events)
HDR_BLOB = "Omnix-Blob"
#: JetStream's error code for a publish whose Nats-Expected-Last-Sequence
#: (or -Subject-Sequence) does not match: another writer appended.
WRONG_LAST_SEQUENCE = (10071, 10164)

_META_LOG = "omnix_log"
_META_ID = "omnix_log_id"
_META_SCHEMA = "omnix_schema"

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class NatsUnreachable(LogError):
    """No server of a NATS URL answered when the log was opened."""


class StreamRefused(LogError):
    """The stream holds something this log must not write to or read as its
    own: another omnix log, events of a newer schema, foreign messages."""


class LogFenced(LogError):
    """Another leader appended to the stream: this log stopped writing."""


class ReplicaDiverged(LogError):
    """A follower read a batch that does not continue its log (a gap or a
    duplicate): it stopped following."""


@dataclass(frozen=True, slots=True)
class Names:
    """The JetStream names of the log called ``log``."""

    log: str

    def __post_init__(self) -> None:
        if not _NAME.match(self.log):
            raise LogError(
                f"log name {self.log!r}: use 1-64 letters, digits, '-' or '_' "
                "(it names a JetStream stream and subject)"
            )

    @property
    def stream(self) -> str:
        return f"OMNIX_LOG_{self.log}"

    @property
    def subject(self) -> str:
        return f"omnix.log.{self.log}"

    @property
    def snapshots(self) -> str:
        return f"omnix-snap-{self.log}"

    @property
    def lease(self) -> str:
        return f"omnix-lease-{self.log}"


def parse_url(url: str) -> list[str]:
    """``nats://HOST:PORT[,HOST:PORT...]`` as one ``nats://HOST:PORT`` per seed."""
    if not url.startswith("nats://"):
        raise LogError(f"{url!r}: a NATS log URL is nats://HOST:PORT[,HOST:PORT...]")
    seeds = []
    for part in url[len("nats://") :].split(","):
        part = part.strip()
        if part.startswith("nats://"):
            part = part[len("nats://") :]
        try:
            parts = urlsplit(f"nats://{part}")
            host, port = parts.hostname, parts.port
        except ValueError:
            host, port = None, None
        if not host or not port or parts.path not in ("", "/"):
            raise LogError(
                f"{url!r}: {part!r} is not HOST:PORT (a NATS log URL is "
                "nats://HOST:PORT[,HOST:PORT...])"
            )
        seeds.append(f"nats://{part}")
    return seeds


def _reachable(seed: str, timeout: float) -> bool:
    parts = urlsplit(seed)
    try:
        with socket.create_connection((parts.hostname or "", parts.port or 0), timeout):
            return True
    except OSError:
        return False


Callback = Callable[[], Awaitable[None]]


class NatsConnection:
    """A NATS client and its JetStream context, shared by a log and its
    lease.  ``connected`` follows the client's own reconnects; callbacks
    added with ``on_change`` run on each disconnect and reconnect."""

    def __init__(self, url: str, nc: Client) -> None:
        self.url = url
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self._watchers: list[Callable[[bool], None]] = []

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    def on_change(self, fn: Callable[[bool], None]) -> None:
        self._watchers.append(fn)

    def _changed(self) -> None:
        for fn in list(self._watchers):
            fn(self.connected)

    async def close(self) -> None:
        # Bounded: closing must never hold up a shutdown or a step-down.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.nc.close(), 5.0)


async def connect(url: str, *, timeout_s: float = 5.0) -> NatsConnection:
    """Connect to the cluster ``url`` names; ``NatsUnreachable`` (one line
    naming it) when no seed answers within ``timeout_s``."""
    seeds = parse_url(url)
    loop = asyncio.get_running_loop()
    probes = [loop.run_in_executor(None, _reachable, s, min(timeout_s, 2.0)) for s in seeds]
    if not any(await asyncio.gather(*probes)):
        raise NatsUnreachable(
            f"{url}: no NATS server answers there; start nats-server -js "
            "(or fix the URL: nats://HOST:PORT[,HOST:PORT...])"
        )
    holder: list[NatsConnection] = []

    async def changed() -> None:
        if holder:
            holder[0]._changed()

    async def quiet(exc: Exception) -> None:
        log.debug("nats %s: %s", url, exc)

    try:
        nc = await asyncio.wait_for(
            nats.connect(
                seeds,
                connect_timeout=2,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.2,
                pending_size=64 << 20,
                error_cb=quiet,
                disconnected_cb=changed,
                reconnected_cb=changed,
            ),
            timeout_s,
        )
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        raise NatsUnreachable(
            f"{url}: cannot connect to NATS ({str(exc) or type(exc).__name__})"
        ) from None
    conn = NatsConnection(url, nc)
    holder.append(conn)
    return conn


#: What JetStream raises while it cannot answer yet (a cluster electing a
#: new leader after a node died answers again in seconds).
NOT_ANSWERING = (nats.js.errors.ServiceUnavailableError, TimeoutError, nats.errors.Error)

_T = TypeVar("_T")


async def retry_until_answered(call: Callable[[], Awaitable[_T]], wait_s: float, what: str) -> _T:
    """``call()``, asked again every 0.2 s for up to ``wait_s`` while
    JetStream does not answer; then a ``LogError`` naming ``what``.  A
    stream or consumer that does not exist (``NotFoundError``) is an
    answer: it is raised at once."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        try:
            return await call()
        except NOT_ANSWERING as exc:
            if isinstance(exc, nats.js.errors.NotFoundError):
                raise
            if loop.time() > deadline:
                raise LogError(
                    f"{what}: JetStream did not answer within {wait_s:g} s ({exc!r})"
                ) from None
            await asyncio.sleep(0.2)


async def stream_info(conn: NatsConnection, names: Names, wait_s: float) -> StreamInfo:
    """The log's stream as JetStream describes it now (``retry_until_answered``)."""
    return await retry_until_answered(
        lambda: conn.js.stream_info(names.stream), wait_s, f"stream {names.stream}"
    )


async def ensure_stream(
    conn: NatsConnection, names: Names, replicas: int, log_id: str | None, wait_s: float
) -> str:
    """Create the log's stream when absent; check what an existing one holds.
    Returns the log's id."""
    js = conn.js
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        try:
            info = await js.stream_info(names.stream)
            break
        except nats.js.errors.NotFoundError:
            pass
        except NOT_ANSWERING as exc:
            if loop.time() > deadline:
                raise LogError(f"{conn.url}: JetStream does not answer ({exc!r})") from None
            await asyncio.sleep(0.2)
            continue
        new_id = log_id or uuid.uuid4().hex
        config = StreamConfig(
            name=names.stream,
            subjects=[names.subject],
            storage=StorageType.FILE,
            num_replicas=replicas,
            duplicate_window=120.0,
            allow_direct=True,
            metadata={_META_LOG: names.log, _META_ID: new_id, _META_SCHEMA: str(SCHEMA_VERSION)},
        )
        try:
            await js.add_stream(config)
            return new_id
        except nats.js.errors.APIError as exc:
            # Created by another process meanwhile (read it back), or a
            # cluster still electing its meta leader (retry).
            if loop.time() > deadline:
                raise LogError(
                    f"{conn.url}: cannot create stream {names.stream}: {exc.description}"
                ) from None
            await asyncio.sleep(0.2)
    meta = info.config.metadata or {}
    where = f"stream {names.stream} on {conn.url}"
    if _META_ID not in meta:
        raise StreamRefused(
            f"{where} was not created by omnix (no omnix_log_id in its metadata); "
            "use another log name, or delete the stream"
        )
    if meta.get(_META_LOG) != names.log or (log_id is not None and meta[_META_ID] != log_id):
        raise StreamRefused(
            f"{where} holds another omnix log ({meta.get(_META_LOG)!r}, id {meta[_META_ID]}); "
            "use another log name, or delete the stream to start a new log"
        )
    schema = int(meta.get(_META_SCHEMA, "0"))
    if schema > SCHEMA_VERSION:
        raise StreamRefused(
            f"{where} was written by a newer omnix (event schema {schema}; this one reads up "
            f"to {SCHEMA_VERSION}): upgrade omnix"
        )
    return meta[_META_ID]
