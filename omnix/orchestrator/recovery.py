"""Taking over a log that an earlier server process wrote.

Owns: ``recover``, which brings a fresh ``Orchestrator`` to where the
earlier process's orchestrator stood at the end of the log (its plans,
queues and replica loads), and ``restart_inputs``, the ``WorkerLost``
events a restarted server appends for the replicas the earlier process
left joined.  Does not own what those losses mean for the requests on
them (``decide.py``: retry or fail, as for any lost replica) nor reopening
the log itself (``omnix.events.disklog``).

The orchestrator's bookkeeping is derived from the events it is shown, in
the order the sequencer showed them: an input, then every decision of its
cascade, each shown once the decisions before it were appended.  So
``recover`` drives the recorded log through the orchestrator with the
same cascade structure, consuming each recorded decision where the live
sequencer would have appended it, and checks on the way that the rules
still make the decisions that were recorded.  The result is exactly the
state ``omnix replay --drive`` reaches on the same log.

``recover_log`` does it from the last idle point before the oldest request
still in flight (a position no earlier request was live across, as a
trace's window starts: ``omnix/trace.py``), not from position 0: there the
orchestrator's state is its replicas alone (no plan, no queue, no load),
so it is shown the worker events before that point and then the log from
it, checked decision by decision.  Reading is thus bounded by the requests
in flight and the retention window, not by history, and works on a log
whose ended requests retention released (their events are gone; a
``DiskLog`` reopened from a snapshot indexes only the retained suffix).
If retention released a request inside that stretch (it ended, but
overlapped one still in flight), the decisions there cannot be checked
nor re-derived: the orchestrator is then given the replicas and a bare
plan for each request in flight, and those requests are returned as not
resumable (the server fails them, ``not_resumed``) rather than continued
on a guess.

A server killed with SIGKILL wrote no ``WorkerLost`` for its replicas; in
the recovered fold they are still joined, and the new process's workers
could never join over them.  The restart records their loss as inputs, so
the requests that were running on them get the orchestrator's usual
answer, and replay sees the restart.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import assert_never

import msgspec

from omnix.events.log import EventLog
from omnix.events.reducer import TERMINAL_STATUSES, Fold, IllegalTransition
from omnix.events.types import (
    Admitted,
    Event,
    Released,
    RequestEvent,
    Scaled,
    SessionChanged,
    WorkerJoined,
    WorkerLost,
    is_decision,
)
from omnix.orchestrator.decide import Orchestrator

#: ``WorkerLost.reason`` for the replicas of a process that did not stop cleanly
RESTART_REASON = "server restarted"


class RecoveryError(RuntimeError):
    """The recorded log cannot be taken over by this orchestrator."""


class Recovered(msgspec.Struct, frozen=True):
    """What ``recover_log`` did."""

    #: events shown to the orchestrator (worker events before the start included)
    shown: int
    #: the log position it was shown from (0: the whole log)
    start: int
    #: requests in flight that cannot be resumed (see the module docstring)
    unresumable: tuple[str, ...] = ()


def recover_log(orchestrator: Orchestrator, log: EventLog) -> Recovered:
    """Bring a fresh ``orchestrator`` to the end of ``log`` (see the module
    docstring).  Raises ``RecoveryError`` as ``recover`` does."""
    state = log.state
    intervals = sorted(
        (
            rs.admitted_pos if rs.admitted_pos >= 0 else rs.terminal_pos,
            rs.terminal_pos if rs.status in TERMINAL_STATUSES else _INF,
        )
        for rs in state.requests.values()
    )
    live = [s for s, e in intervals if e >= _INF]
    n = log.next_pos
    start = n
    if live:
        # The last idle point at or before the oldest live request's start.
        oldest = min(live)
        max_end = -1
        for s, e in intervals:
            if s > oldest:
                break
            if max_end < s:
                start = s
            max_end = max(max_end, e)
    fold = Fold()
    shown = _show_workers(
        orchestrator, fold, [log.get(p) for p in log.worker_positions_before(start)]
    )
    if start >= n:
        return Recovered(shown=shown, start=start)
    window = list(log.read(start))
    if len(window) == n - start:
        return Recovered(shown=shown + recover(orchestrator, window, fold), start=start)
    # Retention released a request inside the window: nothing to check
    # the decisions against.  The replicas as the log leaves them, and a
    # bare plan per request in flight, which the server fails.
    shown += _show_workers(orchestrator, fold, (ev for ev in window if type(ev) in _WORKER))
    rids = []
    for rs in sorted(state.requests.values(), key=lambda r: r.admitted_pos):
        if rs.status in TERMINAL_STATUSES:
            continue
        adm = log.get(rs.admitted_pos)
        if type(adm) is Admitted:
            orchestrator.adopt(adm)
            rids.append(rs.request_id)
    return Recovered(shown=shown, start=start, unresumable=tuple(rids))


_INF = 1 << 62
_WORKER = (WorkerJoined, WorkerLost, Scaled)


def _show_workers(orchestrator: Orchestrator, fold: Fold, events: Iterable[Event]) -> int:
    """Fold and show worker events with no request in flight (they decide
    nothing then); one the fold refuses (an incarnation whose join was
    released) is skipped."""
    shown = 0
    for ev in events:
        try:
            fold.apply(ev)
        except IllegalTransition:
            continue
        orchestrator.react(ev, fold)
        shown += 1
    return shown


def recover(orchestrator: Orchestrator, events: Iterable[Event], fold: Fold | None = None) -> int:
    """Show ``events`` (a whole log, or from an idle point on with the
    worker events before it already in ``fold``), in order, to a fresh
    ``orchestrator`` as the live sequencer did; returns how many events
    were shown.

    Raises ``RecoveryError`` naming the first position where the rules
    decide differently from the record (another rules version, or a log
    that a different pipeline config wrote)."""
    fold = fold if fold is not None else Fold()
    it: Iterator[Event] = iter(events)
    ahead: Event | None = None  # a recorded event read but not yet consumed
    shown = 0
    while True:
        first = ahead if ahead is not None else next(it, None)
        ahead = None
        if first is None:
            return shown
        if is_decision(first):
            # Every recorded decision is consumed inside its cascade; one
            # left over is one these rules do not make.
            raise _diverged(first.pos, "no decision", type(first).__name__, first)
        fold.apply(first)
        todo: deque[Event] = deque((first,))
        while todo:
            cur = todo.popleft()
            shown += 1
            for decision in orchestrator.react(cur, fold):
                recorded = ahead if ahead is not None else next(it, None)
                ahead = None
                if recorded is not None and _same_decision(decision, recorded):
                    fold.apply(recorded)
                    todo.append(recorded)
                    continue
                ahead = recorded
                if _refused(fold, decision):
                    continue  # the live sequencer refused it too, and logged it
                raise _diverged(
                    -1 if recorded is None else recorded.pos,
                    type(decision).__name__,
                    "nothing" if recorded is None else type(recorded).__name__,
                    decision,
                )


def restart_inputs(state: Fold) -> list[WorkerLost]:
    """A ``WorkerLost`` for every replica the log still holds as joined, in
    worker id order (a decision input: its order must not depend on a
    dict's history)."""
    return [
        WorkerLost(worker_id=wid, stage=ws.stage, replica=ws.replica, reason=RESTART_REASON)
        for wid, ws in sorted(state.workers.items())
        if ws.alive
    ]


def _same_decision(decided: Event, recorded: Event) -> bool:
    # A decision is made without a position and stamped with its cause's
    # time; the log adds the position.
    return type(decided) is type(recorded) and decided == msgspec.structs.replace(
        recorded, pos=decided.pos
    )


def _refused(fold: Fold, decision: Event) -> bool:
    """Whether the reducer refuses ``decision`` here (the fold is left as
    it was when it does, and would have to be rebuilt when it does not:
    the caller raises then)."""
    try:
        fold.apply(decision)
    except IllegalTransition:
        return True
    return False


def _diverged(pos: int, decided: str, recorded: str, about: Event) -> RecoveryError:
    where = "the end of the log" if pos < 0 else f"pos {pos}"
    match about:
        case RequestEvent():
            subject = about.request_id
        case WorkerJoined() | WorkerLost():
            subject = about.worker_id
        case Released():
            subject = "retention"
        case SessionChanged():
            subject = about.session
        case Scaled():
            subject = f"scaling of {about.stage}"
        case _:
            assert_never(about)
    return RecoveryError(
        f"the log cannot be resumed: at {where} (request {subject}) the orchestrator decides "
        f"{decided} where the log records {recorded}; it was written under other decision "
        "rules or another pipeline config (start with an empty --log-dir, or look at it "
        "with `omnix replay`)"
    )
