"""Transcriptions' bytes, as a pure function of the request's events.

Owns: the whole transcription (``whole``: ``json``, ``text`` or
``verbose_json``, whose one segment covers the clip, its length read from
the decoded samples the spec references) and the stream
(``TranscriptionStream``: a ``transcript.text.delta`` event per text
chunk, then ``transcript.text.done`` with the whole text and usage, as
OpenAI streams it, no ``[DONE]``; a request that fails or is cancelled
mid-stream ends with a ``{"type": "error"}`` event).  Every SSE event
carries ``id:`` from render version 2 on.

Does not own the dispatch over APIs nor the entry points
(``omnix.http.render``).
"""

from __future__ import annotations

from typing import Any

from omnix.events.options import TranscriptionOptions
from omnix.events.types import Admitted, Cancelled, Chunk, Failed, Finished, Progress, RequestSpec
from omnix.http.audio.protocol import (
    DurationUsage,
    Transcription,
    TranscriptionSegment,
    TranscriptionUsage,
    TranscriptionVerbose,
    TranscriptTextDelta,
    TranscriptTextDone,
)
from omnix.http.common.rendering import Head, Rendered, encode, json_head, sse, typed_sse_error
from omnix.http.common.summary import RequestSummary


def _usage(s: RequestSummary) -> TranscriptionUsage:
    p, c = s.usage()
    return TranscriptionUsage(input_tokens=p, output_tokens=c, total_tokens=p + c)


def _clip_seconds(spec: RequestSpec) -> float:
    """The transcribed clip's length, from the decoded samples the spec
    references (their count over their rate)."""
    for m in spec.messages:
        for part in m.media:
            if part.kind == "audio" and part.rate and part.blob.shape:
                return part.blob.shape[0] / part.rate
    return 0.0


def whole(s: RequestSummary, opts: TranscriptionOptions) -> Rendered:
    spec = s.spec
    assert spec is not None
    text = "".join(s.text)
    rid = s.request_id
    if opts.response_format == "text":
        head = Head(200, (("Content-Type", "text/plain; charset=utf-8"), ("X-Request-Id", rid)))
        return Rendered(head, text.encode())
    body: Any
    if opts.response_format == "verbose_json":
        seconds = _clip_seconds(spec)
        segment = TranscriptionSegment(
            id=0,
            seek=0,
            start=0.0,
            end=seconds,
            text=text,
            tokens=s.token_ids,
            temperature=opts.temperature,
        )
        body = TranscriptionVerbose(
            language=opts.language or "unknown",
            duration=seconds,
            text=text,
            segments=[segment],
            usage=DurationUsage(seconds=seconds),
            request_ids=[rid],
        )
    else:
        body = Transcription(text=text, usage=_usage(s), request_ids=[rid])
    return Rendered(json_head(200, [rid]), encode(body))


def stream_ids(opts: TranscriptionOptions) -> bool:
    return opts.render != 1


class TranscriptionStream:
    """One request's ``transcript.text.*`` SSE stream."""

    aborted = False

    def __init__(self, s: RequestSummary, opts: TranscriptionOptions) -> None:
        self.s = s
        self.text_stage = opts.text_stage

    def admitted(self, ev: Admitted) -> list[bytes]:
        return []

    def chunk(self, ev: Chunk) -> list[bytes]:
        if ev.stage == self.text_stage and ev.modality == "text" and ev.text:
            return [sse(TranscriptTextDelta(delta=ev.text))]
        return []

    def progress(self, ev: Progress) -> list[bytes]:
        return []  # no steps to show

    def finished(self, ev: Finished) -> list[bytes]:
        return [sse(TranscriptTextDone(text="".join(self.s.text), usage=_usage(self.s)))]

    def ended(self, ev: Failed | Cancelled) -> list[bytes]:
        return [typed_sse_error(ev)]
