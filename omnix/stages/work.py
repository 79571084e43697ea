"""The unit of work the orchestrator hands to a stage runtime.

Owns: ``WorkItem``, one input piece (or several) for one request on one
stage replica, as the orchestrator derives it from a ``Routed`` event.  Does
not own how it travels (``omnix.transport``) nor what runs it
(``omnix.stages.worker``).

``seq == 0`` starts the stage for the request (it takes one of the
replica's credits); later items stream more input into the running
``generate`` call (async chunk); ``last`` closes the input.  ``params`` are
already merged (stage defaults + request overrides): the worker does no
merging of its own.
"""

from __future__ import annotations

import msgspec

from omnix.events.types import StageParams
from omnix.stages.engine import InputPiece


class WorkItem(msgspec.Struct, frozen=True, array_like=True):
    request_id: str
    stage: str
    replica: int
    seq: int
    last: bool
    pieces: tuple[InputPiece, ...]
    params: StageParams = StageParams()
    seed: int = 0
