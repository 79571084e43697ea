"""A replicated log's blobs: held in memory, carried on the log's own stream.

Owns: ``ReplicatedBlobs``, the ``BlobStore`` of a ``NatsLog`` (its
``blobs``).  A blob put on the leader is kept here and handed to the
log's publisher (``send``), which publishes it as a message of its own
before any event appended after the put: so an event that references a
blob is never acknowledged before the blob is, and a follower (a
standby, a frontend) has the blob by the time it applies the event.  A
follower's store is filled by its reader (``replicated``); a blob put on
a follower (a frontend decoding a request's media) stays local.

The stream sequence each held blob was last published at is kept
(``seqs``): a snapshot reopens the log from the batch holding its oldest
retained event, and purges what is before, so blobs still held whose
message is older than that are published again first (``older_than``).

Retention deletes blobs as it does from any store (``delete``); the
stream's copies go with the purge.  Does not own the publishing or the
reading (``natspub.py``, ``natsread.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from omnix.events.blobs import MemoryBlobStore


class ReplicatedBlobs(MemoryBlobStore):
    """Blobs in memory; those put while ``send`` is set are published."""

    def __init__(self) -> None:
        super().__init__()
        #: publishes a blob put here (the leader's publisher); None while following
        self.send: Callable[[str, bytes], None] | None = None
        #: digest -> the stream sequence of its latest message
        self.seqs: dict[str, int] = {}

    def _write(self, digest: str, data: bytes | memoryview) -> None:
        super()._write(digest, data)
        if self.send is not None:
            self.send(digest, bytes(data))

    def _delete(self, digest: str) -> bool:
        self.seqs.pop(digest, None)
        return super()._delete(digest)

    def replicated(self, seq: int, digest: str, data: bytes) -> None:
        """A blob read from the stream at ``seq`` (a follower's reader)."""
        if not self._has(digest):
            super()._write(digest, data)
        self.seqs[digest] = seq

    def acked(self, digest: str, seq: int) -> None:
        """The leader's publish of ``digest`` was acked at ``seq``."""
        if self._has(digest):
            self.seqs[digest] = seq

    def older_than(self, seq: int) -> list[str]:
        """Held blobs whose latest message is before ``seq``."""
        return [d for d, s in self.seqs.items() if s < seq and self._has(d)]
