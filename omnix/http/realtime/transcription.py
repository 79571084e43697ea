"""A session's input audio transcription: each committed turn transcribed by a request of its own.

Owns ``turn_transcription_plan``: a committed user audio item as the one
request ``POST /v1/audio/transcriptions`` plans for the same clip
(``audio.transcribe.transcription_plan``: one user message, the clip then
the instruction with the language and prompt), greedy (temperature 0: the
Realtime API's settings give none, and a transcript is the likeliest
text), recorded with api ``audio.transcriptions`` and the
``RealtimeOptions`` naming the session and the item, so that the
session's trace holds it and a resumed session finds its transcript.

And ``Transcriptions``: those of one session running.  Each is admitted in
a task of its own, so that a response never waits for it, then followed
(``running.Following`` rendering ``transcript.TranscriptStream``); the
item's transcript is set before ``.completed`` leaves.  A request refused
before admission (the server shutting down, a clip the model's context
cannot hold) sends ``.failed`` at once.  When the session ends each one
running is cancelled through the log (``disconnect``).

Does not own the events' bytes (``transcript.py``) nor when a turn is
committed (``session.py``, ``turns.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from omnix.events.options import RealtimeOptions, TranscriptionOptions
from omnix.events.sessions import TranscriptionSettings
from omnix.http.audio import transcribe
from omnix.http.audio.protocol import TranscriptionForm
from omnix.http.common.plan import Plan, PlanContext
from omnix.http.core.errors import ApiError
from omnix.http.core.server import Server
from omnix.http.core.submit import admit
from omnix.http.realtime.conversation import Entry
from omnix.http.realtime.respond import REALTIME_RENDER, new_id
from omnix.http.realtime.running import Following
from omnix.http.realtime.transcript import AUDIO_PART, TranscriptStream

Send = Callable[[list[bytes]], Awaitable[None]]
#: A session event (``Session.event``).
MakeEvent = Callable[..., bytes]

FAILED = "conversation.item.input_audio_transcription.failed"


def turn_transcription_plan(
    served: PlanContext, settings: TranscriptionSettings, entry: Entry, session: str
) -> Plan:
    """The request that transcribes ``entry``'s audio (see the module's docstring)."""
    form = TranscriptionForm(
        model=settings.model,
        language=settings.language or None,
        prompt=settings.prompt or None,
        temperature=0.0,
        stream=True,
    )
    (audio,) = entry.media
    plan = transcribe.transcription_plan(form, served, audio, entry.blobs)
    ((_, spec),) = plan.specs
    tx = spec.response
    assert isinstance(tx, TranscriptionOptions)
    opts = RealtimeOptions(
        render=REALTIME_RENDER,
        session=session,
        item=entry.id,
        modalities=("text",),
        usage_stage=tx.usage_stage,
        text_stage=tx.text_stage,
    )
    spec = msgspec.structs.replace(spec, response=opts)
    return msgspec.structs.replace(plan, specs=((new_id("tx"), spec),))


class Transcriptions:
    """One session's transcriptions running (see the module's docstring)."""

    def __init__(self, server: Server, session: str, send: Send, event: MakeEvent) -> None:
        self.server = server
        self.session = session
        self._send = send
        self._event = event
        #: by request id
        self.running: dict[str, Following[TranscriptStream]] = {}
        self._admitting: set[asyncio.Task[None]] = set()

    def start(self, settings: TranscriptionSettings, entry: Entry) -> None:
        """Transcribe ``entry``'s audio, without waiting."""
        task = asyncio.create_task(self._admit(settings, entry), name=f"omnix-tx-{entry.id}")
        self._admitting.add(task)
        task.add_done_callback(self._admitting.discard)

    async def _admit(self, settings: TranscriptionSettings, entry: Entry) -> None:
        try:
            plan = turn_transcription_plan(self.server.served, settings, entry, self.session)
            # A refusal is a ``Rejected`` in the log: its stream renders it.
            await admit(self.server, plan)
        except ApiError as err:
            error: dict[str, Any] = {"type": err.type, "code": err.code, "message": err.message}
            if err.param is not None:
                error["param"] = err.param
            frame = self._event(FAILED, item_id=entry.id, content_index=AUDIO_PART, error=error)
            try:
                await self._send([frame])
            except ConnectionResetError:
                pass
            return
        self.follow(plan.request_ids[0], entry)

    def follow(self, rid: str, entry: Entry, after: str = "") -> None:
        """Send ``rid``'s events (after ``after``, a resumed client's last)
        and set ``entry``'s transcript once it completed."""

        def ended(f: Following[TranscriptStream]) -> None:
            self.running.pop(f.rid, None)
            if f.stream.completed:
                entry.transcribed(f.stream.text)

        stream = TranscriptStream(self.server.omni.blobs)
        f = Following(self.server, rid, stream, self._send, ended, after)
        self.running[rid] = f
        f.start()

    def close(self) -> None:
        """The session ended: nothing more is admitted, and what runs is
        cancelled through the log."""
        for task in list(self._admitting):
            task.cancel()
        for f in list(self.running.values()):
            f.cancel("disconnect")
            f.close()
