"""The transition rules: how one event changes one request's or worker's state.

Owns: ``reduce_request`` and ``reduce_worker`` (pure: an immutable state
and an event in, a new immutable state out), ``reduce_chunk`` and
``reduce_routed`` (the chunk and piece rules, which ``Fold.apply`` calls
directly), ``mark_stage_lost`` (what a
lost replica does to a request's stage) and ``IllegalTransition``, raised
for an event the state does not allow.

Does not own the accumulator that maps ids to states, its worker index,
snapshots and digest (``reducer.py``: ``Fold``), the bulk path that folds
streamed runs in one step (``fold_runs.py``), nor the state types
(``state.py``).

``reduce_request`` dispatches with ``match`` and ``assert_never``, so the
checker fails when an event type joins ``RequestEventType`` without a rule
here.  The most frequent kinds (chunks, input pieces, a stage's start and
end) are tested by exact type before the ``match``: a class pattern is an
``isinstance`` call, which costs ~60 ns per pattern tried and missed on a
Struct class (its metaclass's ``__instancecheck__``) against ~10 ns for
``type(ev) is X``; measured, a ``match`` alone made ``Fold.apply`` ~4%
slower on ``omnix bench log``'s mix.
"""

from __future__ import annotations

import sys
from typing import assert_never

from msgspec.structs import replace

from omnix.events.state import (
    ACTIVE_STAGE_STATUSES,
    TERMINAL_STATUSES,
    RequestState,
    RequestStatus,
    StageState,
    WorkerState,
)
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
    RequestEventType,
    Routed,
    Scaled,
    StageFailed,
    StageFinished,
    StageStarted,
    WorkerJoined,
    WorkerLost,
    event_tag,
)

__all__ = [
    "IllegalTransition",
    "mark_stage_lost",
    "reduce_chunk",
    "reduce_request",
    "reduce_routed",
    "reduce_worker",
]

#: A stage in one of these may start a new execution (a retry or a continuation).
_RETRYABLE = ("failed", "lost")


class IllegalTransition(ValueError):
    """An event that the request's current state does not allow."""

    def __init__(
        self, key: str, event: Event, reason: str, prior: str = "", *, stored: bool = True
    ) -> None:
        self.key = key
        self.event = event
        self.reason = reason
        self.prior = prior
        if event.pos < 0:
            where = ""
        elif stored:
            where = f" at pos {event.pos}"
        else:  # an append refused it: the position was only offered
            where = f" refused as pos {event.pos} (nothing stored)"
        text = f"{key}: illegal {event_tag(event)}{where}: {reason}"
        if prior:
            text += f" (after {prior})"
        super().__init__(text)

    def refused(self) -> IllegalTransition:
        """The same error for an event a log refused to store: its message
        says the position was only offered, not that the event is there.
        ``event.pos`` keeps that position (a replay's divergence report
        looks up what the recording holds there)."""
        return IllegalTransition(self.key, self.event, self.reason, self.prior, stored=False)


# States outlive their events: a request's state would otherwise keep its
# own copy of every name it was built from (decoded events carry fresh
# strings), about a third of a finished request's memory.  Pipeline and
# stage names, finish reasons and output sets are small vocabularies, so
# states share one copy of each.  Equal strings: the fold stays pure.
_intern = sys.intern
_OUTPUT_SETS: dict[tuple[str, ...], tuple[str, ...]] = {}


def _outputs(outputs: tuple[str, ...]) -> tuple[str, ...]:
    key = tuple(outputs)
    found = _OUTPUT_SETS.get(key)
    if found is None:
        found = tuple(_intern(o) for o in key)
        if len(_OUTPUT_SETS) < 1024:  # modalities are a Literal; bound it anyway
            _OUTPUT_SETS[key] = found
    return found


# --------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------


def reduce_request(rs: RequestState | None, ev: RequestEventType) -> RequestState:
    """Fold one request event into the request's state.  Pure.

    Raises ``IllegalTransition`` for an event the state does not allow: any
    event after a terminal one, a chunk out of order, a stage event for a
    stage never routed, a second admission.
    """
    if rs is None:
        return _first_event(ev)
    if rs.status in TERMINAL_STATUSES:
        raise IllegalTransition(ev.request_id, ev, "request already ended", _terminal_desc(rs))
    # The most frequent kinds by exact type, before the match (module
    # docstring): a chunk, an input piece, a stage's start and end.
    if type(ev) is Chunk:
        return reduce_chunk(rs, ev)
    if type(ev) is Routed:
        return reduce_routed(rs, ev)
    if type(ev) is StageStarted:
        st = _need_active(rs, ev, ev.stage, ev.replica)
        new_st = replace(
            st, status="running", started_ts=st.started_ts or ev.ts_ns, last_activity_ts=ev.ts_ns
        )
        stages = _replace_stage(rs, new_st)  # (_with_stage inlined: a frequent kind)
        return replace(rs, stages=stages, last_pos=ev.pos, events=rs.events + 1)
    if type(ev) is StageFinished:
        return _reduce_stage_finished(rs, ev)
    match ev:
        case Finished():
            return _reduce_finished(rs, ev)
        case Progress():
            st = _need_active(rs, ev, ev.stage, ev.replica)
            new_st = replace(
                st,
                status="running",
                progress_step=ev.step,
                progress_total=ev.total,
                last_activity_ts=ev.ts_ns,
            )
            return _with_stage(rs, ev, new_st)
        case StageFailed():
            st = _need_active(rs, ev, ev.stage, ev.replica)
            new_st = replace(st, status="failed", finish_reason="error", finished_ts=ev.ts_ns)
            return _with_stage(rs, ev, new_st)
        case CancelRequested():
            return _reduce_cancel_requested(rs, ev)
        case DeadlineExpired():
            return replace(rs, last_pos=ev.pos, events=rs.events + 1)
        case InputAppended():
            if not rs.input_open:
                raise IllegalTransition(
                    rs.request_id,
                    ev,
                    "the request takes no more input (it does not stream "
                    "input, or its last piece came)",
                )
            return replace(rs, input_open=not ev.last, last_pos=ev.pos, events=rs.events + 1)
        case Cancelled():
            if rs.status != "cancelling":
                raise IllegalTransition(rs.request_id, ev, "cancelled without a cancel request")
            return _terminate(rs, ev, "cancelled", ev.reason)
        case Failed():
            return replace(_terminate(rs, ev, "failed", ev.reason), stages=_aborting(rs))
        case Admitted() | Rejected():
            raise IllegalTransition(
                rs.request_id,
                ev,
                "request id already admitted",
                f"admitted at pos {rs.admitted_pos}",
            )
        case _:
            assert_never(ev)


def _first_event(ev: RequestEventType) -> RequestState:
    """A request's state from its first event: an admission or a rejection."""
    rid = ev.request_id
    if type(ev) is Admitted:
        dl = ev.spec.deadline_ms
        return RequestState(
            request_id=rid,
            status="admitted",
            pipeline=_intern(ev.pipeline),
            admitted_pos=ev.pos,
            admitted_ts=ev.ts_ns,
            outputs=_outputs(ev.spec.outputs),
            deadline_ns=ev.ts_ns + dl * 1_000_000 if dl > 0 else 0,
            last_pos=ev.pos,
            events=1,
            input_open=ev.spec.input_streams,
        )
    if type(ev) is Rejected:
        rs = RequestState(
            request_id=rid,
            status="rejected",
            pipeline=_intern(ev.pipeline),
            admitted_pos=-1,
            admitted_ts=ev.ts_ns,
            outputs=_outputs(ev.spec.outputs),
        )
        return _terminate(rs, ev, "rejected", ev.reason)
    raise IllegalTransition(rid, ev, "request was never admitted")


def reduce_chunk(rs: RequestState, ev: Chunk) -> RequestState:
    """``reduce_request`` for a Chunk on a live request (``Fold.apply`` calls
    it directly: most of a log is chunks)."""
    # The hottest path (most of a log is chunks): _need_active inlined,
    # and the stage's index kept so the replacement needs no second search.
    stages = rs.stages
    name = ev.stage
    i = 0
    for st in stages:
        if st.name == name:
            break
        i += 1
    else:
        st = None
    if st is None or st.replica != ev.replica or st.status not in ACTIVE_STAGE_STATUSES:
        st = _need_active(rs, ev, name, ev.replica)  # raises, naming the reason
    if ev.index != st.chunks:
        raise IllegalTransition(
            rs.request_id, ev, f"chunk index {ev.index} of stage {ev.stage!r}, expected {st.chunks}"
        )
    ts = ev.ts_ns
    pos = ev.pos
    # Past a stage's first chunk only the running counters move; passing
    # just those to replace() is the same state at half the cost.  The
    # conditions are exactly those under which the full form below would
    # leave the other fields unchanged.
    if st.first_chunk_pos >= 0 and st.first_chunk_ts and st.started_ts and st.status == "running":
        new_st = replace(
            st, chunks=st.chunks + 1, last_chunk_ts=ts, last_chunk_pos=pos, last_activity_ts=ts
        )
    else:
        # A thinker's context for its talker ("hidden") is no output: the
        # stage's first chunk (its time to first output) is its first other.
        output = ev.modality != "hidden"
        new_st = replace(
            st,
            status="running",
            chunks=st.chunks + 1,
            first_chunk_ts=st.first_chunk_ts or (ts if output else 0),
            last_chunk_ts=ts,
            first_chunk_pos=pos if st.first_chunk_pos < 0 and output else st.first_chunk_pos,
            last_chunk_pos=pos,
            started_ts=st.started_ts or ts,
            last_activity_ts=ts,
        )
    stages = (*stages[:i], new_st, *stages[i + 1 :])
    m = ev.modality
    # _first_output_ts(rs, m), inlined: this runs for every chunk.
    first = (
        rs.first_token_ts
        if m == "text"
        else rs.first_audio_ts
        if m == "audio"
        else rs.first_image_ts
        if m == "image"
        else 1
    )
    if first and rs.status != "admitted":
        return replace(rs, stages=stages, last_pos=pos, events=rs.events + 1)
    return replace(
        rs,
        status="running" if rs.status == "admitted" else rs.status,
        stages=stages,
        first_token_ts=rs.first_token_ts or (ts if m == "text" else 0),
        first_audio_ts=rs.first_audio_ts or (ts if m == "audio" else 0),
        first_image_ts=rs.first_image_ts or (ts if m == "image" else 0),
        last_pos=pos,
        events=rs.events + 1,
    )


def reduce_routed(rs: RequestState, ev: Routed) -> RequestState:
    """``reduce_request`` for a Routed on a live request (``Fold.apply``
    calls it directly, as ``reduce_chunk``): an input piece for a stage,
    its first (the stage starts), the first of a new execution (a retry or
    a continuation), or a further one."""
    st = rs.stage(ev.stage)
    if st is None:
        stages = (*rs.stages, _first_piece(rs, ev))
    elif ev.seq == 0 and st.status in _RETRYABLE:
        stages = _replace_stage(rs, _new_execution(rs, st, ev))
    else:
        # A further piece for an active stage (the frequent case: inline).
        rid = rs.request_id
        if st.status not in ACTIVE_STAGE_STATUSES:
            raise IllegalTransition(rid, ev, f"stage {ev.stage!r} is already {st.status}")
        if st.replica != ev.replica:
            raise IllegalTransition(
                rid, ev, f"stage {ev.stage!r} runs on replica {st.replica}, not {ev.replica}"
            )
        if st.input_closed:
            raise IllegalTransition(rid, ev, f"input of stage {ev.stage!r} is already closed")
        if ev.seq != st.pieces:
            raise IllegalTransition(
                rid, ev, f"piece seq {ev.seq} for stage {ev.stage!r}, expected {st.pieces}"
            )
        if ev.resume:
            raise IllegalTransition(rid, ev, "only a stage's first piece (seq 0) can resume")
        new_st = replace(st, pieces=st.pieces + 1, input_closed=ev.last, last_activity_ts=ev.ts_ns)
        stages = _replace_stage(rs, new_st)
    return replace(
        rs,
        status="running" if rs.status == "admitted" else rs.status,
        stages=stages,
        last_pos=ev.pos,
        events=rs.events + 1,
    )


def _first_piece(rs: RequestState, ev: Routed) -> StageState:
    """The state of a stage its first piece routes."""
    rid = rs.request_id
    if ev.seq != 0:
        raise IllegalTransition(rid, ev, f"first piece for stage {ev.stage!r} has seq {ev.seq}")
    if ev.resume:
        raise IllegalTransition(
            rid, ev, f"stage {ev.stage!r} never ran; it cannot resume after chunk {ev.resume}"
        )
    if rs.status == "cancelling":
        raise IllegalTransition(rid, ev, "request is cancelling")
    return _routed_stage(ev, 1)


def _new_execution(rs: RequestState, st: StageState, ev: Routed) -> StageState:
    """A failed or lost stage routed again (``seq == 0``): a retry before
    any output starts over; a continuation keeps the chunks it delivered."""
    rid = rs.request_id
    if rs.status == "cancelling":
        raise IllegalTransition(rid, ev, "request is cancelling")
    if ev.resume != st.chunks:
        raise IllegalTransition(
            rid,
            ev,
            f"stage {ev.stage!r} is {st.status} after {st.chunks} chunks; a new "
            f"execution must continue after them (resume {st.chunks}), not {ev.resume}",
        )
    if st.chunks == 0:
        return _routed_stage(ev, st.attempt + 1)
    # The stage keeps the chunks it delivered (and when its first came);
    # the new replica's continue at index ``chunks``.
    return replace(
        st,
        replica=ev.replica,
        status="routed",
        pieces=1,
        input_closed=ev.last,
        finish_reason="",
        prompt_tokens=0,
        output_tokens=0,
        finished_ts=0,
        progress_step=0,
        progress_total=0,
        abort_sent=False,
        attempt=st.attempt + 1,
        last_activity_ts=ev.ts_ns,
    )


def _routed_stage(ev: Routed, attempt: int) -> StageState:
    """A stage's state as its first piece (``seq == 0``) routes it."""
    return StageState(
        name=_intern(ev.stage),
        replica=ev.replica,
        pieces=1,
        input_closed=ev.last,
        routed_ts=ev.ts_ns,
        last_activity_ts=ev.ts_ns,
        attempt=attempt,
    )


def _reduce_stage_finished(rs: RequestState, ev: StageFinished) -> RequestState:
    st = _need_active(rs, ev, ev.stage, ev.replica)
    if ev.chunks != st.chunks:
        raise IllegalTransition(
            rs.request_id, ev, f"stage {ev.stage!r} reports {ev.chunks} chunks, log has {st.chunks}"
        )
    new_st = replace(
        st,
        status="aborted" if ev.finish_reason == "aborted" else "finished",
        finish_reason=_intern(ev.finish_reason),
        prompt_tokens=ev.prompt_tokens,
        output_tokens=ev.output_tokens,
        finished_ts=ev.ts_ns,
    )
    return _with_stage(rs, ev, new_st)


def _reduce_cancel_requested(rs: RequestState, ev: CancelRequested) -> RequestState:
    if rs.status == "cancelling":
        # A second cancel (say, a disconnect after a client cancel) is a
        # fact worth keeping but changes nothing.
        return replace(rs, last_pos=ev.pos, events=rs.events + 1)
    return replace(
        rs,
        status="cancelling",
        cancel_reason=ev.reason,
        cancel_pos=ev.pos,
        cancel_ts=ev.ts_ns,
        stages=_aborting(rs),
        last_pos=ev.pos,
        events=rs.events + 1,
    )


def _reduce_finished(rs: RequestState, ev: Finished) -> RequestState:
    if rs.status == "cancelling":
        raise IllegalTransition(rs.request_id, ev, "finished while cancelling")
    active = rs.active_stages()
    if active:
        raise IllegalTransition(
            rs.request_id,
            ev,
            f"finished while stage {active[0].name!r} is still {active[0].status}",
        )
    return _terminate(rs, ev, "finished", "")


def _aborting(rs: RequestState) -> tuple[StageState, ...]:
    """The request's stages with an abort asked of every active one."""
    return tuple(
        replace(st, abort_sent=True) if st.status in ACTIVE_STAGE_STATUSES else st
        for st in rs.stages
    )


def _with_stage(rs: RequestState, ev: Event, new_st: StageState) -> RequestState:
    """``rs`` after ``ev``, which changed only the stage ``new_st`` replaces."""
    return replace(rs, stages=_replace_stage(rs, new_st), last_pos=ev.pos, events=rs.events + 1)


def _replace_stage(rs: RequestState, new: StageState) -> tuple[StageState, ...]:
    # Hot path (every chunk): an index loop and one slice-concat is ~3x
    # cheaper than a generator expression over the tuple.
    stages = rs.stages
    name = new.name
    for i, st in enumerate(stages):
        if st.name == name:
            return (*stages[:i], new, *stages[i + 1 :])
    return stages


def _terminal_desc(rs: RequestState) -> str:
    return f"{rs.terminal_type} at pos {rs.terminal_pos}"


def _need_stage(rs: RequestState, ev: Event, stage: str, replica: int) -> StageState:
    st = rs.stage(stage)
    if st is None:
        raise IllegalTransition(rs.request_id, ev, f"stage {stage!r} was never routed")
    if st.replica != replica:
        raise IllegalTransition(
            rs.request_id, ev, f"stage {stage!r} runs on replica {st.replica}, not {replica}"
        )
    return st


def _need_active(rs: RequestState, ev: Event, stage: str, replica: int) -> StageState:
    st = _need_stage(rs, ev, stage, replica)
    if st.status not in ACTIVE_STAGE_STATUSES:
        raise IllegalTransition(rs.request_id, ev, f"stage {stage!r} is already {st.status}")
    return st


def _terminate(rs: RequestState, ev: Event, status: RequestStatus, reason: str) -> RequestState:
    return replace(
        rs,
        status=status,
        reason=reason,
        terminal_pos=ev.pos,
        terminal_ts=ev.ts_ns,
        terminal_type=event_tag(ev),
        last_pos=ev.pos,
        events=rs.events + 1,
    )


def mark_stage_lost(rs: RequestState, stage: str, ts_ns: int) -> RequestState:
    """The replica running ``stage`` for this request is gone (WorkerLost)."""
    st = rs.stage(stage)
    if st is None or st.status not in ACTIVE_STAGE_STATUSES:
        return rs
    new_st = replace(st, status="lost", finished_ts=ts_ns)
    return replace(rs, stages=_replace_stage(rs, new_st))


# --------------------------------------------------------------------------
# Workers
# --------------------------------------------------------------------------


def reduce_left(ws: WorkerState | None, ev: Scaled, busy: tuple[str, ...]) -> WorkerState:
    """A drained replica left (``Scaled(op="left")``, schema v8): it must
    be joined and run no request (``busy``: those with an active stage on
    it); it is no longer alive, and nothing it ran is lost."""
    wid = f"{ev.stage}/{ev.replica}"
    if ws is None or not ws.alive:
        raise IllegalTransition(wid, ev, "worker is not joined")
    if busy:
        raise IllegalTransition(
            wid,
            ev,
            f"a replica leaves only once its requests are done; it still runs {', '.join(busy)}",
        )
    return replace(ws, alive=False, lost_pos=ev.pos, lost_reason="left")


def reduce_worker(ws: WorkerState | None, ev: WorkerJoined | WorkerLost) -> WorkerState:
    """Fold one worker event.  A replica may rejoin after it was lost."""
    if type(ev) is WorkerJoined:
        if ws is not None and ws.alive:
            raise IllegalTransition(
                ev.worker_id, ev, "worker already joined", f"joined at pos {ws.joined_pos}"
            )
        return WorkerState(
            worker_id=ev.worker_id,
            stage=ev.stage,
            replica=ev.replica,
            engine=ev.engine,
            capacity=ev.capacity,
            pid=ev.pid,
            joined_pos=ev.pos,
            incarnation=1 if ws is None else ws.incarnation + 1,
        )
    if ws is None or not ws.alive:
        raise IllegalTransition(ev.worker_id, ev, "worker is not joined")
    return replace(ws, alive=False, lost_pos=ev.pos, lost_reason=ev.reason)
