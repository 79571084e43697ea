"""The fused fold: ``Fold.apply_all``, the reducer's bulk path.

Owns: ``fold_runs``, which applies a sequence of events to a ``Fold`` with
the same result as ``Fold.apply`` on each in turn, faster on logs made
mostly of streamed output (replay, recovery, trace loading).  Does not own
any transition rule: every event that changes more than a stage's
counters still goes through ``Fold.apply`` (``reducer.py``), and the
property tests hold the two paths equal field for field
(``tests/events/test_properties.py``, ``tests/events/test_fold_runs.py``).

Once a stage of a request is streaming (``_run_can_open``), its next
chunks and input pieces are validated exactly as ``apply`` would but not
folded one by one: they only move counters and last-event stamps, which
fold in one step (a *run*) when an event that reads or changes them
arrives (another event of that stage or of the whole request, any worker
event) or at the end.  Events of the request's other stages fold past the
run.  On an illegal event everything before it is folded and the error
raised, as ``apply`` leaves it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, assert_never

import msgspec

from omnix.events.state import RequestState, StageState
from omnix.events.types import (
    Admitted,
    Cancelled,
    CancelRequested,
    Chunk,
    DeadlineExpired,
    Event,
    Failed,
    Finished,
    InputAppended,
    Progress,
    Rejected,
    Released,
    Routed,
    Scaled,
    SessionChanged,
    StageFailed,
    StageFinished,
    StageStarted,
    WorkerJoined,
    WorkerLost,
)

__all__ = ["FoldTarget", "fold_runs"]


class FoldTarget(Protocol):
    """What the bulk path reads and writes of a ``reducer.Fold`` (a protocol,
    so that this module does not import the reducer, which imports it)."""

    requests: dict[str, RequestState]
    audio_samples: dict[str, int]
    next_pos: int

    def apply(self, ev: Event) -> None: ...


class _Run:
    """One streaming stage of one request: its counters as validated so
    far, ahead of the state they will fold into."""

    __slots__ = (
        "chunks",
        "index",
        "input_closed",
        "last_chunk",
        "last_ts",
        "modality",
        "pieces",
        "replica",
    )

    def __init__(self, st: StageState, index: int, first: Chunk) -> None:
        self.index = index  # the stage's place in RequestState.stages
        self.replica = st.replica
        self.modality = first.modality
        self.chunks = st.chunks
        self.pieces = st.pieces
        self.input_closed = st.input_closed
        self.last_chunk: Chunk | None = None  # latest unfolded chunk
        self.last_ts: int | None = None  # latest unfolded event's time (None: nothing unfolded)


class _Runs:
    """One request's open runs (at most one per stage)."""

    __slots__ = ("by_stage", "chunks", "last", "pieces", "request_id")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.by_stage: dict[str, _Run] = {}
        self.chunks = 0  # unfolded chunks, all stages
        self.pieces = 0  # unfolded pieces, all stages
        self.last: Event | None = None  # the request's latest event since a run opened


def fold_runs(fold: FoldTarget, events: Iterable[Event]) -> None:
    """``fold.apply`` each event in order, folding streamed runs in one step."""
    runs: dict[str, _Runs] = {}
    audio = fold.audio_samples
    apply = fold.apply
    next_pos = fold.next_pos
    try:
        for ev in events:
            if type(ev) is Chunk:
                rr = runs.get(ev.request_id)
                if rr is not None:
                    run = rr.by_stage.get(ev.stage)
                    # The hot path, inline (a function call would add
                    # ~50 ns to each): a chunk that continues its stage's run.
                    if (
                        run is not None
                        and ev.replica == run.replica
                        and ev.index == run.chunks
                        and ev.modality == run.modality
                    ):
                        run.chunks += 1
                        run.last_chunk = ev
                        run.last_ts = ev.ts_ns
                        rr.chunks += 1
                        rr.last = ev
                        if run.modality == "audio":
                            blob = ev.blob
                            if blob is not None and blob.shape:
                                rid = ev.request_id
                                audio[rid] = audio.get(rid, 0) + blob.shape[0]
                        next_pos = ev.pos + 1 if ev.pos >= 0 else next_pos + 1
                        continue
                fold.next_pos = next_pos
                _apply_chunk(fold, runs, rr, ev)
                next_pos = fold.next_pos
                continue
            if type(ev) is Routed:
                # Inline too: pieces are the next most frequent events.
                rr = runs.get(ev.request_id)
                if rr is not None:
                    run = rr.by_stage.get(ev.stage)
                    if run is not None:
                        if (
                            ev.replica == run.replica
                            and ev.seq == run.pieces
                            and ev.seq
                            and not run.input_closed
                        ):
                            run.pieces += 1
                            run.input_closed = ev.last
                            run.last_ts = ev.ts_ns
                            rr.pieces += 1
                            rr.last = ev
                            next_pos = ev.pos + 1 if ev.pos >= 0 else next_pos + 1
                            continue
                        del runs[ev.request_id]  # the run breaks, as for a chunk
                        _close_runs(fold, rr)
                        rr = None
            else:
                rr = _fold_before(fold, runs, ev) if runs else None
            fold.next_pos = next_pos
            apply(ev)
            next_pos = fold.next_pos
            if rr is not None:
                rr.last = ev  # another stage's event: the request's last_pos when its runs fold
    finally:
        for rr in runs.values():
            _close_runs(fold, rr)
        fold.next_pos = next_pos


def _apply_chunk(fold: FoldTarget, runs: dict[str, _Runs], rr: _Runs | None, ev: Chunk) -> None:
    """A chunk that does not continue a run: applied, after its stage's run
    (if any) is folded; then its stage's run opens if it can."""
    rid = ev.request_id
    if rr is not None and ev.stage in rr.by_stage:
        # The run breaks (an error, or a change the full reduce must see):
        # fold it so apply() sees the truth.
        del runs[rid]
        _close_runs(fold, rr)
        rr = None
    fold.apply(ev)
    if rr is not None:
        rr.last = ev  # another stage's chunk: the request's last_pos when its runs fold
    rs = fold.requests[rid]
    i = _run_can_open(rs, ev)
    if i >= 0:
        if rr is None:
            rr = runs[rid] = _Runs(rid)
        rr.by_stage[ev.stage] = _Run(rs.stages[i], i, ev)


def _fold_before(fold: FoldTarget, runs: dict[str, _Runs], ev: Event) -> _Runs | None:
    """Fold the open runs that ``ev`` reads or changes, before it is
    applied; return its request's runs that stay open (``ev`` folds past
    them, and becomes the request's latest event when they fold).

    An event that reads and changes only the stage it names folds past
    another stage's run (that stage's state stays as it was); one about the
    whole request folds its runs first; a server event can touch any
    request, so everything folds.  The ``match`` places every kind
    (``assert_never``); the frequent ones are told apart by exact type
    before it, since each pattern it tries and misses is an ``isinstance``
    on a Struct class (~60 ns, against ~10 for ``type(ev) is X``).
    """
    if type(ev) is StageStarted or type(ev) is StageFinished:
        rid, stage = ev.request_id, ev.stage
    elif type(ev) is Admitted or type(ev) is Finished:
        _fold_request(fold, runs, ev.request_id)
        return None
    else:
        match ev:
            case Progress() | StageFailed() | Chunk() | Routed():  # (the caller takes these two)
                rid, stage = ev.request_id, ev.stage
            case (
                Rejected()
                | CancelRequested()
                | DeadlineExpired()
                | Cancelled()
                | Failed()
                | InputAppended()
            ):
                _fold_request(fold, runs, ev.request_id)
                return None
            case SessionChanged():
                return None  # about no request: every run stays open
            case WorkerJoined() | WorkerLost() | Released() | Scaled():
                for open_runs in runs.values():
                    _close_runs(fold, open_runs)
                runs.clear()
                return None
            case _:
                assert_never(ev)
    # An event of one stage: its run (if any) folds, the request's other
    # runs stay open.
    rr = runs.get(rid)
    if rr is not None and stage in rr.by_stage:
        del runs[rid]
        _close_runs(fold, rr)
        return None
    return rr


def _fold_request(fold: FoldTarget, runs: dict[str, _Runs], rid: str) -> None:
    """An event of the whole request: every run of it folds."""
    rr = runs.pop(rid, None)
    if rr is not None:
        _close_runs(fold, rr)


def _close_runs(fold: FoldTarget, rr: _Runs) -> None:
    """Fold one request's runs into its state."""
    n = rr.chunks + rr.pieces
    if not n:
        return  # nothing unfolded
    last = rr.last
    assert last is not None  # set by every event a run absorbed
    rid = rr.request_id
    rs = fold.requests[rid]
    stages = rs.stages
    replace = msgspec.structs.replace
    for run in rr.by_stage.values():
        if run.last_ts is None:
            continue  # nothing unfolded
        i = run.index  # a stage keeps its place in the tuple (new ones append)
        st = stages[i]
        end = run.last_chunk
        if end is not None:
            new_st = replace(
                st,
                chunks=run.chunks,
                pieces=run.pieces,
                input_closed=run.input_closed,
                last_chunk_ts=end.ts_ns,
                last_chunk_pos=end.pos,
                last_activity_ts=run.last_ts,
            )
        else:
            new_st = replace(
                st, pieces=run.pieces, input_closed=run.input_closed, last_activity_ts=run.last_ts
            )
        stages = (*stages[:i], new_st, *stages[i + 1 :])
    fold.requests[rid] = replace(rs, stages=stages, last_pos=last.pos, events=rs.events + n)


def _first_output_ts(rs: RequestState, modality: str) -> int:
    """The request's first-output stamp a chunk of ``modality`` would set
    (non-zero: already set; 1 for modalities without one)."""
    if modality == "text":
        return rs.first_token_ts
    if modality == "audio":
        return rs.first_audio_ts
    if modality == "image":
        return rs.first_image_ts
    return 1


def _run_can_open(rs: RequestState, ev: Chunk) -> int:
    """The index of the chunk's stage in ``rs.stages`` if ``reduce_chunk``
    of its next chunk (same modality) would change only its counters and
    last-chunk fields (exactly the conditions of its fast path, plus the
    request's first-output stamp for that modality already set) and a
    next piece (``Routed``, seq > 0) only its piece counters; else -1."""
    if rs.status == "admitted" or not _first_output_ts(rs, ev.modality):
        return -1
    name = ev.stage
    i = 0
    for st in rs.stages:
        if st.name == name:
            if (
                st.first_chunk_pos >= 0
                and st.first_chunk_ts
                and st.started_ts
                and st.status == "running"
            ):
                return i
            return -1
        i += 1
    return -1
