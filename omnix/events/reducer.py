"""The reducer: request and worker state as a pure fold over the log.

Owns: ``Fold``, the accumulator that maps request and worker ids to their
latest state (validating each event through the transition rules), with
its worker occupancy index, snapshots (``Snapshot``) and a digest, and
``fold``.  The transition rules (``reduce_request``, ``reduce_worker``,
``IllegalTransition``) are re-exported from ``transitions.py`` and the
state types from ``state.py``, so readers of the fold import one module.

Does not own the rules themselves (``transitions.py``), storage or
ordering (the log assigns positions), decisions (the orchestrator reads
these states and appends its own events) nor the bulk path behind
``Fold.apply_all`` (``fold_runs.py``: the same fold, faster on streamed
output).

Because states are frozen Structs, a snapshot is a shallow copy of two dicts
and ``fold(snapshot + suffix) == fold(all)`` holds by construction.  The
digest is a blake2b over the msgpack encoding of the states in id order, so
two folds of the same log agree byte for byte.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import assert_never

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
from omnix.events.transitions import (
    IllegalTransition,
    mark_stage_lost,
    reduce_chunk,
    reduce_left,
    reduce_request,
    reduce_routed,
    reduce_worker,
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
    Released,
    RequestEvent,
    Routed,
    Scaled,
    SessionChanged,
    StageFailed,
    StageFinished,
    StageStarted,
    WorkerJoined,
    WorkerLost,
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
    #: ``Fold.scaled`` (schema v8)
    scaled: dict[str, tuple[int, ...]] = {}


_state_encoder = msgspec.msgpack.Encoder()


def state_bytes(rs: RequestState) -> bytes:
    """A request's state as digests hash it.  ``input_open`` (schema v7)
    enters only when set: a state without it hashes as the states of
    earlier omnix did, so the traces they wrote still verify (an
    array-like Struct encodes as the tuple of its fields)."""
    if rs.input_open:
        return _state_encoder.encode(rs)
    return _state_encoder.encode(msgspec.structs.astuple(rs)[:-1])


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
      carry an array blob (``blob.shape[0]``);
    * ``scaled``: per replica (worker id), the positions of its last
      ``Scaled`` start or drain and of the ``left`` after it, if any: what
      the scaler's state is rebuilt from (retention keeps them, as it
      keeps the workers' joins and losses).

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
        "scaled",
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
        self.scaled: dict[str, tuple[int, ...]] = {}
        if snapshot is not None:
            self.scaled.update(snapshot.scaled)
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
        elif type(ev) is WorkerJoined or type(ev) is WorkerLost:
            reduce_worker(self.workers.get(ev.worker_id), ev)
        elif type(ev) is Scaled and ev.op == "left":
            wid = worker_id(ev.stage, ev.replica)
            reduce_left(self.workers.get(wid), ev, self.requests_on(wid))

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
                requests[rid] = reduce_chunk(old, ev)
            blob = ev.blob  # text and codec chunks have none
            if blob is not None and blob.shape and ev.modality == "audio":
                audio = self.audio_samples
                audio[rid] = audio.get(rid, 0) + blob.shape[0]
        elif type(ev) is Routed:
            # The next most frequent: straight to the piece rule, likewise.
            rid = ev.request_id
            requests = self.requests
            old = requests.get(rid)
            if old is None or old.status in TERMINAL_STATUSES:
                requests[rid] = reduce_request(old, ev)  # raises, naming the reason
            else:
                requests[rid] = reduce_routed(old, ev)
            if ev.seq == 0:  # a stage's first piece occupies its replica (see below)
                self._by_worker.setdefault(worker_id(ev.stage, ev.replica), {})[rid] = None
        elif type(ev) is Released:
            self._release(ev)
        elif type(ev) is SessionChanged:
            pass  # a realtime session's state: no request's nor worker's
        elif type(ev) is Scaled:
            self._scaled(ev)
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
            # The worker index (``requests_on``): a stage's first piece
            # occupies its replica (above), the stage's end or the request's
            # frees it.  Every other kind is placed (``assert_never``); the
            # frequent ones by exact type first, as in ``reduce_request``.
            if type(ev) is StageStarted or type(ev) is Admitted:
                pass
            elif type(ev) is StageFinished:
                self._by_worker.get(worker_id(ev.stage, ev.replica), {}).pop(rid, None)
            else:
                match ev:
                    case Finished() | Failed() | Cancelled() | Rejected():
                        if new.status in TERMINAL_STATUSES:
                            self.ended.append(rid)
                            for st in new.stages:
                                by_worker = self._by_worker.get(worker_id(st.name, st.replica), {})
                                by_worker.pop(rid, None)
                    case StageFailed():
                        self._by_worker.get(worker_id(ev.stage, ev.replica), {}).pop(rid, None)
                    case Progress() | CancelRequested() | DeadlineExpired() | InputAppended():
                        pass  # no stage starts or ends (a cancelled one ends with its StageFinished)
                    case _:
                        assert_never(ev)
        self.next_pos = ev.pos + 1 if ev.pos >= 0 else self.next_pos + 1

    def _scaled(self, ev: Scaled) -> None:
        wid = worker_id(ev.stage, ev.replica)
        if ev.op == "left":
            # Validated first: an illegal one leaves the fold untouched.
            self.workers[wid] = reduce_left(self.workers.get(wid), ev, self.requests_on(wid))
            last = self.scaled.get(wid, ())
            self.scaled[wid] = (*last[:1], ev.pos)
        else:
            self.scaled[wid] = (ev.pos,)

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
            dict(self.scaled),
        )

    def digest(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        for rid in sorted(self.requests):
            h.update(state_bytes(self.requests[rid]))
        for wid in sorted(self.workers):
            h.update(_state_encoder.encode(self.workers[wid]))
        return h.hexdigest()


def worker_id(stage: str, replica: int) -> str:
    return f"{stage}/{replica}"


def fold(events: Iterable[Event], snapshot: Snapshot | None = None) -> Fold:
    f = Fold(snapshot)
    f.apply_all(events)
    return f
