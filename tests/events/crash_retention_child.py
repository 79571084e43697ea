"""Child process of the retention crash test: append with retention and
frequent snapshots, acknowledging each event; slow the snapshot's rename
and each segment deletion so that kills land inside them.

Run as ``python crash_retention_child.py LOGDIR TAG``.  Writes ``ready N``,
then ``POS CRC32 REQUEST_ID`` after each ``append`` returns (acknowledged),
``S``/``s`` around each snapshot write and ``D``/``d`` around each
segment deletion pass.
"""

from __future__ import annotations

import os
import sys
import time
import zlib
from pathlib import Path

from crash_child import lifecycle

from omnix.events import disklog, snapshot
from omnix.events.codec import encode_event
from omnix.events.disklog import DiskLog, LogConfig
from omnix.events.retention import Retention, RetentionPolicy
from omnix.events.types import RequestEvent

out = os.fdopen(sys.stdout.fileno(), "wb", buffering=0)
_replace = os.replace
_unlink = Path.unlink


class _SlowOs:
    """``os`` for the snapshot module: its rename takes a moment."""

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    @staticmethod
    def replace(a: object, b: object) -> None:
        time.sleep(0.002)
        _replace(a, b)  # type: ignore[arg-type]


def _slow_unlink(self: Path, missing_ok: bool = False) -> None:
    if self.suffix == ".seg":
        time.sleep(0.001)
    _unlink(self, missing_ok=missing_ok)


snapshot.os = _SlowOs()  # type: ignore[assignment]
Path.unlink = _slow_unlink  # type: ignore[method-assign]
_snapshot = DiskLog.snapshot
_compact = DiskLog._compact


def _marked_snapshot(self: DiskLog) -> Path:
    out.write(b"S\n")
    p = _snapshot(self)
    out.write(b"s\n")
    return p


def _marked_compact(self: DiskLog) -> None:
    out.write(b"D\n")
    _compact(self)
    out.write(b"d\n")


DiskLog.snapshot = _marked_snapshot  # type: ignore[method-assign]
DiskLog._compact = _marked_compact  # type: ignore[method-assign]


def main() -> None:
    root, tag = sys.argv[1], sys.argv[2]
    log = DiskLog(root, LogConfig(fsync="always", segment_bytes=4096, snapshot_every=60))
    Retention(log, RetentionPolicy(window_s=None, max_requests=4, max_bytes=None))
    out.write(f"ready {log.next_pos}\n".encode())
    n = 0
    while True:
        rid = f"{tag}-{n}"
        n += 1
        for ev in lifecycle(rid, chunks=n % 9):
            stored = log.append(ev)
            assert isinstance(stored, RequestEvent)
            out.write(f"{stored.pos} {zlib.crc32(encode_event(stored))} {rid}\n".encode())


if __name__ == "__main__":
    assert disklog.SNAPSHOT_DIR == "snapshots"
    main()
