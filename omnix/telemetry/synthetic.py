"""Synthetic tiny-omni-shaped event streams, for telemetry tests and benches.

Owns: ``TinyOmniShape`` and ``tiny_omni_events``, which write the events a
thinker -> talker -> code2wav request leaves in the log (streamed text,
sentence-forwarded talker input, codec frames forwarded to code2wav every
few frames, audio chunks with ``BlobRef`` shapes), legal for the reducer,
with explicit timestamps; ``worker_events`` for the replicas.

Does not own the real orchestrator's decisions: the order here is a
plausible one (what an orchestrator could append), not the one it does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from omnix.events.types import (
    Admitted,
    BlobRef,
    Cancelled,
    CancelRequested,
    Chunk,
    Event,
    Failed,
    Finished,
    RequestSpec,
    Routed,
    StageFinished,
    StageStarted,
    WorkerJoined,
    WorkerLost,
)

MS = 1_000_000
STAGES = ("thinker", "talker", "code2wav")

Outcome = Literal["finished", "cancelled", "failed"]
#: (milliseconds, tie-break, event): an event before it has its timestamp
Timed = tuple[float, int, Event]


@dataclass(frozen=True)
class TinyOmniShape:
    """How big a request is and how fast each stage goes (milliseconds)."""

    text_tokens: int = 48  # thinker chunks (one token each)
    sentence_every: int = 12  # thinker tokens per talker input piece
    codec_frames: int = 96  # talker chunks (one frame of 8 codes each)
    codec_every: int = 8  # talker frames per code2wav input piece
    samples_per_frame: int = 320  # 24 kHz: 320 samples = 13.3 ms of audio
    prompt_tokens: int = 20
    ttft_ms: float = 5.0
    token_ms: float = 2.0
    frame_ms: float = 1.0
    decode_ms: float = 2.0

    @property
    def events_per_request(self) -> int:
        talker_pieces = -(-self.text_tokens // self.sentence_every)
        wav_pieces = -(-self.codec_frames // self.codec_every)
        return (
            1  # admitted
            + 3 + self.text_tokens  # routed, started, chunks, finished
            + talker_pieces + 2 + self.codec_frames
            + 2 * wav_pieces + 2
            + 1  # finished
        )  # fmt: skip


def worker_events(stages: tuple[str, ...] = STAGES, replicas: int = 1) -> list[Event]:
    return [
        WorkerJoined(
            worker_id=f"{stage}/{r}", stage=stage, replica=r, engine="scripted", capacity=8
        )
        for stage in stages
        for r in range(replicas)
    ]


def tiny_omni_events(
    request_id: str,
    t0_ns: int,
    base_pos: int,
    shape: TinyOmniShape | None = None,
    *,
    outcome: Outcome = "finished",
    stop_after_tokens: int = 20,
    traceparent: str = "",
    pipeline: str = "tiny-omni",
    replica: int = 0,
) -> list[Event]:
    """The events of one request, in log order, with ``ts_ns`` set.

    ``base_pos`` is the log position the first event will get (causes refer
    to positions).  ``cancelled``: the client cancels after
    ``stop_after_tokens`` thinker tokens and the active stages acknowledge.
    ``failed``: the code2wav replica is lost after its first audio chunk.
    """
    s = shape or TinyOmniShape()
    rid = request_id
    tl = _Timeline(rid, replica)
    spec = RequestSpec(
        prompt="hello",
        outputs=("text", "audio"),
        api="chat.completions",
        model=pipeline,
        traceparent=traceparent,
        seed=7,
    )
    tl.at(0.0, Admitted(request_id=rid, pipeline=pipeline, spec=spec))
    tl.at(
        0.0,
        Routed(
            request_id=rid, stage="thinker", replica=replica, seq=0, sources=(base_pos,), last=True
        ),
    )
    text_ts = tl.thinker(s)
    frame_ts = tl.talker(s, text_ts)
    wav_end = tl.code2wav(s, frame_ts)
    tl.at(wav_end, Finished(request_id=rid))

    timed = sorted(tl.timed, key=lambda x: (x[0], x[1]))
    if outcome == "cancelled":
        timed = _cancel(timed, rid, stop_after_tokens)
    elif outcome == "failed":
        timed = _fail(timed, rid, replica)
    out: list[Event] = []
    for ms, _, ev in timed:
        ev = _with(ev, ts_ns=t0_ns + round(ms * MS))
        if isinstance(ev, (Routed, CancelRequested, Cancelled, Failed, Finished)) and ev.cause < -1:
            # a placeholder: -(2 + index) of the cause in ``timed``
            ev = _with(ev, cause=base_pos + (-ev.cause - 2))
        out.append(ev)
    return out


class _Timeline:
    """One request's events at their times (ms after admission), each
    stage's written by its method; the order added breaks ties."""

    def __init__(self, rid: str, replica: int) -> None:
        self.rid = rid
        self.replica = replica
        self.timed: list[Timed] = []

    def at(self, ms: float, ev: Event) -> None:
        self.timed.append((ms, len(self.timed), ev))

    def thinker(self, s: TinyOmniShape) -> list[float]:
        """Started, one text chunk per token, finished; the chunks' times."""
        rid, replica, at = self.rid, self.replica, self.at
        at(1.0, StageStarted(request_id=rid, stage="thinker", replica=replica))
        text_ts = [s.ttft_ms + i * s.token_ms for i in range(s.text_tokens)]
        for i, t in enumerate(text_ts):
            at(t, Chunk(request_id=rid, stage="thinker", replica=replica, index=i,
                        modality="text", text=f"t{i} ", token_ids=(100 + i,)))  # fmt: skip
        thinker_end = text_ts[-1] + 0.5
        at(thinker_end, StageFinished(request_id=rid, stage="thinker", replica=replica,
                                      chunks=s.text_tokens, prompt_tokens=s.prompt_tokens,
                                      output_tokens=s.text_tokens))  # fmt: skip
        return text_ts

    def talker(self, s: TinyOmniShape, text_ts: list[float]) -> list[float]:
        """One input piece per sentence of thinker text, a codec frame per
        chunk; the chunks' times."""
        rid, replica, at = self.rid, self.replica, self.at
        pieces = list(range(s.sentence_every - 1, s.text_tokens, s.sentence_every))
        if not pieces or pieces[-1] != s.text_tokens - 1:
            pieces.append(s.text_tokens - 1)
        for k, tok in enumerate(pieces):
            at(text_ts[tok] + 0.1, Routed(request_id=rid, stage="talker", replica=replica, seq=k,
                                          sources=(), last=k == len(pieces) - 1))  # fmt: skip
        talker_start = text_ts[pieces[0]] + 1.0
        at(talker_start, StageStarted(request_id=rid, stage="talker", replica=replica))
        frame_ts = [talker_start + 2.0 + j * s.frame_ms for j in range(s.codec_frames)]
        for j, t in enumerate(frame_ts):
            at(t, Chunk(request_id=rid, stage="talker", replica=replica, index=j,
                        modality="codec", token_ids=(1, 2, 3, 4, 5, 6, 7, 8)))  # fmt: skip
        talker_end = max(frame_ts[-1], text_ts[-1] + 0.1) + 0.5
        at(talker_end, StageFinished(request_id=rid, stage="talker", replica=replica,
                                     chunks=s.codec_frames, prompt_tokens=s.text_tokens,
                                     output_tokens=s.codec_frames))  # fmt: skip
        return frame_ts

    def code2wav(self, s: TinyOmniShape, frame_ts: list[float]) -> float:
        """Every ``codec_every`` frames one piece and one audio chunk; when
        the stage finished."""
        rid, replica, at = self.rid, self.replica, self.at
        groups = list(range(s.codec_every - 1, s.codec_frames, s.codec_every))
        if not groups or groups[-1] != s.codec_frames - 1:
            groups.append(s.codec_frames - 1)
        prev = -1
        audio_ts = []
        for m, last_frame in enumerate(groups):
            routed_t = frame_ts[last_frame] + 0.2
            at(routed_t, Routed(request_id=rid, stage="code2wav", replica=replica, seq=m,
                                sources=(), last=m == len(groups) - 1))  # fmt: skip
            if m == 0:
                at(routed_t + 0.3, StageStarted(request_id=rid, stage="code2wav", replica=replica))
            n = (last_frame - prev) * s.samples_per_frame
            prev = last_frame
            t = routed_t + s.decode_ms
            audio_ts.append(t)
            ref = BlobRef(digest=f"{m:032x}", nbytes=4 * n, dtype="<f4", shape=(n,))
            at(t, Chunk(request_id=rid, stage="code2wav", replica=replica, index=m,
                        modality="audio", blob=ref))  # fmt: skip
        wav_end = audio_ts[-1] + 0.5
        at(wav_end, StageFinished(request_id=rid, stage="code2wav", replica=replica,
                                  chunks=len(groups)))  # fmt: skip
        return wav_end


def _with(ev: Event, **kw: object) -> Event:
    import msgspec

    return msgspec.structs.replace(ev, **kw)


def _cancel(timed: list[Timed], rid: str, after_tokens: int) -> list[Timed]:
    """Cut the stream at the ``after_tokens``-th thinker token; cancel."""
    out = []
    seen = 0
    for item in timed:
        _ms, _, ev = item
        out.append(item)
        if isinstance(ev, Chunk) and ev.stage == "thinker":
            seen += 1
            if seen == after_tokens:
                break
    cut_ms = out[-1][0]
    state: dict[str, tuple[int, int]] = {}  # stage -> (replica, chunks)
    for _, _, ev in out:
        if isinstance(ev, Routed):
            state.setdefault(ev.stage, (ev.replica, 0))
        elif isinstance(ev, Chunk):
            state[ev.stage] = (ev.replica, state[ev.stage][1] + 1)
        elif isinstance(ev, StageFinished):
            state.pop(ev.stage, None)
    cancel_idx = len(out)
    out.append((cut_ms + 0.5, 0, CancelRequested(request_id=rid, reason="client")))
    for k, (stage, (rep, chunks)) in enumerate(state.items()):
        out.append((cut_ms + 1.0 + 0.1 * k, 0, StageFinished(
            request_id=rid, stage=stage, replica=rep, chunks=chunks, finish_reason="aborted")))  # fmt: skip
    out.append(
        (cut_ms + 1.5, 0, Cancelled(request_id=rid, reason="client", cause=-(2 + cancel_idx)))
    )
    return out


def _fail(timed: list[Timed], rid: str, replica: int) -> list[Timed]:
    """Lose the code2wav replica right after its first audio chunk."""
    out = []
    for item in timed:
        _ms, _, ev = item
        out.append(item)
        if isinstance(ev, Chunk) and ev.stage == "code2wav":
            break
    cut_ms = out[-1][0]
    lost_idx = len(out)
    out.append((cut_ms + 0.5, 0, WorkerLost(
        worker_id=f"code2wav/{replica}", stage="code2wav", replica=replica, reason="exit")))  # fmt: skip
    out.append((cut_ms + 0.5, 0, Failed(
        request_id=rid, reason="stage_lost", stage="code2wav",
        message="code2wav replica lost", cause=-(2 + lost_idx))))  # fmt: skip
    return out
