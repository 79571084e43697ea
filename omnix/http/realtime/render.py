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

A response that may call a function (its text stage given tools, a
choice other than ``none``) announces its message item only at the
answer's first text or audio (or at its end, if it called nothing), and
each call the stage's parser reads as an item of its own, in the order
they begin, its id the message item's with ``_<n>``:

    response.output_item.added (a ``function_call``: call_id, name,
      arguments "") -> conversation.item.added
      -> response.function_call_arguments.delta, as the arguments come
      -> (at the end) response.function_call_arguments.done
      -> response.output_item.done -> conversation.item.done

A cancelled response (``response.cancel``, or the user speaking over it)
sends no delta after its ``cancel_requested`` event, whatever its stages
still deliver before they stop, and ends with ``response.done`` (status
``cancelled``); one that ran out of ``max_output_tokens`` is
``incomplete``; a failed or refused one ``failed``, its error in
``status_details``.  A call of a response that did not complete ends
with its ``response.output_item.done`` alone (status ``incomplete``, the
arguments sent so far): no ``function_call_arguments.done`` says its
arguments are whole, which a client would call the function with (render
1, before that, sent one).  Event ids derive from log positions (``event_<pos>``,
``event_<pos>_<k>`` for the k-th event one log event makes), so a replay
renders the same messages.  A response of a pipeline that only speaks
reads its prompt aloud (``respond.py``): its transcript is that text,
sent whole before the audio.  A session's transcription request (``spec.api``
``audio.transcriptions``) renders as its transcription events
(``transcript.py``), so that every request of a session renders here.

Does not own the session's own events (``session.py``), reading the log
nor the socket (``connection.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
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
    ToolCallDelta,
)
from omnix.http.common.audio import to_pcm16
from omnix.http.common.rendering import b64
from omnix.http.common.summary import RequestSummary
from omnix.http.realtime.protocol import (
    AnyItem,
    AudioOutputOut,
    Content,
    FunctionCallItem,
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


def _status(
    ev: Finished | Failed | Cancelled | Rejected, s: RequestSummary, usage_stage: str
) -> tuple[str, Any]:
    """The response's final status and status_details (``max_output_tokens``
    bounds the usage stage: the text stage, or the talker reading aloud)."""
    if isinstance(ev, Finished):
        usage = s.finished.get(usage_stage)
        if (usage.finish_reason if usage is not None else s.finish_reason()) == "length":
            return "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
        return "completed", None
    if isinstance(ev, Cancelled):
        reason = _CANCEL_REASON.get(ev.reason, "client_cancelled")
        return "cancelled", {"type": "cancelled", "reason": reason}
    return "failed", {"type": "failed", "error": failure(ev)}


@dataclass(slots=True)
class _Output:
    """One output item of a response: its message (``call`` None) or a
    function call, its arguments so far."""

    item_id: str
    call: ToolCallDelta | None = None
    arguments: str = ""


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
        #: the output items announced so far, in output order
        self.outputs: list[_Output] = []
        self._calls: dict[int, _Output] = {}
        #: the model may call a function: the message item waits for the
        #: answer's first text or audio (a response that only calls has none)
        self.calls = False
        #: a pipeline that only speaks: the text it reads aloud (its transcript)
        self.spoken = ""

    @property
    def ids(self) -> list[str]:
        """The event ids of what the last ``feed`` returned, in order."""
        return self.transcript.ids if self.transcript is not None else self.frames.ids

    @property
    def text(self) -> str:
        return "".join(self.s.text) if not self.spoken else self.spoken

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

    @property
    def _message(self) -> _Output | None:
        return next((o for o in self.outputs if o.call is None), None)

    def _ids(self) -> dict[str, Any]:
        msg = self._message
        at = self.outputs.index(msg) if msg is not None else 0
        return {"response_id": self.rid, "item_id": self.opts.item, "output_index": at}

    def _part(self, final: bool) -> Content:
        if self.audio:
            return Content(type="audio", transcript=self.text if final else "")
        return Content(type="text", text=self.text if final else "")

    def item(self, status: str) -> Item:
        """The response's message item, as it stands."""
        content: list[Content] = []
        if status != "in_progress":
            text = self.text
            content = [
                Content(type="output_audio", transcript=text)
                if self.audio
                else Content(type="output_text", text=text)
            ]
        return Item(id=self.opts.item, status=status, role="assistant", content=content)

    def _call_item(self, out: _Output, status: str) -> FunctionCallItem:
        assert out.call is not None
        args = out.arguments if status != "in_progress" else ""
        return FunctionCallItem(
            id=out.item_id,
            status=status,
            call_id=out.call.id,
            name=out.call.name,
            arguments=args,
        )

    def call_ids(self) -> set[str]:
        """The call ids of the function calls announced so far."""
        return {o.call.id for o in self.outputs if o.call is not None}

    def items(self, status: str) -> list[AnyItem]:
        """The response's output items as they stand (``status``: the
        items'), in output order: its message (if it has one) and calls."""
        return [
            self.item(status) if o.call is None else self._call_item(o, status)
            for o in self.outputs
        ]

    def _response(self, status: str, details: Any = None, usage: Usage | None = None) -> Any:
        o = self.opts
        audio = None
        if self.audio:
            audio = ResponseAudioConfig(output=AudioOutputOut(voice=o.voice or "default"))
        output = self.items(item_status(status)) if status != "in_progress" else []
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

    def _previous(self) -> str | None:
        """The item before the next output item in the conversation."""
        if self.outputs:
            return self.outputs[-1].item_id
        return self.opts.previous_item or None

    def _added(self, out: _Output, item: AnyItem) -> list[bytes]:
        """An output item announced (and added to the conversation)."""
        prev = self._previous()
        self.outputs.append(out)
        at = len(self.outputs) - 1
        frames = [
            self._event(
                "response.output_item.added", response_id=self.rid, output_index=at, item=item
            )
        ]
        if self.opts.conversation:
            frames.append(self._event("conversation.item.added", item=item, previous_item_id=prev))
        return frames

    def _open_message(self) -> list[bytes]:
        if self._message is not None:
            return []
        out = self._added(_Output(self.opts.item), self.item("in_progress"))
        out.append(
            self._event(
                "response.content_part.added",
                content_index=0,
                part=self._part(False),
                **self._ids(),
            )
        )
        return out

    def _admitted(self, ev: Admitted | Rejected, parts: bool = True) -> list[bytes]:
        opts = ev.spec.response
        if not isinstance(opts, RealtimeOptions):
            raise ValueError(f"request {ev.request_id} is not a realtime response")
        self.opts, self.rid = opts, ev.request_id
        if not opts.text_stage and self.audio:
            self.spoken = ev.spec.prompt
        params = ev.spec.stage_params.get(opts.usage_stage)
        self.calls = params is not None and bool(params.tools) and params.tool_choice != '"none"'
        out = [self._event("response.created", response=self._response("in_progress"))]
        if parts and not self.calls:
            out += self._open_message()
            if self.spoken:  # read aloud: its transcript is known whole
                out.append(
                    self._event(
                        "response.output_audio_transcript.delta",
                        content_index=0,
                        delta=self.spoken,
                        **self._ids(),
                    )
                )
        return out

    def _chunk(self, ev: Chunk) -> list[bytes]:
        s = self.s
        if ev.modality == "text" and ev.stage == s.text_stage:
            out = self._call_pieces(ev.tool_calls) if ev.tool_calls else []
            if ev.text:
                kind = (
                    "response.output_audio_transcript.delta"
                    if self.audio
                    else "response.output_text.delta"
                )
                out += self._open_message()
                out.append(self._event(kind, content_index=0, delta=ev.text, **self._ids()))
            return out
        if ev.modality == "audio" and ev.stage == s.audio_stage and self.audio:
            arr = s.chunk_audio(ev)
            if arr is None or arr.size == 0:
                return []
            pcm = to_pcm16(arr)
            self.audio_bytes += len(pcm)
            out = self._open_message()
            out.append(
                self._event(
                    "response.output_audio.delta", content_index=0, delta=b64(pcm), **self._ids()
                )
            )
            return out
        return []

    def _call_pieces(self, pieces: tuple[ToolCallDelta, ...]) -> list[bytes]:
        """A function call's item announced at its first piece, then its
        arguments as they come."""
        out: list[bytes] = []
        for p in pieces:
            call = self._calls.get(p.index)
            if call is None:
                if not p.id:  # a piece of a call begun before a cancel: not shown
                    continue
                call = self._calls[p.index] = _Output(f"{self.opts.item}_{p.index + 1}", p)
                out += self._added(call, self._call_item(call, "in_progress"))
            if p.arguments:
                call.arguments += p.arguments
                out.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        response_id=self.rid,
                        item_id=call.item_id,
                        output_index=self.outputs.index(call),
                        call_id=call.call.id if call.call is not None else p.id,
                        delta=p.arguments,
                    )
                )
        return out

    def usage(self) -> Usage:
        p, c = self.s.usage()
        return Usage(
            total_tokens=p + c,
            input_tokens=p,
            output_tokens=c,
            input_token_details=UsageDetails(text_tokens=p),
            output_token_details=UsageDetails(text_tokens=c),
        )

    def _message_done(self, st: str) -> list[bytes]:
        ids = self._ids()
        text = self.text
        out: list[bytes] = []
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
            out.append(self._event("response.output_text.done", content_index=0, text=text, **ids))
        out.append(
            self._event("response.content_part.done", content_index=0, part=self._part(True), **ids)
        )
        out += self._item_done(self.item(st), ids["output_index"])
        return out

    def _call_done(self, call: _Output, st: str) -> list[bytes]:
        assert call.call is not None
        at = self.outputs.index(call)
        out = []
        if st == "completed" or self.opts.render < 2:
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    response_id=self.rid,
                    item_id=call.item_id,
                    output_index=at,
                    call_id=call.call.id,
                    name=call.call.name,
                    arguments=call.arguments,
                )
            )
        return out + self._item_done(self._call_item(call, st), at)

    def _item_done(self, item: AnyItem, at: int) -> list[bytes]:
        out = [
            self._event(
                "response.output_item.done", response_id=self.rid, output_index=at, item=item
            )
        ]
        if self.opts.conversation:
            prev = self.outputs[at - 1].item_id if at else self.opts.previous_item or None
            out.append(self._event("conversation.item.done", item=item, previous_item_id=prev))
        return out

    def _end(self, ev: Finished | Failed | Cancelled | Rejected) -> list[bytes]:
        self.done = True
        self.s.terminal = ev
        self.status, details = _status(ev, self.s, self.opts.usage_stage)
        out: list[bytes] = []
        if not isinstance(ev, Rejected):
            if not self.outputs:  # no call was made: the (maybe empty) answer is the item
                out += self._open_message()
            st = item_status(self.status)
            for o in self.outputs:
                out += self._message_done(st) if o.call is None else self._call_done(o, st)
        response = self._response(self.status, details, self.usage())
        out.append(self._event("response.done", response=response))
        return out


def item_status(status: str) -> str:
    """An output item's status when its response ended so."""
    return "completed" if status == "completed" else "incomplete"
