"""The append loop: inputs in, decisions out, in one total order.

Owns: ``Sequencer``, the single writer that appends input events (from
clients, workers and timers) and then, synchronously and before anything
else can append, every decision the orchestrator derives from them, each of
which is shown to the orchestrator in turn.  That makes the log's order,
and so every decision, a function of the order of inputs alone; replay
drives the same class.

Does not own the decisions (``decide.py``) or their effects (listeners on
the log, ``dispatch.py``).

Late worker events (a chunk after the request was cancelled) are illegal
transitions; ``emit`` drops them and counts them instead of raising into
the runtime, which is what "work for a cancelled request that arrives late
is dropped" means at this layer.  Any other refused input is an error,
logged and counted, never silent.
"""

from __future__ import annotations

import logging
from collections import deque

from omnix.events.log import EventLog
from omnix.events.reducer import IllegalTransition
from omnix.events.types import Admitted, Event, Rejected, RequestEvent, RequestSpec
from omnix.orchestrator.decide import Orchestrator

log = logging.getLogger(__name__)


class Sequencer:
    def __init__(self, log: EventLog, orchestrator: Orchestrator) -> None:
        self.log = log
        self.orchestrator = orchestrator
        self.dropped = 0  # late worker events refused by the reducer
        self.refused_decisions = 0  # orchestrator bugs: logged, never silent
        self.refused_inputs = 0  # inputs the log refuses that are not late: logged
        self._busy = False
        self._backlog: deque[Event] = deque()

    def submit(self, request_id: str, spec: RequestSpec, ts_ns: int = 0) -> Admitted | Rejected:
        """Admit (or reject) a validated request; returns the appended event."""
        if self._busy:  # pragma: no cover - admission never runs inside a cascade
            raise RuntimeError("submit() called from inside an append cascade")
        decision = self.orchestrator.admit(self.log.state, request_id, spec, ts_ns)
        out = self._run(decision)
        assert isinstance(out, (Admitted, Rejected)), out  # the log returns what it stored
        return out

    def append(self, ev: Event) -> Event:
        """Append an input event and its consequences; raises on an illegal one."""
        if self._busy:
            # A listener (an effect) produced an input while a cascade runs:
            # it goes after the cascade, never inside it.
            self._backlog.append(ev)
            return ev
        return self._run(ev)

    def emit(self, ev: Event) -> None:
        """``append`` for worker and timer inputs: an illegal event is
        dropped, never raised into the caller.  A request event arriving
        after its request ended is expected (work in flight when an abort
        landed) and counted in ``dropped``; any other refusal means a
        component disagrees with the log, and is logged as an error and
        counted in ``refused_inputs``."""
        try:
            self.append(ev)
        except IllegalTransition as exc:
            self._refused_input(ev, exc)

    def _refused_input(self, ev: Event, exc: IllegalTransition) -> None:
        if isinstance(ev, RequestEvent):
            rs = self.log.state.requests.get(ev.request_id)
            if rs is not None and rs.terminal:
                self.dropped += 1
                log.debug("dropped late event: %s", exc)
                return
        self.refused_inputs += 1
        log.error("input event refused (nothing stored): %s", exc)

    def _run(self, ev: Event) -> Event:
        self._busy = True
        try:
            first = self._cascade(ev)
            while self._backlog:
                nxt = self._backlog.popleft()
                try:
                    self._cascade(nxt)
                except IllegalTransition as exc:
                    self._refused_input(nxt, exc)
            return first
        finally:
            self._busy = False

    def _cascade(self, ev: Event) -> Event:
        log_, orch = self.log, self.orchestrator
        first = log_.append(ev)
        decisions = orch.react(first, log_.state)
        if not decisions:
            return first  # most events (a streamed chunk) decide nothing
        todo: deque[Event] = deque()
        for decision in decisions:
            self._append_decision(decision, todo)
        while todo:
            cur = todo.popleft()
            for decision in orch.react(cur, log_.state):
                self._append_decision(decision, todo)
        return first

    def _append_decision(self, decision: Event, todo: deque[Event]) -> None:
        try:
            todo.append(self.log.append(decision))
        except IllegalTransition as exc:
            # A decision the reducer refuses is an orchestrator bug.
            # Dropping the rest of the cascade with it would lose legal
            # decisions (a request could then never end), so only this one
            # is skipped, loudly.
            self.refused_decisions += 1
            log.error("orchestrator decision refused (a bug; please report): %s", exc)
