"""When a cancelled request ends.

Owns: ``cancelled_once_idle`` (a request being cancelled ends, ``Cancelled``,
once no stage of it is active: every abort was acknowledged, or its stage
was lost or failed meanwhile) and ``cancelled``, the event itself, with the
reason the request's ``CancelRequested`` recorded.

Does not own asking for a cancel (clients, the deadline: ``deadlines.py``),
sending the aborts (``dispatch.py``), nor giving up on the
acknowledgements (``deadlines.py``: the ``abort`` timeout).
"""

from __future__ import annotations

from typing import get_args

from omnix.events.reducer import RequestState
from omnix.events.types import Cancelled, CancelReason, Event

__all__ = ["cancelled", "cancelled_once_idle"]

#: The fold keeps a request's cancel reason as a plain ``str``; this maps it
#: back to the ``CancelReason`` it was recorded as.
_CANCEL_REASONS: dict[str, CancelReason] = {r: r for r in get_args(CancelReason)}


def cancelled(rs: RequestState, ts_ns: int, cause: int) -> Cancelled:
    """``rs``'s ending as cancelled, for the reason its cancel recorded."""
    return Cancelled(
        request_id=rs.request_id,
        ts_ns=ts_ns,
        reason=_CANCEL_REASONS[rs.cancel_reason],
        cause=cause,
    )


def cancelled_once_idle(rs: RequestState, ev: Event) -> list[Event]:
    """After ``ev``, a request being cancelled ends once none of its stages
    is active; its ``Cancelled`` is caused by its ``CancelRequested``."""
    if rs.active_stages():
        return []
    return [cancelled(rs, ev.ts_ns, rs.cancel_pos)]
