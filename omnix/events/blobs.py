"""Content-addressed storage for large payloads referenced by events.

Owns: ``BlobStore`` (put bytes or an array, get them back by ``BlobRef``)
with an in-memory and an on-disk implementation.  Events never inline audio,
images or tensors; they carry a ``BlobRef`` (digest, size, dtype, shape).

On disk a blob is ``ROOT/ab/cdef....bin``: written to a temporary file and
renamed into place, so a crash leaves either the whole blob or none.  The
digest is blake2b-128 of the bytes; the dtype/shape live in the reference,
so identical bytes with different shapes share one file.

Blobs are deleted only by retention (``retention.py``), which counts the
references retained events hold.  A blob is put *before* the event that
references it is appended, so a digest put again since the last time
retention asked (``take_fresh``) is not deleted yet: a worker may be about
to reference it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from omnix.events.types import BlobRef


class BlobMissing(KeyError):
    def __str__(self) -> str:
        return f"blob {self.args[0]} is not in the store (was the trace exported with its blobs?)"


def blob_digest(data: bytes | memoryview) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _array_view(arr: np.ndarray) -> tuple[memoryview, str, tuple[int, ...]]:
    arr = np.ascontiguousarray(arr)
    # ``arr.data`` is ``memoryview(arr)``, spelled so numpy's stubs type it.
    return arr.data.cast("B"), arr.dtype.str, tuple(int(d) for d in arr.shape)


class BlobStore:
    """Abstract store; subclasses implement ``_write``, ``_read``, ``_has``
    and ``_delete``."""

    #: digests put since the last ``take_fresh`` (bounded by the puts between
    #: two of retention's releases); None while no retention watches this
    #: store, which then remembers nothing of its puts
    _fresh: set[str] | None = None

    def put(self, data: bytes | memoryview, media_type: str = "") -> BlobRef:
        digest = blob_digest(data)
        if self._fresh is not None:
            self._fresh.add(digest)
        if not self._has(digest):
            self._write(digest, data)
        return BlobRef(digest=digest, nbytes=len(data), media_type=media_type)

    def put_array(self, arr: np.ndarray, media_type: str = "") -> BlobRef:
        view, dtype, shape = _array_view(arr)
        digest = blob_digest(view)
        if self._fresh is not None:
            self._fresh.add(digest)
        if not self._has(digest):
            self._write(digest, view)
        return BlobRef(
            digest=digest, nbytes=view.nbytes, dtype=dtype, shape=shape, media_type=media_type
        )

    def get(self, ref: BlobRef | str) -> bytes:
        digest = ref if isinstance(ref, str) else ref.digest
        return self._read(digest)

    def get_array(self, ref: BlobRef) -> np.ndarray:
        if ref.dtype == "bytes":
            raise ValueError(f"blob {ref.digest} holds bytes ({ref.media_type}), not an array")
        data = self._read(ref.digest)
        return np.frombuffer(data, dtype=np.dtype(ref.dtype)).reshape(ref.shape)

    def __contains__(self, ref: BlobRef | str) -> bool:
        return self._has(ref if isinstance(ref, str) else ref.digest)

    def delete(self, digest: str) -> bool:
        """Remove one blob (retention calls it once no retained event refers
        to it); returns whether it was there."""
        return self._delete(digest)

    def take_fresh(self) -> set[str]:
        """The digests put since the last call (and forget them); the first
        call starts the watch (retention makes it when it starts)."""
        fresh, self._fresh = self._fresh or set(), set()
        return fresh

    def _write(self, digest: str, data: bytes | memoryview) -> None:
        raise NotImplementedError

    def _delete(self, digest: str) -> bool:
        raise NotImplementedError

    def _read(self, digest: str) -> bytes:
        raise NotImplementedError

    def _has(self, digest: str) -> bool:
        raise NotImplementedError


class MemoryBlobStore(BlobStore):
    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}

    def _delete(self, digest: str) -> bool:
        return self._blobs.pop(digest, None) is not None

    @property
    def stored_bytes(self) -> int:
        return sum(len(b) for b in self._blobs.values())

    def _write(self, digest: str, data: bytes | memoryview) -> None:
        self._blobs[digest] = bytes(data)

    def _read(self, digest: str) -> bytes:
        try:
            return self._blobs[digest]
        except KeyError:
            raise BlobMissing(digest) from None

    def _has(self, digest: str) -> bool:
        return digest in self._blobs

    def digests(self) -> list[str]:
        return sorted(self._blobs)


class DiskBlobStore(BlobStore):
    """Blobs as files under ``root``; writes are atomic (temp + rename)."""

    def __init__(self, root: str | os.PathLike[str], fsync: bool = False) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync

    def _delete(self, digest: str) -> bool:
        try:
            self.path(digest).unlink()
        except FileNotFoundError:
            return False
        return True

    def path(self, digest: str) -> Path:
        return self.root / digest[:2] / f"{digest[2:]}.bin"

    def _write(self, digest: str, data: bytes | memoryview) -> None:
        dest = self.path(digest)
        dest.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _read(self, digest: str) -> bytes:
        try:
            return self.path(digest).read_bytes()
        except FileNotFoundError:
            raise BlobMissing(digest) from None

    def _has(self, digest: str) -> bool:
        return self.path(digest).exists()

    def digests(self) -> list[str]:
        return sorted(p.parent.name + p.stem for p in self.root.glob("??/*.bin"))


def array_ref(arr: np.ndarray, media_type: str = "") -> BlobRef:
    """The reference ``BlobStore.put_array`` gives ``arr``, without storing
    it: content addressing lets a caller name a blob before deciding to
    keep it (media decoded for a request that may still be refused)."""
    view, dtype, shape = _array_view(arr)
    return BlobRef(
        digest=blob_digest(view),
        nbytes=view.nbytes,
        dtype=dtype,
        shape=shape,
        media_type=media_type,
    )
