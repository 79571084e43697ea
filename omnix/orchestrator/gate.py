"""The runtime's events held while its server may not append.

Owns: ``EmitGate``, the ``emit`` a runtime is built with.  Open, it passes
each event straight to the sequencer.  Closed, it keeps them in order, for
a standby server (``omnix serve --log nats://... --standby``) whose
workers start and join while another server leads the log: the standby
follows the log and may not append, yet its replicas must be ready the
moment it takes over.  ``open`` (at the takeover, after the losses of the
old leader's replicas are in the log) appends what was held, in the order
it came, then passes everything on.

Does not own when a server may append (the lease, ``omnix.http.serve_cluster``)
nor the events themselves (the runtime's).
"""

from __future__ import annotations

from collections.abc import Callable

from omnix.events.types import Event


class EmitGate:
    """``emit`` for a runtime: passes events on, or holds them until ``open``."""

    def __init__(self, emit: Callable[[Event], None], *, held: bool = False) -> None:
        self._emit = emit
        self._held: list[Event] | None = [] if held else None

    @property
    def holding(self) -> bool:
        return self._held is not None

    def __call__(self, ev: Event) -> None:
        if self._held is not None:
            self._held.append(ev)
        else:
            self._emit(ev)

    def open(self) -> int:
        """Pass on what was held, in order, and everything from now on;
        how many events were held."""
        held, self._held = self._held, None
        for ev in held or ():
            self._emit(ev)
        return len(held or ())
