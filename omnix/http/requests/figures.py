"""The figures a person asks of one request, from the times its log recorded.

Owns ``Figures`` (and ``StageFigures``), the body of
``GET /v1/requests/{id}/figures``, and ``figures``: a pure function of the
request's folded state and the audio samples of its chunks, so every
figure is a difference of two ``ts_ns`` the log holds (never a client's
clock), as ``/metrics`` computes the same ones over all requests: time to
first token, to first audio and first image, end to end, the real-time
factor (time from admission to the end over the seconds of audio made),
and per stage its queue time, its first chunk, its run and its output
tokens per second.  A running request has the figures it has so far.

Does not own reading the log (``router.py``) nor the stage that makes the
pipeline's audio (``telemetry.setup.sample_rate_of``).
"""

from __future__ import annotations

import msgspec

from omnix.events.state import RequestState, StageState

_MS = 1e6


class StageFigures(msgspec.Struct, frozen=True):
    name: str
    status: str
    #: routed to started (waiting for a slot of the replica)
    queue_ms: float | None
    #: admission to this stage's first chunk
    first_chunk_ms: float | None
    #: started to finished (to its last chunk while it runs)
    run_ms: float | None
    output_tokens: int
    #: output tokens over started to finished (or its last chunk)
    tokens_per_s: float | None


class Figures(msgspec.Struct, frozen=True):
    request_id: str
    status: str
    #: the log's time of the admission, nanoseconds (the others count from it)
    admitted_ts_ns: int
    ttft_ms: float | None
    time_to_first_audio_ms: float | None
    time_to_first_image_ms: float | None
    #: admission to the terminal event; None while it runs
    e2e_ms: float | None
    audio_s: float
    #: e2e over audio_s, once it finished with audio
    rtf: float | None
    stages: tuple[StageFigures, ...]


def _since(ts: int, t0: int) -> float | None:
    return (ts - t0) / _MS if ts else None


def _stage(st: StageState, t0: int) -> StageFigures:
    end = st.finished_ts or st.last_chunk_ts
    run = (end - st.started_ts) if st.started_ts and end > st.started_ts else 0
    return StageFigures(
        name=st.name,
        status=st.status,
        queue_ms=(st.started_ts - st.routed_ts) / _MS if st.started_ts else None,
        first_chunk_ms=_since(st.first_chunk_ts, t0),
        run_ms=run / _MS if run else None,
        output_tokens=st.output_tokens,
        tokens_per_s=st.output_tokens / (run / 1e9) if run and st.output_tokens else None,
    )


def figures(rs: RequestState, audio_samples: int, sample_rate: int) -> Figures:
    """``rs``'s figures; ``audio_samples`` of its audio chunks, made at
    ``sample_rate``."""
    t0 = rs.admitted_ts
    e2e = _since(rs.terminal_ts, t0) if rs.terminal else None
    audio_s = audio_samples / sample_rate if sample_rate else 0.0
    rtf = e2e / 1e3 / audio_s if e2e is not None and audio_s and rs.status == "finished" else None
    return Figures(
        request_id=rs.request_id,
        status=rs.status,
        admitted_ts_ns=t0,
        ttft_ms=_since(rs.first_token_ts, t0),
        time_to_first_audio_ms=_since(rs.first_audio_ts, t0),
        time_to_first_image_ms=_since(rs.first_image_ts, t0),
        e2e_ms=e2e,
        audio_s=audio_s,
        rtf=rtf,
        stages=tuple(_stage(st, t0) for st in rs.stages),
    )
