"""Server VAD for one session: its detector, configured, fed off the event loop.

Owns ``Turns``: the session's ``SpeechDetector`` (``vad.py``), made when
server VAD first hears audio (loading Silero takes a moment: done in a
thread), reconfigured or dropped as ``session.update`` changes the
session's ``turn_detection``, and fed each append in a thread, so that
finding speech never holds the event loop the other sessions share.

Does not own what a turn does (``session.py``) nor finding speech
(``vad.py``).
"""

from __future__ import annotations

import asyncio

from omnix.http.realtime.protocol import TurnDetectionOut
from omnix.http.realtime.vad import SpeechDetector, Turn


class Turns:
    """One session's server VAD, or none while ``turn_detection`` is null."""

    def __init__(self, config: TurnDetectionOut | None) -> None:
        self.config = config
        self.detector: SpeechDetector | None = None

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

    async def feed(self, pcm: bytes, at_ms: int) -> list[Turn]:
        """The turns ``pcm`` completes; ``at_ms``: where it starts on the
        session's audio clock."""
        c = self.config
        if c is None:
            return []
        if self.detector is None:
            self.detector = await asyncio.to_thread(
                SpeechDetector, c.threshold, c.prefix_padding_ms, c.silence_duration_ms, at_ms
            )
        return await asyncio.to_thread(self.detector.feed, pcm)
