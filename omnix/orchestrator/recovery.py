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

A server killed with SIGKILL wrote no ``WorkerLost`` for its replicas; in
the recovered fold they are still joined, and the new process's workers
could never join over them.  The restart records their loss as inputs, so
the requests that were running on them get the orchestrator's usual
answer, and replay sees the restart.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

import msgspec

from omnix.events.reducer import Fold, IllegalTransition
from omnix.events.types import Event, RequestEvent, WorkerJoined, WorkerLost, is_decision
from omnix.orchestrator.decide import Orchestrator

#: ``WorkerLost.reason`` for the replicas of a process that did not stop cleanly
RESTART_REASON = "server restarted"


class RecoveryError(RuntimeError):
    """The recorded log cannot be taken over by this orchestrator."""


def recover(orchestrator: Orchestrator, events: Iterable[Event]) -> int:
    """Show ``events`` (a whole log, in order) to a fresh ``orchestrator``
    as the live sequencer did; returns how many events were shown.

    Raises ``RecoveryError`` naming the first position where the rules
    decide differently from the record (another rules version, or a log
    that a different pipeline config wrote)."""
    fold = Fold()
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
    if isinstance(about, RequestEvent):
        subject = about.request_id
    elif isinstance(about, (WorkerJoined, WorkerLost)):
        subject = about.worker_id
    else:
        subject = "retention"
    return RecoveryError(
        f"the log cannot be resumed: at {where} (request {subject}) the orchestrator decides "
        f"{decided} where the log records {recorded}; it was written under other decision "
        "rules or another pipeline config (start with an empty --log-dir, or look at it "
        "with `omnix replay`)"
    )
