"""An input audio transcription's server events, as a pure function of its request's events.

Owns ``TranscriptStream``: feed it the events of one session's
transcription request (``spec.api`` ``audio.transcriptions``,
``RealtimeOptions`` naming the user item) in log order and it returns the
server events they make:

    conversation.item.input_audio_transcription.delta   (a text chunk each)
      -> conversation.item.input_audio_transcription.completed
         (the whole transcript, usage)
    or -> conversation.item.input_audio_transcription.failed
         (refused, failed or cancelled: the error)

Nothing is sent at admission.  A cancelled transcription (its session
closed) sends no delta after its ``cancel_requested``.  Event ids derive
from log positions (``protocol.LogFrames``), as a response's do.  And
``failure``: a request's terminal error as the Realtime API's error object
(a response's ``status_details`` too).

Does not own following the request (``running.py``) nor setting the item's
transcript (``session.py``, ``record.py``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from omnix.events.blobs import BlobStore
from omnix.events.options import RealtimeOptions
from omnix.events.types import (
    Admitted,
    Cancelled,
    CancelRequested,
    Chunk,
    Event,
    Failed,
    Finished,
    Rejected,
    StageFinished,
)
from omnix.http.common.rendering import terminal_error
from omnix.http.common.summary import RequestSummary
from omnix.http.realtime.protocol import LogFrames

#: The content part of a committed audio item that holds its audio.
AUDIO_PART = 0


def failure(ev: Failed | Cancelled | Rejected) -> dict[str, Any]:
    """The request's end as the Realtime API's error object."""
    err = terminal_error(ev)
    message = msgspec.json.decode(err[1])["error"]["message"] if err is not None else ev.reason
    return {"type": "server_error", "code": ev.reason, "message": message}


class TranscriptStream:
    """One transcription's server events (see the module's docstring).
    ``done`` after the terminal event; ``text``: the transcript so far;
    ``completed``: it finished."""

    def __init__(self, blobs: BlobStore) -> None:
        self.s = RequestSummary(blobs, collect_media=False)
        self.opts = RealtimeOptions()
        self.frames = LogFrames()
        self.done = False
        self.completed = False
        self._stopped = False

    @property
    def ids(self) -> list[str]:
        return self.frames.ids

    @property
    def text(self) -> str:
        return "".join(self.s.text)

    def _ids(self) -> dict[str, Any]:
        return {"item_id": self.opts.item, "content_index": AUDIO_PART}

    def feed(self, ev: Event) -> list[bytes]:
        if self.done:
            return []
        self.frames.at(ev.pos)
        if type(ev) is Admitted or type(ev) is Rejected:
            self.s.admitted(ev)
            opts = ev.spec.response
            if not isinstance(opts, RealtimeOptions):
                raise ValueError(f"request {ev.request_id} is not a realtime transcription")
            self.opts = opts
            return self._end(ev) if type(ev) is Rejected else []
        if type(ev) is Chunk:
            self.s.chunk(ev)
            if ev.modality != "text" or ev.stage != self.s.text_stage or not ev.text:
                return []
            if self._stopped:
                return []
            kind = "conversation.item.input_audio_transcription.delta"
            return [self.frames.event(kind, delta=ev.text, **self._ids())]
        if type(ev) is StageFinished:
            self.s.finished[ev.stage] = ev
        elif type(ev) is CancelRequested:
            self._stopped = True
        elif type(ev) is Finished or type(ev) is Failed or type(ev) is Cancelled:
            return self._end(ev)
        return []

    def _end(self, ev: Finished | Failed | Cancelled | Rejected) -> list[bytes]:
        self.done = True
        self.s.terminal = ev
        if type(ev) is Finished:
            self.completed = True
            p, c = self.s.usage()
            usage = {"type": "tokens", "input_tokens": p, "output_tokens": c, "total_tokens": p + c}
            kind = "conversation.item.input_audio_transcription.completed"
            return [self.frames.event(kind, transcript=self.text, usage=usage, **self._ids())]
        assert not isinstance(ev, Finished)
        kind = "conversation.item.input_audio_transcription.failed"
        return [self.frames.event(kind, error=failure(ev), **self._ids())]
