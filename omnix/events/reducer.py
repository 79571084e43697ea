"""The reducer: request and worker state as a pure fold over the log.

Owns: ``reduce_request`` and ``reduce_worker`` (pure: immutable states in,
a new immutable state out), transition validation (``IllegalTransition``),
and ``Fold``, the accumulator that maps ids to their latest state, with
snapshots and a digest.  The state types are re-exported from
``state.py``.

Does not own storage or ordering (the log assigns positions), decisions
(the orchestrator reads these states and appends its own events) nor the
bulk path behind ``Fold.apply_all`` (``fold_runs.py``: the same fold,
faster on streamed output).

Because states are frozen Structs, a snapshot is a shallow copy of two dicts
and ``fold(snapshot + suffix) == fold(all)`` holds by construction.  The
digest is a blake2b over the msgpack encoding of the states in id order, so
two folds of the same log agree byte for byte.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable

import msgspec

from omnix.events.fold_runs import fold_runs
from omnix.events.state import (
    ACTIVE_STAGE_STATUSES,
    TERMINAL_STATUSES,
    RequestState,
    RequestStatus,
    StageState,
    StageStatus,
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
    Progress,
    Rejected,
    Released,
    RequestEvent,
    RequestEventType,
    Routed,
    StageFailed,
    StageFinished,
    StageStarted,
    WorkerJoined,
    WorkerLost,
    event_tag,
)

__all__ = [
    "TERMINAL_STATUSES",
    "Fold",
    "IllegalTransition",
    "RequestState",
    "RequestStatus",
    "Snapshot",
    "StageState",
    "StageStatus",
    "WorkerState",
    "fold",
    "mark_stage_lost",
    "reduce_request",
    "reduce_worker",
    "worker_id",
]

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
    return msgspec.structs.replace(
        rs,
        status=status,
        reason=reason,
        terminal_pos=ev.pos,
        terminal_ts=ev.ts_ns,
        terminal_type=event_tag(ev),
        last_pos=ev.pos,
        events=rs.events + 1,
    )


def _reduce_chunk(rs: RequestState, ev: Chunk) -> RequestState:
    """``reduce_request`` for a Chunk on a live request (``Fold.apply`` calls
    it directly: most of a log is chunks)."""
    rid = ev.request_id
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
            rid, ev, f"chunk index {ev.index} of stage {ev.stage!r}, expected {st.chunks}"
        )
    ts = ev.ts_ns
    pos = ev.pos
    replace = msgspec.structs.replace
    # Past a stage's first chunk only the running counters move; passing
    # just those to replace() is the same state at half the cost.  The
    # conditions are exactly those under which the full form below would
    # leave the other fields unchanged.
    if st.first_chunk_pos >= 0 and st.first_chunk_ts and st.started_ts and st.status == "running":
        new_st = replace(
            st, chunks=st.chunks + 1, last_chunk_ts=ts, last_chunk_pos=pos, last_activity_ts=ts
        )
    else:
        new_st = replace(
            st,
            status="running",
            chunks=st.chunks + 1,
            first_chunk_ts=st.first_chunk_ts or ts,
            last_chunk_ts=ts,
            first_chunk_pos=pos if st.first_chunk_pos < 0 else st.first_chunk_pos,
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


def reduce_request(rs: RequestState | None, ev: RequestEventType) -> RequestState:
    """Fold one request event into the request's state.  Pure.

    Raises ``IllegalTransition`` for an event the state does not allow: any
    event after a terminal one, a chunk out of order, a stage event for a
    stage never routed, a second admission.
    """
    rid = ev.request_id
    if rs is None:
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

    if rs.status in TERMINAL_STATUSES:
        raise IllegalTransition(rid, ev, "request already ended", _terminal_desc(rs))

    # Dispatch on the exact type, written out per branch: the checker
    # narrows ``ev`` from ``type(ev) is X`` (not from a saved ``type(ev)``).
    if type(ev) is Chunk:
        return _reduce_chunk(rs, ev)
    if type(ev) is Routed:
        st = rs.stage(ev.stage)
        if st is None:
            if ev.seq != 0:
                raise IllegalTransition(
                    rid, ev, f"first piece for stage {ev.stage!r} has seq {ev.seq}"
                )
            if ev.resume:
                raise IllegalTransition(
                    rid,
                    ev,
                    f"stage {ev.stage!r} never ran; it cannot resume after chunk {ev.resume}",
                )
            if rs.status == "cancelling":
                raise IllegalTransition(rid, ev, "request is cancelling")
            stages = (*rs.stages, _routed_stage(ev, 1))
        elif ev.seq == 0 and st.status in _RETRYABLE:
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
                # A retry before any output: the stage starts over.
                new_st = _routed_stage(ev, st.attempt + 1)
            else:
                # A continuation: the stage keeps the chunks it delivered
                # (and when its first came); the new replica's continue at
                # index ``chunks``.
                new_st = msgspec.structs.replace(
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
            stages = _replace_stage(rs, new_st)
        else:
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
            new_st = msgspec.structs.replace(
                st, pieces=st.pieces + 1, input_closed=ev.last, last_activity_ts=ev.ts_ns
            )
            stages = _replace_stage(rs, new_st)
        return msgspec.structs.replace(
            rs,
            status="running" if rs.status == "admitted" else rs.status,
            stages=stages,
            last_pos=ev.pos,
            events=rs.events + 1,
        )
    if type(ev) is StageStarted:
        st = _need_active(rs, ev, ev.stage, ev.replica)
        new_st = msgspec.structs.replace(
            st, status="running", started_ts=st.started_ts or ev.ts_ns, last_activity_ts=ev.ts_ns
        )
        return msgspec.structs.replace(
            rs, stages=_replace_stage(rs, new_st), last_pos=ev.pos, events=rs.events + 1
        )
    if type(ev) is Progress:
        st = _need_active(rs, ev, ev.stage, ev.replica)
        new_st = msgspec.structs.replace(
            st,
            status="running",
            progress_step=ev.step,
            progress_total=ev.total,
            last_activity_ts=ev.ts_ns,
        )
        return msgspec.structs.replace(
            rs, stages=_replace_stage(rs, new_st), last_pos=ev.pos, events=rs.events + 1
        )
    if type(ev) is StageFinished:
        st = _need_active(rs, ev, ev.stage, ev.replica)
        if ev.chunks != st.chunks:
            raise IllegalTransition(
                rid, ev, f"stage {ev.stage!r} reports {ev.chunks} chunks, log has {st.chunks}"
            )
        new_st = msgspec.structs.replace(
            st,
            status="aborted" if ev.finish_reason == "aborted" else "finished",
            finish_reason=_intern(ev.finish_reason),
            prompt_tokens=ev.prompt_tokens,
            output_tokens=ev.output_tokens,
            finished_ts=ev.ts_ns,
        )
        return msgspec.structs.replace(
            rs, stages=_replace_stage(rs, new_st), last_pos=ev.pos, events=rs.events + 1
        )
    if type(ev) is StageFailed:
        st = _need_active(rs, ev, ev.stage, ev.replica)
        new_st = msgspec.structs.replace(
            st, status="failed", finish_reason="error", finished_ts=ev.ts_ns
        )
        return msgspec.structs.replace(
            rs, stages=_replace_stage(rs, new_st), last_pos=ev.pos, events=rs.events + 1
        )
    if type(ev) is CancelRequested:
        if rs.status == "cancelling":
            # A second cancel (say, a disconnect after a client cancel) is a
            # fact worth keeping but changes nothing.
            return msgspec.structs.replace(rs, last_pos=ev.pos, events=rs.events + 1)
        return msgspec.structs.replace(
            rs,
            status="cancelling",
            cancel_reason=ev.reason,
            cancel_pos=ev.pos,
            cancel_ts=ev.ts_ns,
            stages=tuple(
                msgspec.structs.replace(st, abort_sent=True)
                if st.status in ACTIVE_STAGE_STATUSES
                else st
                for st in rs.stages
            ),
            last_pos=ev.pos,
            events=rs.events + 1,
        )
    if type(ev) is DeadlineExpired:
        return msgspec.structs.replace(rs, last_pos=ev.pos, events=rs.events + 1)
    if type(ev) is Cancelled:
        if rs.status != "cancelling":
            raise IllegalTransition(rid, ev, "cancelled without a cancel request")
        return _terminate(rs, ev, "cancelled", ev.reason)
    if type(ev) is Failed:
        stages = tuple(
            msgspec.structs.replace(st, abort_sent=True)
            if st.status in ACTIVE_STAGE_STATUSES
            else st
            for st in rs.stages
        )
        return msgspec.structs.replace(_terminate(rs, ev, "failed", ev.reason), stages=stages)
    if type(ev) is Finished:
        if rs.status == "cancelling":
            raise IllegalTransition(rid, ev, "finished while cancelling")
        active = rs.active_stages()
        if active:
            raise IllegalTransition(
                rid, ev, f"finished while stage {active[0].name!r} is still {active[0].status}"
            )
        return _terminate(rs, ev, "finished", "")
    if type(ev) is Admitted or type(ev) is Rejected:
        raise IllegalTransition(
            rid, ev, "request id already admitted", f"admitted at pos {rs.admitted_pos}"
        )
    raise IllegalTransition(rid, ev, "unknown request event type")


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


def mark_stage_lost(rs: RequestState, stage: str, ts_ns: int) -> RequestState:
    """The replica running ``stage`` for this request is gone (WorkerLost)."""
    st = rs.stage(stage)
    if st is None or st.status not in ACTIVE_STAGE_STATUSES:
        return rs
    new_st = msgspec.structs.replace(st, status="lost", finished_ts=ts_ns)
    return msgspec.structs.replace(rs, stages=_replace_stage(rs, new_st))


def reduce_worker(ws: WorkerState | None, ev: WorkerJoined | WorkerLost) -> WorkerState:
    """Fold one worker event.  A replica may rejoin after it was lost."""
    if isinstance(ev, WorkerJoined):
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
    return msgspec.structs.replace(ws, alive=False, lost_pos=ev.pos, lost_reason=ev.reason)


class Snapshot(msgspec.Struct, frozen=True):
    """The fold at a log position: apply events from ``next_pos`` on."""

    next_pos: int
    requests: dict[str, RequestState]
    workers: dict[str, WorkerState]
    #: worker id -> the live requests with an active stage on it, in routing
    #: order (``Fold.requests_on``).  The order cannot be rebuilt from the
    #: states, and decisions iterate it, so the snapshot carries it.
    by_worker: dict[str, tuple[str, ...]] = {}
    #: ``Fold.ended`` and ``Fold.audio_samples`` (a snapshot without them
    #: starts them empty)
    ended: tuple[str, ...] = ()
    audio_samples: dict[str, int] = {}
    #: ``Fold.ended_dropped``: ids a ``Released`` took off ``ended``'s front
    ended_dropped: int = 0


_state_encoder = msgspec.msgpack.Encoder()


class Fold:
    """Latest state per request and per worker: ``fold(log)``.

    ``apply`` validates and folds one event (raising ``IllegalTransition``
    and leaving the fold untouched on an illegal one).  WorkerLost also
    marks the stages that replica was running for each live request as
    ``lost``; that is part of the fold, so it is replayed identically.

    Beside the states (and outside the digest: derived facts the states do
    not carry), the fold keeps what a reader of the whole log would
    otherwise have to read every event for, so the telemetry projection
    polls these instead of reading the log (``docs/telemetry.md``).  Each
    costs nothing on most events: a per-event counter (say, events by
    type) would cost ~3% of an append in CPython, so there is none.

    * ``ended``: request ids in the order their terminal event was folded
      (``requests[rid].terminal_pos`` says where);
    * ``audio_samples``: per request, the samples of its audio chunks that
      carry an array blob (``blob.shape[0]``).

    A ``Released`` event (retention) drops ended requests' states, their
    ``audio_samples`` and their entries in ``ended``; ``ended_dropped``
    counts the entries taken off ``ended`` (retention releases in ended
    order, so they come off its front), so a reader holding an index into
    ``ended`` finds its place again as ``index - ended_dropped``.
    """

    __slots__ = (
        "_by_worker",
        "audio_samples",
        "ended",
        "ended_dropped",
        "keep_released",
        "next_pos",
        "requests",
        "workers",
    )

    def __init__(self, snapshot: Snapshot | None = None) -> None:
        self.requests: dict[str, RequestState] = {}
        self.workers: dict[str, WorkerState] = {}
        self.next_pos = 0
        # worker_id -> request ids with an active stage on it (insertion
        # ordered: a dict used as an ordered set).
        self._by_worker: dict[str, dict[str, None]] = {}
        self.ended: list[str] = []
        self.ended_dropped = 0
        #: an offline reader of a whole history (an archive) sets it: a
        #: ``Released`` is validated but drops nothing
        self.keep_released = False
        self.audio_samples: dict[str, int] = {}
        if snapshot is not None:
            self.requests.update(snapshot.requests)
            self.workers.update(snapshot.workers)
            self.next_pos = snapshot.next_pos
            self.ended.extend(snapshot.ended)
            self.ended_dropped = snapshot.ended_dropped
            self.audio_samples.update(snapshot.audio_samples)
            if snapshot.by_worker:
                for wid, rids in snapshot.by_worker.items():
                    self._by_worker[wid] = dict.fromkeys(rids)
            else:  # a snapshot without the occupancy: rebuild it (admission order)
                for rs in self.requests.values():
                    self._index_active(rs)

    def _index_active(self, rs: RequestState) -> None:
        # A terminal request keeps its stages' last status (a Failed one may
        # still say "running") but occupies no worker: apply() dropped it.
        if rs.status in TERMINAL_STATUSES:
            return
        for st in rs.stages:
            if st.status in ACTIVE_STAGE_STATUSES:
                wid = worker_id(st.name, st.replica)
                self._by_worker.setdefault(wid, {})[rs.request_id] = None

    def check(self, ev: Event) -> None:
        """Validate without applying (raises ``IllegalTransition``)."""
        if isinstance(ev, RequestEvent):
            reduce_request(self.requests.get(ev.request_id), ev)
        elif type(ev) is Released:
            self._check_released(ev)
        else:
            reduce_worker(self.workers.get(ev.worker_id), ev)

    def _check_released(self, ev: Released) -> None:
        for rid in ev.request_ids:
            rs = self.requests.get(rid)
            if rs is not None and rs.status not in TERMINAL_STATUSES:
                raise IllegalTransition(
                    rid,
                    ev,
                    f"request is still in flight ({rs.status}): only ended requests are released",
                )

    def _release(self, ev: Released) -> None:
        # Validated first: an illegal Released leaves the fold untouched.
        self._check_released(ev)
        if self.keep_released:
            return
        requests = self.requests
        audio = self.audio_samples
        gone: set[str] = set()
        for rid in ev.request_ids:
            if requests.pop(rid, None) is not None:
                gone.add(rid)
            audio.pop(rid, None)
        if not gone:
            return
        ended = self.ended
        # Retention releases the oldest ended requests: a prefix of ``ended``.
        k = 0
        n = len(ended)
        while k < n and ended[k] in gone:
            k += 1
        if k == len(gone):
            del ended[:k]
        else:  # not a prefix (a hand-made Released): keep the order of the rest
            k = sum(1 for rid in ended if rid in gone)
            ended[:] = [rid for rid in ended if rid not in gone]
        self.ended_dropped += k

    def apply(self, ev: Event) -> None:
        if type(ev) is Chunk:
            # The bulk of a log: straight to the chunk reducer when the
            # request is live (reduce_request would dispatch to it too).
            rid = ev.request_id
            requests = self.requests
            old = requests.get(rid)
            if old is None or old.status in TERMINAL_STATUSES:
                requests[rid] = reduce_request(old, ev)  # raises, naming the reason
            else:
                requests[rid] = _reduce_chunk(old, ev)
            blob = ev.blob  # text and codec chunks have none
            if blob is not None and blob.shape and ev.modality == "audio":
                audio = self.audio_samples
                audio[rid] = audio.get(rid, 0) + blob.shape[0]
        elif type(ev) is Released:
            self._release(ev)
        elif type(ev) is WorkerJoined or type(ev) is WorkerLost:
            # Exact types rather than isinstance(ev, RequestEvent): see types.py.
            wid = ev.worker_id
            self.workers[wid] = reduce_worker(self.workers.get(wid), ev)
            if type(ev) is WorkerLost:
                for rid in self._by_worker.pop(wid, {}):
                    rs = self.requests[rid]
                    self.requests[rid] = mark_stage_lost(rs, ev.stage, ev.ts_ns)
        else:
            rid = ev.request_id
            old = self.requests.get(rid)
            new = reduce_request(old, ev)
            self.requests[rid] = new
            # Events that can neither start nor end a stage's occupancy of a
            # worker skip the worker index entirely.
            if type(ev) is StageStarted or type(ev) is Progress:
                pass
            elif type(ev) is Routed:
                # A Routed never ends a request: only its first piece matters here.
                if ev.seq == 0:
                    self._by_worker.setdefault(worker_id(ev.stage, ev.replica), {})[rid] = None
            elif type(ev) is StageFinished or type(ev) is StageFailed:
                self._by_worker.get(worker_id(ev.stage, ev.replica), {}).pop(rid, None)
            elif new.status in TERMINAL_STATUSES:
                self.ended.append(rid)
                for st in new.stages:
                    self._by_worker.get(worker_id(st.name, st.replica), {}).pop(rid, None)
        self.next_pos = ev.pos + 1 if ev.pos >= 0 else self.next_pos + 1

    def apply_all(self, events: Iterable[Event]) -> None:
        """``apply`` each event in order: the same fold, faster on logs made
        mostly of one stage's stream (replay, recovery).  See
        ``omnix.events.fold_runs``."""
        fold_runs(self, events)

    def requests_on(self, wid: str) -> tuple[str, ...]:
        """Live requests with an active stage on worker ``wid``, in routing order."""
        return tuple(self._by_worker.get(wid, ()))

    def snapshot(self) -> Snapshot:
        return Snapshot(
            self.next_pos,
            dict(self.requests),
            dict(self.workers),
            {wid: tuple(rids) for wid, rids in self._by_worker.items() if rids},
            tuple(self.ended),
            dict(self.audio_samples),
            self.ended_dropped,
        )

    def digest(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        for rid in sorted(self.requests):
            h.update(_state_encoder.encode(self.requests[rid]))
        for wid in sorted(self.workers):
            h.update(_state_encoder.encode(self.workers[wid]))
        return h.hexdigest()


def worker_id(stage: str, replica: int) -> str:
    return f"{stage}/{replica}"


def fold(events: Iterable[Event], snapshot: Snapshot | None = None) -> Fold:
    f = Fold(snapshot)
    f.apply_all(events)
    return f
