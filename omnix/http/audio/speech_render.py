"""Speech's bytes, as a pure function of the request's events.

Owns: the whole audio file (``whole``), and the streams (``SpeechStream``):
``stream_format="audio"``, the encoded bytes as they are produced (a
request that fails mid-stream has its connection cut, so the truncated
file cannot look complete); ``"sse"``, ``speech.audio.delta`` events with
base64 bytes of the same encoded stream, then ``speech.audio.done`` with
usage (or a ``{"type": "error"}`` event); which SSE events carry ``id:``;
and a batch's JSON answer (``batch``: each item's file as ``whole``
renders it, base64, or the error its request ended with).

Does not own the dispatch over APIs nor the entry points
(``omnix.http.render``).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from omnix.events.options import SpeechOptions
from omnix.events.types import Admitted, Cancelled, Chunk, Failed, Finished, Progress
from omnix.http.audio.protocol import (
    SpeechAudioDelta,
    SpeechAudioDone,
    SpeechBatchResponse,
    SpeechBatchResult,
    SpeechUsage,
)
from omnix.http.common.audio import MEDIA_TYPES, StreamEncoder, encode_audio
from omnix.http.common.rendering import (
    Head,
    Rendered,
    b64,
    sse,
    terminal_error,
    typed_sse_error,
)
from omnix.http.common.summary import RequestSummary


def whole(s: RequestSummary) -> Rendered:
    fmt = s.audio_format
    data = encode_audio(s.all_audio(), s.sample_rate, fmt)
    return Rendered(
        Head(200, (("Content-Type", MEDIA_TYPES[fmt]), ("X-Request-Id", s.request_id))), data
    )


def batch(batch_id: str, items: Sequence[RequestSummary]) -> SpeechBatchResponse:
    """The batch's answer from its items' requests, ended, in item order."""
    results = []
    for i, s in enumerate(items):
        if s.terminal is None:
            raise ValueError(f"request {s.request_id} has no terminal event: cannot render it yet")
        err = terminal_error(s.terminal)
        if err is not None:
            message = msgspec.json.decode(err[1])["error"]["message"]
            results.append(
                SpeechBatchResult(index=i, status="error", request_id=s.request_id, error=message)
            )
            continue
        p, c = s.usage()
        results.append(
            SpeechBatchResult(
                index=i,
                status="success",
                request_id=s.request_id,
                audio_data=b64(whole(s).body),
                media_type=MEDIA_TYPES[s.audio_format],
                usage=SpeechUsage(input_tokens=p, output_tokens=c, total_tokens=p + c),
            )
        )
    ok = sum(r.status == "success" for r in results)
    return SpeechBatchResponse(
        id=batch_id, results=results, total=len(results), succeeded=ok, failed=len(results) - ok
    )


def stream_ids(opts: SpeechOptions) -> bool:
    """Whether the stream's SSE events carry ``id:`` (render version 2 on;
    a raw audio stream has no events)."""
    return opts.render != 1 and opts.stream_format == "sse"


def stream_head(s: RequestSummary, opts: SpeechOptions) -> Head:
    sse_ = opts.stream_format == "sse"
    ctype = "text/event-stream" if sse_ else MEDIA_TYPES[s.audio_format]
    extra = (("Cache-Control", "no-cache"),) if sse_ else ()
    return Head(
        200, (("Content-Type", ctype), *extra, ("X-Request-Id", s.request_id)), streamed=True
    )


class SpeechStream:
    """One request's streamed speech."""

    def __init__(self, s: RequestSummary, opts: SpeechOptions) -> None:
        self.s = s
        self.sse = opts.stream_format == "sse"
        self.audio_stage = opts.audio_stage
        self.encoder = StreamEncoder(s.audio_format, s.sample_rate)
        self.aborted = False

    def _out(self, data: bytes) -> list[bytes]:
        if not data:
            return []
        return [sse(SpeechAudioDelta(audio=b64(data)))] if self.sse else [data]

    def admitted(self, ev: Admitted) -> list[bytes]:
        return []

    def chunk(self, ev: Chunk) -> list[bytes]:
        if ev.stage == self.audio_stage and ev.modality == "audio":
            arr = self.s.chunk_audio(ev)
            return self._out(self.encoder.write(arr)) if arr is not None else []
        return []

    def progress(self, ev: Progress) -> list[bytes]:
        return []  # no steps to show

    def finished(self, ev: Finished) -> list[bytes]:
        out = self._out(self.encoder.finish())
        if self.sse:
            p, c = self.s.usage()
            usage = SpeechUsage(input_tokens=p, output_tokens=c, total_tokens=p + c)
            out.append(sse(SpeechAudioDone(usage=usage)))
        return out

    def ended(self, ev: Failed | Cancelled) -> list[bytes]:
        if self.sse:
            return [typed_sse_error(ev)]
        self.aborted = True  # a truncated file must not look complete
        return []
