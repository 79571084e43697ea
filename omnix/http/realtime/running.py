"""A session's request followed: its events, sent as they come.

Owns ``Following``: a task that tails one request of a session in the
log, renders each event (a ``Rendering``: ``render.ResponseStream``, or
``transcript.TranscriptStream`` for an input transcription) and sends the
server events of a burst together, never before the events they come from
are on disk (a ``--log-dir`` log: ``core.respond.durable``); ``cancel``
(through the log: ``Omni.cancel``, one terminal event, every stage
aborted); and the session's callback once the request ended, called
before the final events leave, so that a client answering ``response.done``
with a new ``response.create`` finds no response running (and one reading
a transcription's ``completed`` finds the item's transcript).  A resumed
client (a server restarted on its log, the request continued) names the
last event it had (``after``): what it rendered to up to there is not
sent again.  ``RunningResponse``: the one response a session runs.

Does not own the session (``session.py``) nor the events' bytes
(``render.py``, ``transcript.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from omnix.events.types import CancelReason, Event
from omnix.http.core.respond import caught_up, durable
from omnix.http.core.server import Server
from omnix.http.realtime.audio_in import BYTES_PER_MS
from omnix.http.realtime.render import ResponseStream

log = logging.getLogger("omnix.http.realtime")

Send = Callable[[list[bytes]], Awaitable[None]]


def event_place(event_id: str) -> tuple[int, int]:
    """Where a response's event stands: ``event_<pos>[_<k>]`` -> (pos, k);
    any other id (a session's) -> (-1, 0), before every response event."""
    head, _, rest = event_id.removeprefix("event_").partition("_")
    if not head.isdigit() or (rest and not rest.isdigit()):
        return (-1, 0)
    return int(head), int(rest or 0)


class Rendering(Protocol):
    """What renders one request's events to server events."""

    done: bool

    @property
    def ids(self) -> list[str]: ...

    def feed(self, ev: Event) -> list[bytes]: ...


R = TypeVar("R", bound=Rendering)


class Following(Generic[R]):
    """One request of a session, followed to its end."""

    def __init__(
        self,
        server: Server,
        rid: str,
        stream: R,
        send: Send,
        ended: Callable[[Following[R]], None],
        after: str = "",
    ) -> None:
        self.server = server
        self.rid = rid
        self.stream = stream
        self._send = send
        self._ended = ended
        self._told = False
        #: a resumed client had the events up to this place: send what follows
        self._after = event_place(after) if after else None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"omnix-realtime-{self.rid}")

    def cancel(self, reason: CancelReason) -> bool:
        """Cancel the request through the log; False when it already ended."""
        return self.server.omni.cancel(self.rid, reason)

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def _new(self, frames: list[bytes]) -> list[bytes]:
        """What the client has not had of ``frames`` (a resumed client)."""
        after = self._after
        if after is None:
            return frames
        return [f for f, i in zip(frames, self.stream.ids, strict=True) if event_place(i) > after]

    def _end(self) -> None:
        if not self._told:
            self._told = True
            self._ended(self)

    async def _run(self) -> None:
        omni = self.server.omni
        stream = self.stream
        buf: list[bytes] = []
        last = -1
        try:
            async for ev in omni.events(self.rid):
                last = ev.pos
                buf += self._new(stream.feed(ev))
                if stream.done:
                    break
                if buf and caught_up(omni, self.rid, ev.pos):
                    await durable(omni, ev.pos)
                    await self._send(buf)
                    buf = []
            self._end()
            await durable(omni, last)
            if buf:
                await self._send(buf)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("realtime request %s: sending its events failed", self.rid)
        finally:
            self._end()


class RunningResponse(Following[ResponseStream]):
    """One response's request, followed to its end: ``item`` the assistant
    item it adds."""

    def __init__(
        self,
        server: Server,
        rid: str,
        item: str,
        send: Send,
        ended: Callable[[RunningResponse], None],
        after: str = "",
    ) -> None:
        stream = ResponseStream(server.omni.blobs)
        super().__init__(server, rid, stream, send, lambda _: ended(self), after)
        self.item = item

    @property
    def audio_ms(self) -> int:
        """Milliseconds of audio sent so far."""
        return self.stream.audio_bytes // BYTES_PER_MS
