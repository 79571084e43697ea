"""Turn-taking of one session: appended audio, and what server VAD makes of it.

Owns ``Turns``: the input audio a session's client appends (to its
buffer), and with ``turn_detection: server_vad`` the session's
``SpeechDetector`` (``vad.py``: made when it first hears audio, loading
Silero in a thread; reconfigured or dropped as ``session.update`` changes
the session's ``turn_detection``; fed each append in a thread, so that
finding speech never holds the event loop other sessions share) and what
each turn does: ``speech_started`` (the buffer keeps the padding before
it; a response still running is interrupted through the log, reason
``interrupted``), ``speech_stopped`` (the turn committed, then answered:
at once, or once the interrupted response has ended and its last events
have left).  Between turns the buffer keeps only the padding.

Does not own finding speech (``vad.py``), committing nor responding
(``session.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from omnix.events.types import CancelReason
from omnix.http.core.errors import ApiError
from omnix.http.realtime.audio_in import BYTES_PER_MS, InputBuffer
from omnix.http.realtime.config import SessionConfig
from omnix.http.realtime.protocol import TurnDetectionOut
from omnix.http.realtime.respond import new_id
from omnix.http.realtime.running import RunningResponse
from omnix.http.realtime.vad import SpeechDetector


class Session(Protocol):
    """What turn-taking needs of its session (``session.Session``)."""

    buffer: InputBuffer
    config: SessionConfig
    running: RunningResponse | None
    closed: bool
    send: Callable[[list[bytes]], Awaitable[None]]
    on_error: Callable[[ApiError, str | None], Awaitable[None]]

    def event(self, type_: str, **fields: Any) -> bytes: ...

    def cancel_response(self, response_id: str | None, reason: CancelReason) -> bool: ...

    async def commit(self, upto_ms: int | None = None, item_id: str = "") -> None: ...

    async def start_response(self, params: Any = None) -> None: ...


class Turns:
    """One session's turn-taking (see the module's docstring)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.config = session.config.turn_detection
        self.detector: SpeechDetector | None = None
        #: the item the turn server VAD heard start will be
        self._item = ""
        #: a turn was committed while a response was still ending
        self._respond_next = False
        self._next: asyncio.Task[None] | None = None

    @property
    def speaking(self) -> bool:
        return self.detector is not None and self.detector.speaking

    def configure(self, config: TurnDetectionOut | None) -> None:
        self.config = config
        if config is None:
            self.detector = None
        elif self.detector is not None:
            self.detector.configure(
                config.threshold, config.prefix_padding_ms, config.silence_duration_ms
            )

    async def append(self, audio: str) -> None:
        """Audio appended; with server VAD, the turns it completes."""
        buffer = self.session.buffer
        pcm = buffer.append(audio)
        c = self.config
        if c is None:
            return
        at_ms = buffer.end_ms - len(pcm) // BYTES_PER_MS
        if self.detector is None:
            self.detector = await asyncio.to_thread(
                SpeechDetector, c.threshold, c.prefix_padding_ms, c.silence_duration_ms, at_ms
            )
        for turn in await asyncio.to_thread(self.detector.feed, pcm):
            if turn.kind == "started":
                await self.speech_started(turn.ms, c)
            else:
                await self.speech_stopped(turn.ms, c)
        if not self.speaking:
            buffer.drop_before(buffer.end_ms - c.prefix_padding_ms)

    async def speech_started(self, ms: int, c: TurnDetectionOut) -> None:
        s = self.session
        s.buffer.drop_before(ms)
        self._item = new_id("item")
        await s.send(
            [s.event("input_audio_buffer.speech_started", audio_start_ms=ms, item_id=self._item)]
        )
        if c.interrupt_response and s.running is not None:
            s.cancel_response(None, "interrupted")

    async def speech_stopped(self, ms: int, c: TurnDetectionOut) -> None:
        s = self.session
        item_id = self._item or new_id("item")
        self._item = ""
        await s.send(
            [s.event("input_audio_buffer.speech_stopped", audio_end_ms=ms, item_id=item_id)]
        )
        await s.commit(ms, item_id)
        if not c.create_response:
            return
        if s.running is None:
            await s.start_response()
        else:
            self._respond_next = True

    def response_ended(self, r: RunningResponse) -> None:
        """``r`` ended: answer the turn committed meanwhile, if any."""
        if self._respond_next:
            self._respond_next = False
            self._next = asyncio.create_task(self._respond_after(r))

    async def _respond_after(self, previous: RunningResponse) -> None:
        """Answer once ``previous``'s last events have left."""
        s = self.session
        if previous.task is not None:
            await asyncio.wait([previous.task])
        if s.running is not None or s.closed:
            return
        try:
            await s.start_response()
        except ApiError as err:
            await s.on_error(err, None)
