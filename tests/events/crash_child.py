"""Child process of the crash test: append forever, acknowledging each event.

Run as ``python crash_child.py LOGDIR TAG``.  Opens the DiskLog with
fsync="always" and tiny segments (so kills also land mid-rotation), then
appends request lifecycles in a loop.  After each ``append`` returns it
writes ``POS CRC32\\n`` to stdout (unbuffered), where CRC32 is over the
stored event's encoding: the parent treats every line it reads as an
acknowledged event that must survive SIGKILL.  Line ``ready N`` comes first
(N = the position it starts at).
"""

from __future__ import annotations

import os
import sys
import zlib

from omnix.events.codec import encode_event
from omnix.events.disklog import DiskLog, LogConfig
from omnix.events.types import (
    Admitted,
    Chunk,
    Finished,
    RequestSpec,
    Routed,
    StageFinished,
    StageStarted,
)


def lifecycle(rid: str, chunks: int):
    spec = RequestSpec(prompt="crash me " * 3, outputs=("text",))
    yield Admitted(request_id=rid, pipeline="p", spec=spec)
    yield Routed(request_id=rid, stage="thinker", replica=0, seq=0, sources=(), last=True)
    yield StageStarted(request_id=rid, stage="thinker", replica=0)
    for i in range(chunks):
        yield Chunk(
            request_id=rid,
            stage="thinker",
            replica=0,
            index=i,
            modality="text",
            text="tok" * (i % 7),
        )
    yield StageFinished(request_id=rid, stage="thinker", replica=0, chunks=chunks)
    yield Finished(request_id=rid)


def main() -> None:
    root, tag = sys.argv[1], sys.argv[2]
    out = os.fdopen(sys.stdout.fileno(), "wb", buffering=0)
    log = DiskLog(root, LogConfig(fsync="always", segment_bytes=4096))
    out.write(f"ready {log.next_pos}\n".encode())
    n = 0
    while True:
        rid = f"{tag}-{n}"
        n += 1
        # Requests interleave: two in flight at once.
        for ev in lifecycle(rid, chunks=n % 9):
            stored = log.append(ev)
            out.write(f"{stored.pos} {zlib.crc32(encode_event(stored))}\n".encode())


if __name__ == "__main__":
    main()
