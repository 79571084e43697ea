"""How a stage execution ended, from its engine's last output.

Owns: ``ending``, the one judgement of a ``generate`` call that returned
(the worker's and the in-process test runtime's): the finish reason its
last output gives (``stop`` when it gave none), ``aborted`` when the
orchestrator had asked for the abort, and a failure when the engine ended
the request "aborted" on its own: that is no acknowledgement of anything,
and the stage did not finish, so it fails (and is retried, or the request
fails) rather than leaving the orchestrator waiting for a finish.  Does not
own how the ending travels (records, events).
"""

from __future__ import annotations

from omnix.transport.work import EngineOutput


def ending(
    last: EngineOutput | None, asked_abort: bool, stage: str, chunks: int
) -> tuple[str, str]:
    """``(finish_reason, "")`` for a finished execution, ``("", message)``
    for one that failed."""
    reason = (last.finish_reason if last is not None else "") or "stop"
    if asked_abort:
        return "aborted", ""
    if reason == "aborted":
        return "", (
            f"the engine of stage {stage!r} aborted the request on its own, after {chunks} "
            "chunks (nobody asked for an abort)"
        )
    return reason, ""
