"""A disk log's index: where each position's record is, and each request's positions.

Owns: ``LogIndex``: the segments a log holds open, in position order
(first position, path, length); one byte offset per position in a compact
``array('Q')`` (8 bytes per event); each request's positions as a backward
chain through an ``array('q')`` (``prev[pos]`` is the request's previous
position) from its latest; the index base (positions below it are gone
from the index: their segments were let go, or they precede what a
snapshot needs) and the workers' events kept below it (``pinned``).  So
the index costs 16 bytes per event plus one dict entry per request, and
keeps no event object alive but the pinned ones.

Does not own the records (``segments.py`` frames them, ``segwriter.py``
writes them and indexes each, ``segreader.py`` reads them by position),
which segments go and when (``compaction.py``), nor rebuilding the index on
open (``logrecovery.py``).
"""

from __future__ import annotations

import bisect
from array import array

from omnix.events.segments import Segment
from omnix.events.types import Event, Released, Scaled, SessionChanged, WorkerJoined, WorkerLost

__all__ = ["LogIndex"]


class LogIndex:
    """Positions to segments and byte offsets; request ids to positions."""

    __slots__ = ("base", "firsts", "last", "offs", "pinned", "prev", "released_any", "segs")

    def __init__(self) -> None:
        self.segs: list[Segment] = []
        self.firsts: list[int] = []  # each segment's first position
        # ``offs[i]``/``prev[i]`` are about position ``base + i``.
        self.offs = array("Q")
        self.prev = array("q")  # -1: the request's first event (or a server event)
        self.last: dict[str, int] = {}  # request id -> its latest position
        self.base = 0
        self.pinned: dict[int, Event] = {}
        #: a ``Released`` was stored: reads must skip released requests' events
        self.released_any = False

    def add_segment(self, seg: Segment) -> None:
        self.segs.append(seg)
        self.firsts.append(seg.first_pos)

    def add(self, ev: Event, offset: int) -> None:
        """Index the stored event ``ev`` whose record starts at ``offset``
        of the last segment (every append: keep it lean)."""
        self.offs.append(offset)
        if (
            type(ev) is WorkerJoined
            or type(ev) is WorkerLost
            or type(ev) is SessionChanged
            or type(ev) is Scaled
        ):  # exact types: see types.py
            self.prev.append(-1)
        elif type(ev) is Released:
            self.prev.append(-1)
            self.released_any = True
            last = self.last
            for rid in ev.request_ids:
                last.pop(rid, None)
        else:
            last = self.last
            rid = ev.request_id
            self.prev.append(last.get(rid, -1))
            last[rid] = ev.pos

    def positions(self, request_id: str, start: int = 0) -> list[int]:
        """The request's indexed positions ``>= start``, in order.  Walks
        back only over those: a subscriber tailing one long request costs
        O(new events) per wake, not O(all its events)."""
        p = self.last.get(request_id, -1)
        out = []
        prev = self.prev
        base = self.base
        start = max(start, base)
        while p >= start:
            out.append(p)
            p = prev[p - base]
        out.reverse()
        return out

    def segment_of(self, pos: int) -> int:
        """The index in ``segs`` of the segment holding ``pos``."""
        return bisect.bisect_right(self.firsts, pos) - 1

    def record_start(self, si: int, q: int, active_end: int) -> int:
        """Byte offset where position ``q``'s record starts in segment
        ``si``, or the segment's end when ``q`` is past it (``active_end``:
        the last segment's length, buffered bytes included)."""
        firsts = self.firsts
        nxt = firsts[si + 1] if si + 1 < len(firsts) else None
        if q - self.base < len(self.offs) and (nxt is None or q < nxt):
            return self.offs[q - self.base]
        return active_end if nxt is None else self.segs[si].end

    def drop_segments(self, k: int) -> list[Segment]:
        """Forget the first ``k`` segments (and the positions they held);
        return them.  The last segment always stays."""
        gone = self.segs[:k]
        below = self.firsts[k]
        del self.segs[:k]
        del self.firsts[:k]
        n = below - self.base
        if n > 0:
            del self.offs[:n]
            del self.prev[:n]
            self.base = below
        return gone
