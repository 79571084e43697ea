"""A replicated log's snapshots, kept in a JetStream object store.

Owns: ``SnapshotStore``: writing a snapshot of the fold (``snapshot.py``'s
format: ``encode_snapshot`` of a ``SnapshotFile``, the same digest and
version checks) as object ``<next_pos>.snap`` of the bucket
``omnix-snap-NAME`` with headers naming the log's id, the last stream
sequence the snapshot covers (``Omnix-Seq``) and the sequence of the
batch that holds its ``index_from`` (``Omnix-Index-Seq``: where a reopen
starts reading the stream); keeping the newest ``keep`` of them; loading
the newest one that verifies (a damaged one is logged and skipped).

And ``SnapshotWriter``: storing a leader's newest snapshot once every
event it covers is acknowledged (so it never names a position the stream
could lack; a newer one offered meanwhile replaces one still waiting),
one at a time, then purging the stream below what every kept snapshot
needs.

Does not own when a snapshot is taken nor what it holds (``natslog.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable

from nats.js.api import ObjectMeta, StorageType
from nats.js.errors import BucketNotFoundError, NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from omnix.events.jetstream import (
    HDR_LOG_ID,
    NatsConnection,
    StreamRefused,
    retry_until_answered,
)
from omnix.events.snapshot import SnapshotFile, decode_snapshot, encode_snapshot, snapshot_name

__all__ = ["HDR_INDEX_SEQ", "HDR_SEQ", "LoadedSnapshot", "SnapshotStore", "SnapshotWriter"]

log = logging.getLogger("omnix.events.natslog")

HDR_SEQ = "Omnix-Seq"
HDR_INDEX_SEQ = "Omnix-Index-Seq"


class LoadedSnapshot:
    """A snapshot read back, and the stream sequences it names."""

    def __init__(self, snap: SnapshotFile, seq: int, index_seq: int, name: str) -> None:
        self.snap = snap
        self.seq = seq
        self.index_seq = index_seq
        self.name = name


class SnapshotStore:
    """The snapshots of one log in the object store ``bucket``."""

    def __init__(
        self, conn: NatsConnection, bucket: str, log_id: str, keep: int = 2, wait_s: float = 10.0
    ) -> None:
        self.conn = conn
        #: how long a read waits for JetStream to answer (a leader election
        #: after a node's loss takes seconds)
        self.wait_s = wait_s
        self.bucket = bucket
        self.log_id = log_id
        self.keep = keep
        self._store: ObjectStore | None = None
        #: (next_pos, index_seq) of the snapshots kept, oldest first
        self.kept: list[tuple[int, int]] = []

    async def _open(self, create: bool, replicas: int = 1) -> ObjectStore | None:
        if self._store is None:
            js = self.conn.js
            try:
                self._store = await retry_until_answered(
                    lambda: js.object_store(self.bucket), self.wait_s, f"bucket {self.bucket}"
                )
            except (BucketNotFoundError, NotFoundError):
                if not create:
                    return None
                self._store = await js.create_object_store(
                    self.bucket, storage=StorageType.FILE, replicas=replicas
                )
        return self._store

    async def _listing(self) -> list[tuple[int, int, str]]:
        """(next_pos, index_seq, name) of each snapshot object, oldest first."""
        store = await self._open(create=False)
        if store is None:
            return []
        try:
            infos = await retry_until_answered(
                lambda: store.list(ignore_deletes=True), self.wait_s, f"bucket {self.bucket}"
            )
        except NotFoundError:
            return []
        out = []
        for info in infos:
            stem = info.name.removesuffix(".snap")
            headers = info.headers or {}
            if info.deleted or not stem.isdigit():
                continue
            if headers.get(HDR_LOG_ID, self.log_id) != self.log_id:
                raise StreamRefused(
                    f"snapshot bucket {self.bucket} holds snapshots of another omnix log "
                    f"({headers.get(HDR_LOG_ID)}, not {self.log_id}); delete the bucket "
                    "(nats object rm) or use another log name"
                )
            out.append((int(stem), int(headers.get(HDR_INDEX_SEQ, "1")), info.name))
        out.sort()
        return out

    async def load_newest(self) -> LoadedSnapshot | None:
        """The newest snapshot that verifies (remembering every one kept)."""
        listing = await self._listing()
        self.kept = [(pos, iseq) for pos, iseq, _ in listing]
        store = self._store
        for pos, iseq, name in reversed(listing):
            assert store is not None
            try:
                res = await retry_until_answered(
                    functools.partial(store.get, name), self.wait_s, f"{self.bucket}/{name}"
                )
                snap = decode_snapshot(res.data or b"", f"{self.bucket}/{name}")
                if snap.next_pos != pos:
                    raise ValueError(f"{name}: holds position {snap.next_pos}")
                seq = int((res.info.headers or {}).get(HDR_SEQ, "0"))
            except (ValueError, ObjectNotFoundError) as exc:
                log.warning(
                    "ignoring snapshot %s/%s: %s; using an older one", self.bucket, name, exc
                )
                continue
            return LoadedSnapshot(snap, seq, iseq, name)
        return None

    async def save(self, snap: SnapshotFile, seq: int, index_seq: int, replicas: int) -> int:
        """Store ``snap`` (covering the stream up to ``seq``), drop all but
        the newest ``keep``; return the lowest ``index_seq`` still needed
        (the stream may be purged below it)."""
        store = await self._open(create=True, replicas=replicas)
        assert store is not None
        name = snapshot_name(snap.next_pos)
        meta = ObjectMeta(
            name=name,
            headers={HDR_LOG_ID: self.log_id, HDR_SEQ: str(seq), HDR_INDEX_SEQ: str(index_seq)},
        )
        await store.put(name, encode_snapshot(snap), meta=meta)
        self.kept = [k for k in self.kept if k[0] != snap.next_pos]
        self.kept.append((snap.next_pos, index_seq))
        while len(self.kept) > self.keep:
            old, _ = self.kept.pop(0)
            with contextlib.suppress(ObjectNotFoundError, NotFoundError):
                await store.delete(snapshot_name(old))
        return min(iseq for _, iseq in self.kept)


class SnapshotWriter:
    """Stores a leader's snapshots as their events are acknowledged, and
    purges the stream after each.  ``seq_of(pos)``: the stream sequence of
    the batch holding ``pos``; ``acked_pos()``: positions below it are acked."""

    def __init__(
        self,
        store: SnapshotStore,
        stream: str,
        replicas: int,
        seq_of: Callable[[int], int],
        acked_pos: Callable[[], int],
        keep: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        #: run before a snapshot is saved with the sequence its reopen reads
        #: from (the log's blobs older than it are published again)
        self.keep = keep
        self.stream = stream
        self.replicas = replicas
        self.seq_of = seq_of
        self.acked_pos = acked_pos
        self.ready: SnapshotFile | None = None  # waiting for its events' acks
        self.task: asyncio.Task[None] | None = None
        self.purged_below = 0
        self.count = 0  # snapshots stored

    def offer(self, snap: SnapshotFile) -> None:
        """Store ``snap`` once positions below its ``next_pos`` are acked."""
        self.ready = snap
        self.acked()

    def acked(self) -> None:
        """More was acked: start storing the waiting snapshot if it may."""
        ready = self.ready
        if ready is not None and ready.next_pos <= self.acked_pos() and self.task is None:
            self.ready = None
            self.task = asyncio.get_running_loop().create_task(self._write(ready))

    async def _write(self, snap: SnapshotFile) -> None:
        try:
            index_seq = self.seq_of(snap.index_from)
            seq = self.seq_of(snap.next_pos - 1) if snap.next_pos else 0
            if self.keep is not None:
                await self.keep(index_seq)
            cut = await self.store.save(snap, seq, index_seq, self.replicas)
            self.count += 1
            if cut > self.purged_below:
                await self.store.conn.js.purge_stream(self.stream, seq=cut)
                self.purged_below = cut
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The log itself is intact; only a reopen will read more.
            log.error(
                "stream %s: could not store a snapshot: %r; the log goes on", self.stream, exc
            )
        finally:
            self.task = None
        self.acked()  # one offered meanwhile

    async def wait(self) -> None:
        """Until no snapshot is being stored."""
        while self.task is not None:
            await asyncio.shield(self.task)

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()
