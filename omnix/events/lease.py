"""The leader lease: which process may append to a replicated log.

Owns: ``LeaderLease``, one key (``leader``) in the JetStream KV bucket
``omnix-lease-NAME`` whose value names the holder (its id, its lease's
TTL and its endpoints: an opaque msgspec Struct the server fills with its
HTTP URL and workers' endpoint), and ``LeaseInfo`` (what ``current()``
reads back).

* ``acquire()``: create the key (it is absent, deleted or expired); a key
  this holder already owns is taken back with compare-and-set.  False when
  another holder has it.
* ``renew()``: compare-and-set on the revision; a renewal task does it
  every ``ttl/3``.  A failed compare-and-set, or no successful renewal for
  ``ttl`` by this process's monotonic clock (NATS unreachable: a standby
  may have taken over), is a lost lease: ``on_lost`` is called and the
  holder must stop appending (the log's fencing refuses its appends
  anyway).
* ``wait_expired()`` / ``acquire_when_free()``: a standby polls the key
  (every ``ttl/15``) and declares the lease expired once the revision has
  not advanced for the holder's TTL **as the standby measures it on its
  own monotonic clock** (no clocks compared across hosts), or at once
  when the key is gone (released, or expired by the bucket's own TTL, the
  backstop at twice the lease's); it then takes the key over with
  compare-and-set on the revision it saw, so two standbys cannot both win.
* ``release()``: delete the key (compare-and-set) on clean shutdown; a
  standby takes over at its next poll.
* ``current()`` reads the holder and its endpoints; ``holders()`` yields
  it again whenever another process (or nobody) holds the lease: how
  workers and frontends find the leader.

Takeover after a leader dies: at most ``ttl`` after its last renewal
plus one poll (default ``ttl`` 1.5 s: about 1.6 s).

Does not own the log (``natslog.py``), connecting (``jetstream.py``), nor
what a server does when it gains or loses the lease (the serve command).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeVar

import msgspec
import nats.errors
import nats.js.errors
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from omnix.events.jetstream import Names, NatsConnection, connect
from omnix.events.segments import LogError

__all__ = ["LeaderLease", "LeaseInfo", "LeaseLost"]

log = logging.getLogger("omnix.events.lease")

KEY = "leader"
T = TypeVar("T")


class LeaseLost(LogError):
    """This process no longer holds the lease."""


class _Value(msgspec.Struct, frozen=True):
    holder: str
    ttl_s: float
    endpoints: msgspec.Raw = msgspec.Raw(b"null")


class LeaseInfo(msgspec.Struct, Generic[T], frozen=True):
    """The lease's holder as read from the bucket."""

    holder: str
    ttl_s: float
    revision: int
    endpoints: T


OnLost = Callable[[LeaseLost], Awaitable[None] | None]
_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder(_Value)


class LeaderLease:
    """The lease of the log ``name`` (module docstring).  Open it with
    ``await LeaderLease.open(url_or_connection, name=..., endpoints=...)``."""

    def __init__(
        self,
        conn: NatsConnection,
        kv: KeyValue,
        *,
        holder: str,
        endpoints: Any,
        ttl: float,
        on_lost: OnLost | None,
        own_conn: bool,
    ) -> None:
        self.conn = conn
        self.kv = kv
        self.holder = holder
        self.ttl = ttl
        self.on_lost = on_lost
        self._value = _enc.encode(
            _Value(holder=holder, ttl_s=ttl, endpoints=msgspec.Raw(_enc.encode(endpoints)))
        )
        self._own_conn = own_conn
        self.revision = 0  # the revision this holder wrote last; 0: not held
        self._renewer: asyncio.Task[None] | None = None
        self._renewed_at = 0.0
        self._callbacks: set[asyncio.Future[None]] = set()  # on_lost's, while they run

    @classmethod
    async def open(
        cls,
        where: str | NatsConnection,
        *,
        name: str = "omnix",
        holder: str | None = None,
        endpoints: Any = None,
        ttl: float = 1.5,
        replicas: int = 1,
        on_lost: OnLost | None = None,
    ) -> LeaderLease:
        """The lease bucket of log ``name`` on ``where`` (a NATS URL, or the
        connection a ``NatsLog`` holds: ``log.conn``), created if absent."""
        if not 0.1 <= ttl <= 600:
            raise LogError(f"lease ttl must be 0.1..600 seconds, got {ttl}")
        names = Names(name)
        conn = await connect(where) if isinstance(where, str) else where
        try:
            try:
                kv = await conn.js.key_value(names.lease)
            except nats.js.errors.BucketNotFoundError:
                kv = await conn.js.create_key_value(
                    KeyValueConfig(
                        bucket=names.lease,
                        history=1,
                        ttl=2 * ttl,  # the backstop: expiry without a standby watching
                        storage=StorageType.FILE,
                        replicas=replicas,
                    )
                )
        except BaseException:
            if isinstance(where, str):
                await conn.close()
            raise
        return cls(
            conn,
            kv,
            holder=holder or uuid.uuid4().hex[:12],
            endpoints=endpoints,
            ttl=ttl,
            on_lost=on_lost,
            own_conn=isinstance(where, str),
        )

    # -- reading --------------------------------------------------------------
    async def current(self, endpoints_type: type[T] | Any = Any) -> LeaseInfo[T] | None:
        """The holder now (None when nobody holds the lease); ``endpoints``
        decoded as ``endpoints_type``."""
        try:
            entry = await self.kv.get(KEY)
        except nats.js.errors.KeyNotFoundError:
            return None
        val = _dec.decode(entry.value or b"")
        return LeaseInfo(
            holder=val.holder,
            ttl_s=val.ttl_s,
            revision=entry.revision or 0,
            endpoints=msgspec.json.decode(val.endpoints, type=endpoints_type),
        )

    async def holders(
        self, endpoints_type: type[T] | Any = Any
    ) -> AsyncIterator[LeaseInfo[T] | None]:
        """The holder now, then each time another holder (or nobody, None)
        has the lease: how a worker or a frontend follows the leader.
        Polls every ``ttl/15``; a read that fails is retried, not reported."""
        poll = max(0.02, self.ttl / 15)
        last: tuple[str, ...] | None = None
        while True:
            try:
                cur: LeaseInfo[T] | None = await self.current(endpoints_type)
            except (TimeoutError, nats.errors.Error, OSError):
                await asyncio.sleep(poll)
                continue
            key = (cur.holder,) if cur is not None else ()
            if key != last:
                last = key
                yield cur
            await asyncio.sleep(poll)

    @property
    def held(self) -> bool:
        return self.revision > 0

    # -- holding --------------------------------------------------------------
    async def acquire(self) -> bool:
        """Take the lease if nobody holds it (or this holder already did);
        start renewing it.  False when another holder has it."""
        sent = time.monotonic()
        try:
            rev = await self.kv.create(KEY, self._value)
        except nats.js.errors.KeyWrongLastSequenceError:
            cur: LeaseInfo[Any] | None = await self.current()
            if cur is None or cur.holder != self.holder:
                return False
            try:
                rev = await self.kv.update(KEY, self._value, last=cur.revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                return False
        self._held(rev, sent)
        return True

    async def _take_over(self, revision: int) -> bool:
        """Take the key over from an expired holder seen at ``revision``
        (0: the key was absent)."""
        sent = time.monotonic()
        try:
            if revision == 0:
                rev = await self.kv.create(KEY, self._value)
            else:
                rev = await self.kv.update(KEY, self._value, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        self._held(rev, sent)
        return True

    def _held(self, rev: int, sent: float) -> None:
        self.revision = rev
        self._renewed_at = sent  # when the write was sent: see renew()
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_loop())

    async def renew(self) -> None:
        """Renew now (compare-and-set on the revision); ``LeaseLost`` when
        another holder took the key."""
        if not self.revision:
            raise LeaseLost(f"{self.holder} does not hold the lease")
        # The lease runs from before the request: the server wrote it later,
        # and a standby saw it later still, so this holder's idea of when
        # it expires is never later than a standby's.
        sent = time.monotonic()
        try:
            self.revision = await self.kv.update(KEY, self._value, last=self.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            self.revision = 0
            raise LeaseLost(
                f"lease {self.kv._name}: another holder took it from {self.holder}"
            ) from None
        self._renewed_at = sent

    async def _renew_loop(self) -> None:
        every = self.ttl / 3
        while self.revision:
            await asyncio.sleep(every)
            if not self.revision:
                return
            left = self._renewed_at + self.ttl - time.monotonic()
            try:
                # Never wait on a renewal past the lease's own end.
                await asyncio.wait_for(self.renew(), max(left, 0.001))
            except LeaseLost as exc:
                self._lost(exc)
                return
            except (TimeoutError, nats.errors.Error, OSError) as exc:
                if time.monotonic() - self._renewed_at >= self.ttl:
                    self._lost(
                        LeaseLost(
                            f"lease {self.kv._name}: not renewed for {self.ttl}s ({exc!r}); "
                            "a standby may hold it now"
                        )
                    )
                    return

    def _lost(self, exc: LeaseLost) -> None:
        self.revision = 0
        log.warning("%s", exc)
        cb = self.on_lost
        if cb is not None:
            res = cb(exc)
            if inspect.isawaitable(res):
                task = asyncio.ensure_future(res)
                self._callbacks.add(task)
                task.add_done_callback(self._callbacks.discard)

    # -- standing by ------------------------------------------------------------
    async def wait_expired(self) -> int:
        """Return once the lease is free: the key absent (0), or its
        revision (returned) unchanged for the holder's TTL as measured
        here."""
        poll = max(0.02, self.ttl / 15)
        seen_rev = -1
        seen_at = time.monotonic()
        ttl = self.ttl
        while True:
            try:
                entry = await self.kv.get(KEY)
            except nats.js.errors.KeyNotFoundError:
                return 0
            except (TimeoutError, nats.errors.Error, OSError):
                await asyncio.sleep(poll)  # cannot see the key: conclude nothing
                continue
            now = time.monotonic()
            rev = entry.revision or 0
            if rev != seen_rev:
                seen_rev, seen_at = rev, now
                with contextlib.suppress(msgspec.DecodeError):
                    ttl = _dec.decode(entry.value or b"").ttl_s
            elif now - seen_at >= ttl:
                return rev
            await asyncio.sleep(poll)

    async def acquire_when_free(self) -> None:
        """Wait for the lease to expire (or be released), then take it."""
        if await self.acquire():
            return
        while True:
            rev = await self.wait_expired()
            if await self._take_over(rev):
                return

    # -- letting go ---------------------------------------------------------------
    async def release(self) -> None:
        """Give the lease up (a standby takes it at its next poll)."""
        rev, self.revision = self.revision, 0
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await renewer
        if rev:
            with contextlib.suppress(nats.js.errors.Error, nats.errors.Error, TimeoutError):
                await self.kv.delete(KEY, last=rev)

    async def close(self) -> None:
        """Stop renewing without releasing (what a crash looks like to the
        others, bar the process staying up); close an owned connection."""
        self.revision = 0
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await renewer
        if self._own_conn:
            await self.conn.close()
