"""Reading a disk log's events by position.

Owns: ``SegmentReader``: turning a range of positions into events, one
``pread`` per window of about 1 MiB of records (or a copy out of the write
buffer for the newest ones), and a small cache of read descriptors, one
per segment.

Does not own where each position's record is (``logindex.py``), the write
buffer (``segwriter.py`` hands out the bytes still in it), which events a
reader may see once retention released some (``DiskLog.read``), nor
verifying records: they were checked when the log was opened or written.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator

from omnix.events.logindex import LogIndex
from omnix.events.segments import REC, REC_HEADER_SIZE, LogError, event_decoder
from omnix.events.segwriter import SegmentWriter
from omnix.events.types import Event

__all__ = ["SegmentReader"]

_READ_WINDOW = 1 << 20  # bytes read per pread when iterating a range
_MAX_READ_FDS = 8


class SegmentReader:
    """Reads records of ``index``'s segments; the newest may still be in
    ``writer``'s buffer."""

    def __init__(self, index: LogIndex, writer: SegmentWriter) -> None:
        self.index = index
        self.writer = writer
        self._fds: dict[int, int] = {}  # segment index -> a read descriptor
        self._closed = False

    def events(self, start: int, stop: int) -> Iterator[Event]:
        """The events at ``start <= pos < stop``, every one of them indexed."""
        index = self.index
        offs = index.offs
        firsts = index.firsts
        unpack = REC.unpack_from
        decode = event_decoder.decode
        base = index.base
        pos = start
        while pos < stop:
            si = bisect.bisect_right(firsts, pos) - 1
            seg_stop = firsts[si + 1] if si + 1 < len(firsts) else stop
            seg_stop = min(seg_stop, stop)
            # One pread per window of about _READ_WINDOW bytes.
            a = offs[pos - base]
            q = bisect.bisect_right(offs, a + _READ_WINDOW, pos + 1 - base, seg_stop - base) + base
            q = max(q, pos + 1)
            b = index.record_start(si, q, self.writer.end)
            data = self._fetch(si, a, b)
            i = 0
            for _ in range(pos, q):
                j = i + REC_HEADER_SIZE + unpack(data, i)[0]
                # Records were checked when the log was opened or written;
                # every readable schema version decodes with one decoder.
                yield decode(data[i + REC_HEADER_SIZE + 1 : j])
                i = j
            pos = q

    def event(self, pos: int) -> Event:
        """The event at an indexed position."""
        for ev in self.events(pos, pos + 1):
            return ev
        raise AssertionError("unreachable")  # pragma: no cover

    def _fetch(self, si: int, a: int, b: int) -> bytes:
        segs = self.index.segs
        if si == len(segs) - 1:
            data = self.writer.buffered(a, b)
            if data is not None:
                return data
        path = segs[si].path
        if self._closed:
            # Reading still works (a tail drains what is left), but without
            # caching descriptors that nothing would close.
            with open(path, "rb") as f:
                data = os.pread(f.fileno(), b - a, a)
        else:
            fd = self._fds.get(si)
            if fd is None:
                if len(self._fds) >= _MAX_READ_FDS:
                    old = next(iter(self._fds))
                    os.close(self._fds.pop(old))
                fd = os.open(path, os.O_RDONLY)
                self._fds[si] = fd
            data = os.pread(fd, b - a, a)
        if len(data) != b - a:
            raise LogError(
                f"{path}: short read at byte {a} ({len(data)} of {b - a} bytes); was the "
                "file truncated while the log was open?"
            )
        return data

    def forget(self) -> None:
        """Close the cached descriptors (segments were let go: the indexes
        they are cached under moved)."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def close(self) -> None:
        self.forget()
        self._closed = True
