"""A full-duplex session's server events, rendered from its request's events.

Owns ``DuplexStream``: feed it the session's request events in log order
(``DuplexOptions`` in its admission) and it returns the server events they
make, as vLLM-Omni's duplex projection of a continuous stream sends them:
the whole session is one response (``response_id``) and one assistant item;
the first frame opens them (``response.created``,
``conversation.item.added`` / ``.created``, ``response.output_item.added``,
``response.content_part.added``, ``response.speak``); every model frame is
one ``response.output_audio.delta`` (80 ms of 24 kHz PCM in the session's
output format) and one ``response.output_audio_transcript.delta`` (the text
its text token adds, often ""); the request's end closes them
(``response.output_audio.done``, ``...transcript.done``,
``response.content_part.done``, ``response.output_item.done``,
``conversation.item.done``, ``response.done``: ``completed`` with reason
``stream_drained`` when the input ended and every frame was answered,
``incomplete`` at the model's context, ``cancelled``, or ``failed``; then
``rate_limits.updated``).

Everything is a function of the log: event ids ``event_<pos>[_<k>]`` and
each event's ``server_event_seq``, ``SEQ_STRIDE`` per frame (frame ``k``'s
events from ``SEQ_STRIDE * (k + 1)``, the closing ones after the last
frame's), so a client that comes back after a restart, whose server
rendered them again, is sent exactly what follows the last seq it had.

Does not own the session's own events (``session.py``: ``session.*``,
errors, acknowledgements) nor sending (``connection.py``).
"""

from __future__ import annotations

from typing import Any, Final

from omnix.events.blobs import BlobStore
from omnix.events.options import DuplexOptions
from omnix.events.types import (
    Admitted,
    Cancelled,
    Chunk,
    Event,
    Failed,
    Finished,
    StageFinished,
)
from omnix.http.realtime.duplex.audio import encode
from omnix.http.realtime.duplex.config import FRAME_MS
from omnix.http.realtime.duplex.protocol import server_event

#: ``server_event_seq``s a frame's events may use (the first frame's, with
#: the opening events, are the most: 8).
SEQ_STRIDE: Final = 16


class DuplexStream:
    """One session's server events (see the module's docstring)."""

    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs
        self.opts: DuplexOptions | None = None
        self.session = ""
        #: model frames rendered so far
        self.frames = 0
        self.done = False
        #: the ids, seqs and types of the events the last ``feed`` made
        self.ids: list[str] = []
        self.seqs: list[int] = []
        self.types: list[str] = []
        self._transcript: list[str] = []
        self._finish = ("stop", 0, 0)  # the audio stage's reason, frames in, frames out
        self._pos = -1
        self._k = 0
        self._seq = 0

    # -- framing ------------------------------------------------------------
    def _at(self, pos: int, group: int) -> None:
        self._pos, self._k = pos, 0
        self._seq = SEQ_STRIDE * (group + 1)

    def _event(self, type_: str, **fields: Any) -> bytes:
        eid = f"event_{self._pos}" if self._k == 0 else f"event_{self._pos}_{self._k}"
        self._k += 1
        seq = self._seq
        self._seq += 1
        self.ids.append(eid)
        self.seqs.append(seq)
        self.types.append(type_)
        return server_event(type_, eid, seq, **fields)

    # -- the parts --------------------------------------------------------------
    def _item(self, status: str) -> dict[str, Any]:
        assert self.opts is not None
        content = [] if status == "in_progress" else [self._content()]
        return {
            "id": self.opts.item,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content,
        }

    def _content(self) -> dict[str, Any]:
        return {"type": "output_audio", "transcript": "".join(self._transcript)}

    def _addr(self) -> dict[str, Any]:
        assert self.opts is not None
        return {
            "response_id": self.opts.response,
            "item_id": self.opts.item,
            "output_index": 0,
            "content_index": 0,
        }

    def _response(self, status: str, details: dict[str, Any] | None) -> dict[str, Any]:
        assert self.opts is not None
        _, frames_in, frames_out = self._finish
        out = [] if status == "in_progress" else [self._item(_item_status(status))]
        response: dict[str, Any] = {
            "id": self.opts.response,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": out,
            "modalities": ["audio", "text"],
            "output_modalities": ["audio", "text"],
            "metadata": {"session_id": self.session},
        }
        if status != "in_progress":
            response["usage"] = {
                "total_tokens": frames_in + frames_out,
                "input_tokens": frames_in,
                "output_tokens": frames_out,
                "input_token_details": {"audio_tokens": frames_in, "text_tokens": 0},
                "output_token_details": {"audio_tokens": frames_out, "text_tokens": 0},
            }
        return response

    def _open(self) -> list[bytes]:
        assert self.opts is not None
        item = self._item("in_progress")
        rid = self.opts.response
        return [
            self._event(
                "response.created", response_id=rid, response=self._response("in_progress", None)
            ),
            self._event("conversation.item.added", previous_item_id=None, item=item),
            self._event("conversation.item.created", previous_item_id=None, item=item),
            self._event("response.output_item.added", response_id=rid, output_index=0, item=item),
            self._event(
                "response.content_part.added",
                **self._addr(),
                part={"type": "audio", "transcript": ""},
            ),
            self._event(
                "response.speak",
                **self._addr(),
                metadata={"session_id": self.session, "epoch": 0, "model_speak": True},
            ),
        ]

    def _frame(self, ev: Chunk) -> list[bytes]:
        assert self.opts is not None
        self._at(ev.pos, ev.index)
        out = self._open() if ev.index == 0 else []
        pcm = self.blobs.get_array(ev.blob) if ev.blob is not None else None
        delta = "" if pcm is None else encode(pcm, self.opts.output_format)
        self._transcript.append(ev.text)
        out.append(
            self._event(
                "response.output_audio.delta",
                **self._addr(),
                delta=delta,
                format=self.opts.output_format,
                sample_rate_hz=self.opts.sample_rate,
                metadata={
                    "session_id": self.session,
                    "epoch": 0,
                    "model_speak": True,
                    "end_of_turn": False,
                    "audio_duration_ms": FRAME_MS,
                    "frame": ev.index,
                    "audio_end_ms": FRAME_MS * (ev.index + 1),
                },
            )
        )
        out.append(
            self._event("response.output_audio_transcript.delta", **self._addr(), delta=ev.text)
        )
        self.frames = ev.index + 1
        return out

    def _close(self, ev: Finished | Cancelled | Failed) -> list[bytes]:
        assert self.opts is not None
        self.done = True
        if self.frames == 0:
            return []  # no frame: no response was ever opened
        self._at(ev.pos, self.frames)
        details: dict[str, Any]
        if type(ev) is Finished:
            reason = self._finish[0]
            status, details = (
                ("completed", {"type": "completed", "reason": "stream_drained"})
                if reason != "length"
                else ("incomplete", {"type": "incomplete", "reason": "max_output_tokens"})
            )
        elif type(ev) is Cancelled:
            status, details = "cancelled", {"type": "cancelled", "reason": ev.reason}
        else:
            status = "failed"
            details = {
                "type": "failed",
                "error": {"type": "server_error", "code": "session_failed", "message": ev.message},
            }
        text = "".join(self._transcript)
        rid = self.opts.response
        item = self._item(_item_status(status))
        return [
            self._event("response.output_audio.done", **self._addr()),
            self._event("response.output_audio_transcript.done", **self._addr(), transcript=text),
            self._event("response.content_part.done", **self._addr(), part=self._content()),
            self._event("response.output_item.done", response_id=rid, output_index=0, item=item),
            self._event("conversation.item.done", previous_item_id=None, item=item),
            self._event("response.done", response_id=rid, response=self._response(status, details)),
            self._event("rate_limits.updated", rate_limits=[]),
        ]

    # -- the log ------------------------------------------------------------------
    def feed(self, ev: Event) -> list[bytes]:
        self.ids = []
        self.seqs = []
        self.types = []
        if type(ev) is Admitted:
            opts = ev.spec.response
            if isinstance(opts, DuplexOptions):
                self.opts = opts
                self.session = ev.request_id
            return []
        opts = self.opts
        if opts is None or self.done:
            return []
        if type(ev) is Chunk:
            if ev.stage == opts.audio_stage and ev.modality == "audio":
                return self._frame(ev)
        elif type(ev) is StageFinished:
            if ev.stage == opts.audio_stage:
                self._finish = (ev.finish_reason, ev.prompt_tokens, ev.output_tokens)
        elif type(ev) is Finished or type(ev) is Cancelled or type(ev) is Failed:
            return self._close(ev)
        return []


def frames_through(seq: int) -> int:
    """How many model frames a client that had every event up to
    ``server_event_seq`` ``seq`` had (their audio deltas)."""
    group = seq // SEQ_STRIDE - 1
    if group < 0:
        return 0
    audio_at = SEQ_STRIDE * (group + 1) + (_OPENING if group == 0 else 0)
    return group + (1 if seq >= audio_at else 0)


#: Events before the first frame's audio delta (``_open``'s).
_OPENING: Final = 6


def _item_status(status: str) -> str:
    return {"completed": "completed", "cancelled": "cancelled"}.get(status, "incomplete")
