"""Who follows a streamed response, and the grace a dropped one gets.

Owns ``Readers``: the streaming handlers attached to each running request
(the original response, and any ``GET /v1/requests/{id}/stream`` that
resumes it), and what happens when the last one's client goes away before
the end: the request keeps running ``grace_s`` seconds (``omnix serve
--resume-grace``) so that its client can reconnect and resume, and is
cancelled (``Omni.cancel(rid, "disconnect")``) if no reader is attached
when that time is up; with no grace, at once.

Does not own the streams themselves (``live.py``).
"""

from __future__ import annotations

import asyncio
import logging

from omnix.front import OmniProtocol

log = logging.getLogger("omnix.http")


class Readers:
    """The readers of one server's streamed responses."""

    def __init__(self, omni: OmniProtocol, grace_s: float) -> None:
        self.omni = omni
        #: Seconds a streamed request outlives its dropped client, for a
        #: reconnect to ``/stream`` (0: cancel at once).
        self.grace_s = grace_s
        self._readers: dict[str, int] = {}
        self._grace: dict[str, asyncio.TimerHandle] = {}

    def disconnected(self, rids: tuple[str, ...]) -> None:
        """The client of ``rids`` went away: cancel what still runs."""
        for rid in rids:
            if self.omni.cancel(rid, "disconnect"):
                log.info("request %s: client disconnected; cancelling", rid)

    def attach(self, rid: str) -> None:
        self._readers[rid] = self._readers.get(rid, 0) + 1
        handle = self._grace.pop(rid, None)
        if handle is not None:
            handle.cancel()

    def detach(self, rid: str, dropped: bool) -> None:
        """A streaming handler of ``rid`` ended; ``dropped``: its client
        went away before the end of the response."""
        n = self._readers.get(rid, 0) - 1
        if n > 0:
            self._readers[rid] = n
            return
        self._readers.pop(rid, None)
        if not dropped:
            return
        rs = self.omni.state(rid)
        if rs is None or rs.terminal:
            return
        if self.grace_s <= 0:
            self.disconnected((rid,))
            return
        log.info(
            "request %s: client disconnected; it keeps running %.0f s for a resume",
            rid,
            self.grace_s,
        )
        loop = asyncio.get_running_loop()
        self._grace[rid] = loop.call_later(self.grace_s, self._grace_over, rid)

    def _grace_over(self, rid: str) -> None:
        self._grace.pop(rid, None)
        if self._readers.get(rid, 0) == 0 and self.omni.accepting:
            self.disconnected((rid,))

    def close(self) -> None:
        """Forget pending grace timers (the server is closing)."""
        for handle in self._grace.values():
            handle.cancel()
        self._grace.clear()
