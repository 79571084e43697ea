"""A realtime response's server events, as a pure function of its request's events.

Owns ``ResponseStream``: feed it one response's events in log order (a
request whose options are ``RealtimeOptions``) and it returns the server
events they make, each the JSON text of one WebSocket message, in the
order the ``openai`` SDK expects:

    response.created -> response.output_item.added -> conversation.item.added
      -> response.content_part.added
      -> response.output_audio.delta / response.output_audio_transcript.delta
         (audio) or response.output_text.delta (text), as chunks arrive
      -> response.output_audio.done + response.output_audio_transcript.done
         (or response.output_text.done) -> response.content_part.done
      -> response.output_item.done -> conversation.item.done -> response.done

A cancelled response (``response.cancel``, or the user speaking over it)
sends no delta after its ``cancel_requested`` event, whatever its stages
still deliver before they stop, and ends with ``response.done`` (status
``cancelled``); one that ran out of ``max_output_tokens`` is
``incomplete``; a failed or refused one ``failed``, its error in
``status_details``.  Event ids derive from log positions (``event_<pos>``,
``event_<pos>_<k>`` for the k-th event one log event makes), so a replay
renders the same messages.  A session's transcription request (``spec.api``
``audio.transcriptions``) renders as its transcription events
(``transcript.py``), so that every request of a session renders here.

Does not own the session's own events (``session.py``), reading the log
nor the socket (``connection.py``).
"""

from __future__ import annotations

from typing import Any

from omnix.events.blobs import BlobStore
from omnix.events.options import API_TRANSCRIPTION, RealtimeOptions
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
from omnix.http.common.audio import to_pcm16
from omnix.http.common.rendering import b64
from omnix.http.common.summary import RequestSummary
from omnix.http.realtime.protocol import (
    AudioOutputOut,
    Content,
    Item,
    LogFrames,
    ResponseAudioConfig,
    ResponseObject,
    Usage,
    UsageDetails,
)
from omnix.http.realtime.transcript import TranscriptStream, failure

#: Bytes of one second of the audio a session sends (pcm16 mono, 24 kHz).
PCM_BYTES_PER_S = 2 * 24000

_CANCEL_REASON = {"interrupted": "turn_detected"}


def _status(ev: Finished | Failed | Cancelled | Rejected, s: RequestSummary) -> tuple[str, Any]:
    """The response's final status and status_details."""
    if isinstance(ev, Finished):
        if s.finish_reason() == "length":
            return "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
        return "completed", None
    if isinstance(ev, Cancelled):
        reason = _CANCEL_REASON.get(ev.reason, "client_cancelled")
        return "cancelled", {"type": "cancelled", "reason": reason}
    return "failed", {"type": "failed", "error": failure(ev)}


class ResponseStream:
    """One realtime response's server events (see the module's docstring).
    ``done`` after the terminal event; ``audio_bytes``: the pcm16 audio
    sent; ``text``: its text or transcript; ``status``: its final status."""

    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs
        self.s = RequestSummary(blobs, collect_media=False)
        self.opts = RealtimeOptions()
        self.rid = ""
        self.done = False
        self.stopped = False  # a cancel was asked for: no more deltas
        self.audio_bytes = 0
        self.status = "in_progress"
        self.frames = LogFrames()
        #: a transcription request's events, rendered as such
        self.transcript: TranscriptStream | None = None

    @property
    def ids(self) -> list[str]:
        """The event ids of what the last ``feed`` returned, in order."""
        return self.transcript.ids if self.transcript is not None else self.frames.ids

    @property
    def text(self) -> str:
        return "".join(self.s.text)

    @property
    def audio(self) -> bool:
        return "audio" in self.opts.modalities

    def _event(self, type_: str, **fields: Any) -> bytes:
        return self.frames.event(type_, **fields)

    def feed(self, ev: Event) -> list[bytes]:
        if self.done:
            return []
        if (type(ev) is Admitted or type(ev) is Rejected) and ev.spec.api == API_TRANSCRIPTION:
            self.transcript = TranscriptStream(self.blobs)
        if self.transcript is not None:
            out = self.transcript.feed(ev)
            self.done = self.transcript.done
            return out
        self.frames.at(ev.pos)
        if type(ev) is Chunk:
            self.s.chunk(ev)
            return [] if self.stopped else self._chunk(ev)
        if type(ev) is StageFinished:
            self.s.finished[ev.stage] = ev
            return []
        if type(ev) is CancelRequested:
            self.stopped = True
            return []
        if type(ev) is Admitted:
            self.s.admitted(ev)
            return self._admitted(ev)
        if type(ev) is Rejected:
            self.s.admitted(ev)
            return [*self._admitted(ev, parts=False), *self._end(ev)]
        if type(ev) is Finished or type(ev) is Failed or type(ev) is Cancelled:
            return self._end(ev)
        return []

    # -- pieces --------------------------------------------------------------------

    def _ids(self) -> dict[str, Any]:
        return {"response_id": self.rid, "item_id": self.opts.item, "output_index": 0}

    def _part(self, final: bool) -> Content:
        if self.audio:
            return Content(type="audio", transcript=self.text if final else "")
        return Content(type="text", text=self.text if final else "")

    def item(self, status: str) -> Item:
        """The response's assistant item, as it stands."""
        content: list[Content] = []
        if status != "in_progress":
            text = self.text
            content = [
                Content(type="output_audio", transcript=text)
                if self.audio
                else Content(type="output_text", text=text)
            ]
        return Item(id=self.opts.item, status=status, role="assistant", content=content)

    def _response(self, status: str, details: Any = None, usage: Usage | None = None) -> Any:
        o = self.opts
        audio = None
        if self.audio:
            audio = ResponseAudioConfig(output=AudioOutputOut(voice=o.voice or "default"))
        output = [self.item(_item_status(status))] if status != "in_progress" else []
        return ResponseObject(
            id=self.rid,
            status=status,
            status_details=details,
            output=output,
            conversation_id=o.conversation or None,
            output_modalities=list(o.modalities),
            max_output_tokens=o.max_output_tokens or "inf",
            audio=audio,
            usage=usage,
            metadata=o.metadata or None,
        )

    def _admitted(self, ev: Admitted | Rejected, parts: bool = True) -> list[bytes]:
        opts = ev.spec.response
        if not isinstance(opts, RealtimeOptions):
            raise ValueError(f"request {ev.request_id} is not a realtime response")
        self.opts, self.rid = opts, ev.request_id
        out = [self._event("response.created", response=self._response("in_progress"))]
        if not parts:
            return out
        item = self.item("in_progress")
        out.append(self._event("response.output_item.added", item=item, **_less(self._ids())))
        if opts.conversation:
            prev = opts.previous_item or None
            out.append(self._event("conversation.item.added", item=item, previous_item_id=prev))
        out.append(
            self._event(
                "response.content_part.added",
                content_index=0,
                part=self._part(False),
                **self._ids(),
            )
        )
        return out

    def _chunk(self, ev: Chunk) -> list[bytes]:
        s = self.s
        if ev.modality == "text" and ev.stage == s.text_stage and ev.text:
            kind = (
                "response.output_audio_transcript.delta"
                if self.audio
                else "response.output_text.delta"
            )
            return [self._event(kind, content_index=0, delta=ev.text, **self._ids())]
        if ev.modality == "audio" and ev.stage == s.audio_stage and self.audio:
            arr = s.chunk_audio(ev)
            if arr is None or arr.size == 0:
                return []
            pcm = to_pcm16(arr)
            self.audio_bytes += len(pcm)
            return [
                self._event(
                    "response.output_audio.delta", content_index=0, delta=b64(pcm), **self._ids()
                )
            ]
        return []

    def usage(self) -> Usage:
        p, c = self.s.usage()
        return Usage(
            total_tokens=p + c,
            input_tokens=p,
            output_tokens=c,
            input_token_details=UsageDetails(text_tokens=p),
            output_token_details=UsageDetails(text_tokens=c),
        )

    def _end(self, ev: Finished | Failed | Cancelled | Rejected) -> list[bytes]:
        self.done = True
        self.s.terminal = ev
        self.status, details = _status(ev, self.s)
        out: list[bytes] = []
        if not isinstance(ev, Rejected):
            ids = self._ids()
            text = self.text
            if self.audio:
                out.append(self._event("response.output_audio.done", content_index=0, **ids))
                out.append(
                    self._event(
                        "response.output_audio_transcript.done",
                        content_index=0,
                        transcript=text,
                        **ids,
                    )
                )
            else:
                out.append(
                    self._event("response.output_text.done", content_index=0, text=text, **ids)
                )
            out.append(
                self._event(
                    "response.content_part.done", content_index=0, part=self._part(True), **ids
                )
            )
            item = self.item(_item_status(self.status))
            out.append(self._event("response.output_item.done", item=item, **_less(ids)))
            if self.opts.conversation:
                prev = self.opts.previous_item or None
                out.append(self._event("conversation.item.done", item=item, previous_item_id=prev))
        response = self._response(self.status, details, self.usage())
        out.append(self._event("response.done", response=response))
        return out


def _item_status(status: str) -> str:
    return "completed" if status == "completed" else "incomplete"


def _less(ids: dict[str, Any]) -> dict[str, Any]:
    """The ids of an output item event (it has no ``item_id`` of its own)."""
    return {k: v for k, v in ids.items() if k != "item_id"}
