"""Retention: how long an ended request's events, blobs and state are kept.

Owns: ``RetentionPolicy`` (the three bounds), ``Retention`` (the log's
observer that counts what each retained request holds; between appends it
decides when ended requests are released and appends the ``Released``
event that records it; it
deletes the blobs no retained event refers to, and answers "was this id
released?"), and the accounting it snapshots.  Does not own dropping the
events (the log does it when a ``Released`` is stored: ``log.py``,
``disklog.py``), dropping the folded state (the reducer does:
``Fold.apply``), nor snapshot files and segment deletion (``disklog.py``,
``snapshot.py``).

The decision is a function of the log prefix and the policy, never of a
clock read in here (bar ``sweep``, below) nor of dict order:

* requests are considered in the order they ended (their terminal event's
  position), oldest first, and only ended ones: the reducer refuses a
  ``Released`` naming a request in flight;
* after an event that makes a release due (the log shows retention only
  admissions, terminal events, chunks and progress events that carry a blob
  and server events,
  ``log.OBSERVED_TYPES``: the time bound is compared at those, and by
  ``sweep``): ``time`` once the oldest
  ended request's terminal ``ts_ns`` is ``window_s`` plus 1/64 of it
  before the event's ``ts_ns``, then every ended request ``window_s`` or
  more before it; ``count`` once more than ``max_requests`` have ended,
  then the oldest down to ``max_requests`` less 1/64 of it; ``bytes``
  likewise against ``max_bytes``.  So a request is kept at least the
  window and at most 1/64 longer, after a decision no more than
  ``max_requests`` ended requests are held, nor more than ``max_bytes``
  counted (unless requests in flight alone hold more: they are never
  released), and a busy server appends one ``Released`` per ~1/64 of a
  bound rather than one per request.  Each reason that releases something
  appends one ``Released`` stamped with that event's ``ts_ns``, between
  appends (once every listener has seen the event).
* An idle server appends nothing, so nothing would ever be old enough:
  ``sweep()`` (call it every second or so) reads the log's clock once and,
  when ended requests are due by then, appends ``Released(reason="time")``
  stamped with that reading.  That event is an input whose timestamp is
  what matters: the ids it names are the ended requests whose terminal
  ``ts_ns`` is ``window_s`` or more before its own, a function of the log.

So replaying a log through a fresh ``Retention`` with the same policy
derives the same ``Released`` events at the same places (the tests check
it).  Bytes are counted as an event's approximate encoded size (an
admission by its prompt and messages, which can be large; a fixed size per
other event), plus each distinct blob once, whoever references it.

Released ids stay answerable as released (HTTP 410 rather than 404) while
they are among the last ``tombstones`` released (default 100,000, ~100
bytes each); older ones become unknown.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Literal

import msgspec

from omnix.events.blobs import BlobStore
from omnix.events.log import OBSERVED_TYPES, EventLog
from omnix.events.snapshot import RequestAccount, RetentionState
from omnix.events.state import TERMINAL_STATUSES
from omnix.events.types import (
    Admitted,
    BlobRef,
    Cancelled,
    Chunk,
    Event,
    Failed,
    Finished,
    InputAppended,
    Progress,
    Rejected,
    Released,
    ReleaseReason,
    RequestSpec,
)

__all__ = ["Retention", "RetentionPolicy", "RequestStatusKind"]

RequestStatusKind = Literal["retained", "released", "unknown"]

_INF = 1 << 62
_BATCH = 64
#: The event types retention's accounting reads besides chunks with blobs.
_COUNTED: frozenset[type] = frozenset((Admitted, Rejected, Finished, Failed, Cancelled, Released))
# Approximate encoded sizes: msgpack array header, tag, pos, ts, request id
# (its length is added per request), the fields of the type.
_EVENT_BASE = 36
_ADMIT_BASE = 120


class RetentionPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """When ended requests are released: whichever bound passes first.

    ``None`` turns a bound off.  Defaults: 10 minutes, 2,000 ended
    requests, 512 MB of retained events and blobs.
    """

    #: seconds after a request's terminal event (log timestamps)
    window_s: float | None = 600.0
    #: ended requests retained at most
    max_requests: int | None = 2000
    #: retained events (approximate encoded bytes) plus blobs, at most
    max_bytes: int | None = 512 << 20
    #: released ids remembered as released (beyond: unknown)
    tombstones: int = 100_000

    def __post_init__(self) -> None:
        if self.window_s is not None and not self.window_s >= 0:
            raise ValueError(
                f"window_s must be >= 0 seconds (or None: no time bound), got {self.window_s}"
            )
        if self.max_requests is not None and self.max_requests < 0:
            raise ValueError(f"max_requests must be >= 0 (or None), got {self.max_requests}")
        if self.max_bytes is not None and self.max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 (or None), got {self.max_bytes}")
        if self.tombstones < 0:
            raise ValueError(f"tombstones must be >= 0, got {self.tombstones}")


class _Req:
    """One retained request's accounting."""

    __slots__ = ("blobs", "ended_ts", "events", "id_len", "nbytes")

    def __init__(self, id_len: int) -> None:
        self.id_len = id_len
        self.events = 0
        self.nbytes = 0
        self.blobs: list[tuple[str, int]] = []
        self.ended_ts = 0


#: The typed response options of an admission, about (a few fields of a
#: few bytes each: as much as the eight or so strings they replace).
_RESPONSE_BYTES = 256


def _admission_bytes(spec: RequestSpec, id_len: int) -> int:
    # The prompt and messages dominate an admission's size; options and
    # stage parameters are a few dozen bytes each.
    n = _ADMIT_BASE + id_len + len(spec.prompt)
    for m in spec.messages:
        n += 8 + len(m.content) + 60 * len(m.media)
    if spec.options:  # recorded by schema v5 or older (and read into ``response``)
        n += 32 * len(spec.options)
    elif spec.response is not None:
        n += _RESPONSE_BYTES
    if spec.raw_prompt is not None:
        n += 4 * len(spec.raw_prompt.token_ids)
    return n + 32 * len(spec.stage_params)


def _spec_blobs(spec: RequestSpec) -> list[BlobRef]:
    return [part.blob for m in spec.messages for part in m.media]


class Retention:
    """Counts retained requests, releases ended ones past the policy.

    ``Retention(log, policy, blobs)`` attaches at once: it takes over the
    accounting a ``DiskLog`` reopened from a snapshot carries and reads the
    events after it (a log without one is read whole), then observes every
    append.  Its accounting runs inside ``append`` as the log's observer
    (a plain call, before the listeners; it never appends); its decisions
    run between appends, once the listeners have seen the event that made
    something due (``EventLog.add_housekeeper``).  ``append`` is how its
    ``Released`` events enter the log: ``log.append`` by default; a server
    passes its ``Sequencer.append`` so that a release never lands inside a
    decision cascade (the sequencer queues it after the cascade).
    ``blobs``: the store whose blobs the released requests' events
    referenced; ``None`` leaves blobs alone.
    """

    def __init__(
        self,
        log: EventLog,
        policy: RetentionPolicy | None = None,
        blobs: BlobStore | None = None,
        *,
        append: Callable[[Event], object] | None = None,
    ) -> None:
        self.log = log
        self.policy = policy or RetentionPolicy()
        self.blobs = blobs
        if blobs is not None:
            blobs.take_fresh()  # from now on the store remembers what is put
        self._append = append or log.append
        p = self.policy
        self._window_ns = _INF if p.window_s is None else int(p.window_s * 1e9)
        self._max_n = _INF if p.max_requests is None else p.max_requests
        self._max_b = _INF if p.max_bytes is None else p.max_bytes
        # Releases come in batches (one Released per about 1/64 of a bound,
        # not one per request): a release is due once a bound is passed by
        # its slack, or the count or bytes bound at all, and then releases
        # everything past the bound, or down to the bound less the slack.
        self._slack_ns = 0 if self._window_ns >= _INF else self._window_ns // _BATCH
        self._low_n = self._max_n - (0 if self._max_n >= _INF else self._max_n // _BATCH)
        self._low_b = self._max_b - (0 if self._max_b >= _INF else self._max_b // _BATCH)
        self._reqs: dict[str, _Req] = {}  # retained: in flight and ended
        self._ended: deque[str] = deque()  # ended, not yet decided, oldest first
        self._pending: dict[str, _Req] = {}  # decided; their Released not stored yet
        self._refs: dict[str, list[int]] = {}  # digest -> [references, nbytes]
        self._deferred: set[str] = set()  # unreferenced, put again lately: retry
        self._tombs: dict[str, None] = {}
        self._events = 0  # events of the ended retained requests
        self._bytes = 0  # admissions of all, every event of the ended ones
        self._blob_bytes = 0
        self._due_ns = _INF  # oldest undecided ended request's release time
        self._due_at = -1  # the latest timestamp of an event that made a decision due
        self._restoring = False
        self.released_total = 0
        self.releases = 0  # Released events observed
        self._restore()
        log.set_observer(self._observe)
        log.add_housekeeper(self._housekeep)
        log.released = self.is_released
        if self._ended and (len(self._ended) > self._max_n or self._over_bytes()):
            self._due(self._due_at)

    # -- the answers the server needs -------------------------------------
    def status(self, request_id: str) -> RequestStatusKind:
        """``retained`` (its state is in the fold), ``released`` (among the
        remembered tombstones) or ``unknown``."""
        if request_id in self.log.state.requests:
            return "retained"
        if request_id in self._tombs:
            return "released"
        return "unknown"

    def is_released(self, request_id: str) -> bool:
        return request_id in self._tombs and request_id not in self.log.state.requests

    # -- counters (plain properties: telemetry reads them) -----------------
    @property
    def retained_events(self) -> int:
        """Request events held for retained requests (in flight and ended)."""
        return sum(rs.events for rs in self.log.state.requests.values())

    @property
    def retained_bytes(self) -> int:
        """Their approximate encoded bytes."""
        held = self.log.state.requests
        extra = 0
        for rid, r in self._reqs.items():
            if not r.ended_ts:
                rs = held.get(rid)
                if rs is not None:
                    extra += (rs.events - 1) * (_EVENT_BASE + r.id_len)
        return self._bytes + extra

    @property
    def blobs_retained_bytes(self) -> int:
        """Bytes of the distinct blobs retained events refer to."""
        return self._blob_bytes

    @property
    def requests_retained(self) -> int:
        """Requests whose events and state are held (in flight and ended)."""
        return len(self.log.state.requests)

    @property
    def requests_ended_retained(self) -> int:
        return len(self._ended) + len(self._pending)

    @property
    def tombstones(self) -> int:
        return len(self._tombs)

    def close(self) -> None:
        """Stop observing the log."""
        if self.log._observer == self._observe:
            self.log.set_observer(None)
        if self._housekeep in self.log._housekeepers:
            self.log.remove_housekeeper(self._housekeep)
        if self.log.released == self.is_released:
            self.log.released = lambda _rid: False

    # -- the idle trigger -----------------------------------------------------
    def sweep(self) -> Released | None:
        """Release what the time bound makes due by the log clock's reading
        now, as one ``Released(reason="time")`` stamped with that reading
        (an input: see the module docstring).  Returns it, or ``None`` when
        nothing is due.  The server calls it every second or so."""
        if not self._ended or self._window_ns >= _INF:
            return None
        now = self.log.clock.now_ns()
        if now < self._due_ns:
            return None
        ids = self._take_due(now)
        if not ids:
            return None
        ev = Released(request_ids=tuple(ids), reason="time", ts_ns=now)
        self.log.before_release()
        self._append(ev)
        return ev

    # -- observing the log ------------------------------------------------------
    def _observe(self, ev: Event) -> None:
        # The log's observer (see OBSERVED_TYPES: the events that change
        # what is counted here; the time bound is compared at them).
        if type(ev) is Chunk or type(ev) is Progress or type(ev) is InputAppended:
            blob = ev.blob
            r = self._reqs.get(ev.request_id)
            if blob is not None and r is not None:
                digest = blob.digest
                r.blobs.append((digest, blob.nbytes))
                ref = self._refs.get(digest)
                if ref is not None:
                    ref[0] += 1  # a blob already counted: no bound moves
                    return
                self._refs[digest] = [1, blob.nbytes]
                self._blob_bytes += blob.nbytes
                if self._bytes + self._blob_bytes > self._max_b and self._ended:
                    self._due(ev.ts_ns)
        elif type(ev) in _COUNTED:
            if type(ev) is Released:
                self._apply_released(ev)
                return
            self._on_request(ev)
        if ev.ts_ns >= self._due_ns:
            self._due(ev.ts_ns)

    def _on_request(self, ev: Event) -> None:
        if type(ev) is Admitted or type(ev) is Rejected:
            rid = ev.request_id
            r = self._reqs[rid] = _Req(len(rid))
            r.nbytes = _admission_bytes(ev.spec, r.id_len)
            self._bytes += r.nbytes
            for b in _spec_blobs(ev.spec):
                self._ref(r, b.digest, b.nbytes)
            if type(ev) is Rejected:
                self._end(r, rid, ev.ts_ns)
        elif type(ev) is Finished or type(ev) is Failed or type(ev) is Cancelled:
            rid = ev.request_id
            found = self._reqs.get(rid)
            if found is not None:
                self._end(found, rid, ev.ts_ns)

    def _end(self, r: _Req, rid: str, ts: int) -> None:
        rs = self.log.state.requests[rid]  # folded before the observer runs
        r.events = rs.events
        rest = (rs.events - 1) * (_EVENT_BASE + r.id_len)
        r.nbytes += rest
        self._bytes += rest
        self._events += rs.events
        r.ended_ts = ts
        if not self._ended:
            self._due_ns = ts + self._window_ns + self._slack_ns
        self._ended.append(rid)
        if len(self._ended) > self._max_n or self._over_bytes():
            self._due(ts)

    def _over_bytes(self) -> bool:
        return self._bytes + self._blob_bytes > self._max_b

    def _due(self, ts: int) -> None:
        if ts > self._due_at:
            self._due_at = ts
        if not self._restoring:
            self.log._maint_due = True

    def _ref(self, r: _Req, digest: str, nbytes: int) -> None:
        r.blobs.append((digest, nbytes))
        ref = self._refs.get(digest)
        if ref is None:
            self._refs[digest] = [1, nbytes]
            self._blob_bytes += nbytes
        else:
            ref[0] += 1

    # -- deciding -----------------------------------------------------------------
    def _housekeep(self) -> None:
        if self._due_at >= 0:
            ts, self._due_at = self._due_at, -1
            self._decide(ts)

    def _decide(self, ts: int) -> None:
        out: list[tuple[ReleaseReason, list[str]]] = []
        ids = self._take_due(ts)
        if ids:
            out.append(("time", ids))
        ids = []
        if len(self._ended) > self._max_n:
            while len(self._ended) > self._low_n:
                ids.append(self._take_oldest())
        if ids:
            out.append(("count", ids))
        ids = []
        if self._over_bytes():
            while self._ended and self._bytes + self._blob_bytes > self._low_b:
                ids.append(self._take_oldest())
        if ids:
            out.append(("bytes", ids))
        if out:
            self.log.before_release()
        for reason, rids in out:
            self._append(Released(request_ids=tuple(rids), reason=reason, ts_ns=ts))

    def _take_due(self, ts: int) -> list[str]:
        ids = []
        limit = ts - self._window_ns
        reqs = self._reqs
        while self._ended and reqs[self._ended[0]].ended_ts <= limit:
            ids.append(self._take_oldest())
        return ids

    def _next_due(self) -> int:
        """When the time bound next releases something (with its slack)."""
        if not self._ended or self._window_ns >= _INF:
            return _INF
        return self._reqs[self._ended[0]].ended_ts + self._window_ns + self._slack_ns

    def _take_oldest(self) -> str:
        """Decide the oldest ended request: it leaves the counters now and its
        blobs and tombstone wait for its ``Released`` to be stored."""
        rid = self._ended.popleft()
        self._decided(rid)
        self._due_ns = self._next_due()
        return rid

    def _decided(self, rid: str) -> None:
        r = self._reqs.pop(rid)
        self._pending[rid] = r
        self._events -= r.events
        self._bytes -= r.nbytes
        self._unref(r)

    # -- a client's deletion -------------------------------------------------------
    def delete(self, request_ids: tuple[str, ...]) -> Released | None:
        """Release these ended requests now because a client deleted them
        (``DELETE /v1/videos/{id}``): one ``Released(reason="deleted")``
        stamped with the log clock's reading, an input as a sweep's is.
        Ids not ended or not retained are left alone; None when none is
        left to release.  Call it between appends (not from a listener)."""
        ended = set(self._ended)
        ids = [rid for rid in dict.fromkeys(request_ids) if rid in ended]
        if not ids:
            return None
        gone = set(ids)
        self._ended = deque(rid for rid in self._ended if rid not in gone)
        for rid in ids:
            self._decided(rid)
        self._due_ns = self._next_due()
        ev = Released(request_ids=tuple(ids), reason="deleted", ts_ns=self.log.clock.now_ns())
        self.log.before_release()
        self._append(ev)
        return ev

    def _unref(self, r: _Req) -> None:
        refs = self._refs
        for digest, nbytes in r.blobs:
            ref = refs[digest]
            ref[0] -= 1
            if ref[0] == 0:
                del refs[digest]
                self._blob_bytes -= nbytes
                self._deferred.add(digest)

    def _apply_released(self, ev: Released) -> None:
        self.releases += 1
        ended_gone = False
        for rid in ev.request_ids:
            r = self._pending.pop(rid, None)
            if r is None:
                # Replayed (a reopen): the accounting still holds it.
                r = self._reqs.pop(rid, None)
                if r is not None:
                    self._events -= r.events
                    self._bytes -= r.nbytes
                    self._unref(r)
                    ended_gone = True
            self.released_total += 1
            self._tomb(rid)
        if ended_gone:
            self._ended = deque(rid for rid in self._ended if rid in self._reqs)
            self._due_ns = self._next_due()
        self._collect_blobs()

    def _tomb(self, rid: str) -> None:
        tombs = self._tombs
        tombs[rid] = None
        cap = self.policy.tombstones
        while len(tombs) > cap:
            del tombs[next(iter(tombs))]

    def _collect_blobs(self) -> None:
        """Delete the blobs no retained event refers to, unless put again
        since the last collection (a worker may be about to refer to it)."""
        if self.blobs is None:
            self._deferred.clear()
            return
        # Put since the previous release: possibly about to be referred to.
        fresh = self.blobs.take_fresh()
        if not self._deferred:
            return
        keep: set[str] = set()
        for digest in sorted(self._deferred):
            if digest in self._refs:
                continue  # referenced again meanwhile
            if digest in fresh:
                keep.add(digest)
                continue
            self.blobs.delete(digest)
        self._deferred = keep

    # -- snapshots and reopening -------------------------------------------------
    def state(self) -> RetentionState:
        """The accounting as a snapshot holds it.  Requests decided but whose
        ``Released`` is not stored yet are still retained as far as the log
        is concerned: they go back at the front of the ended ones."""

        def account(rid: str, r: _Req) -> RequestAccount:
            return RequestAccount(rid, r.events, r.nbytes, tuple(r.blobs), r.ended_ts)

        inflight = [account(rid, r) for rid, r in self._reqs.items() if not r.ended_ts]
        ended = [account(rid, r) for rid, r in self._pending.items()]
        ended += [account(rid, self._reqs[rid]) for rid in self._ended]
        return RetentionState(requests=(*inflight, *ended), tombstones=tuple(self._tombs))

    def _restore(self) -> None:
        log = self.log
        loaded = log.loaded_retention
        start = 0
        if loaded is not None:
            start = log.snapshot_pos
            for acct in loaded.requests:
                r = self._reqs[acct.request_id] = _Req(len(acct.request_id))
                r.events = acct.events
                r.nbytes = acct.nbytes
                r.ended_ts = acct.ended_ts
                if acct.ended_ts:
                    self._events += acct.events
                self._bytes += acct.nbytes
                for digest, nbytes in acct.blobs:
                    self._ref(r, digest, nbytes)
                if acct.ended_ts:
                    self._ended.append(acct.request_id)
            for rid in loaded.tombstones:
                self._tomb(rid)
            self._due_ns = self._next_due()
        log.retention_state = self.state  # a disk log's snapshots carry it
        # Events after the snapshot (a log without one: all of it) are
        # observed as they were appended, deciding nothing: a Released the
        # earlier process decided is in them; one it had not appended yet
        # is decided by the next append or sweep.
        self._restoring = True
        try:
            observe = self._observe
            for ev in log.read(start):
                if type(ev) is Chunk or type(ev) is Progress or type(ev) is InputAppended:
                    if ev.blob is not None:
                        observe(ev)
                elif type(ev) in OBSERVED_TYPES:
                    observe(ev)
        finally:
            self._restoring = False
        # An ended request the fold no longer holds was released by an event
        # read above; one still ended here but released in the fold cannot be.
        held = log.state.requests
        self._ended = deque(
            rid for rid in self._ended if rid in held and held[rid].status in TERMINAL_STATUSES
        )
