"""The folded state: what the reducer keeps per request and per worker.

Owns: ``RequestState``, ``StageState`` and ``WorkerState`` (frozen msgspec
Structs: a fold's snapshot is a shallow copy of its dicts, and its digest
the msgpack encoding of these in id order, so their fields are part of
every recorded digest: append fields with defaults, never reorder) and the
status vocabularies.  Does not own how a state changes (``reducer.py``,
``fold_runs.py``); this module is what readers of the fold (telemetry,
rendering, replay) and both fold paths share.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = [
    "ACTIVE_STAGE_STATUSES",
    "TERMINAL_STATUSES",
    "RequestState",
    "RequestStatus",
    "StageState",
    "StageStatus",
    "WorkerState",
]

RequestStatus = Literal[
    "admitted", "running", "cancelling", "finished", "cancelled", "failed", "rejected"
]
StageStatus = Literal["routed", "running", "finished", "failed", "aborted", "lost"]
TERMINAL_STATUSES = frozenset({"finished", "cancelled", "failed", "rejected"})
#: A stage in one of these still has its replica working on the request.
ACTIVE_STAGE_STATUSES = ("routed", "running")


class StageState(msgspec.Struct, frozen=True, array_like=True, gc=False):
    name: str
    replica: int
    status: StageStatus = "routed"
    pieces: int = 0  # Routed events received (input pieces)
    input_closed: bool = False
    chunks: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = ""
    routed_ts: int = 0
    started_ts: int = 0
    first_chunk_ts: int = 0
    last_chunk_ts: int = 0
    finished_ts: int = 0
    first_chunk_pos: int = -1
    last_chunk_pos: int = -1
    progress_step: int = 0
    progress_total: int = 0
    abort_sent: bool = False  # an abort has been asked of this stage
    attempt: int = 1  # > 1 after a retry on another replica
    last_activity_ts: int = 0  # last event of any kind from this stage

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STAGE_STATUSES


class RequestState(msgspec.Struct, frozen=True, array_like=True, gc=False):
    request_id: str
    status: RequestStatus
    pipeline: str
    admitted_pos: int
    admitted_ts: int
    outputs: tuple[str, ...]
    deadline_ns: int = 0
    stages: tuple[StageState, ...] = ()
    first_token_ts: int = 0  # first text chunk of any stage
    first_audio_ts: int = 0  # first audio chunk (TTFP)
    first_image_ts: int = 0
    cancel_reason: str = ""
    cancel_pos: int = -1
    terminal_pos: int = -1
    terminal_ts: int = 0
    terminal_type: str = ""
    reason: str = ""
    last_pos: int = -1
    events: int = 0
    cancel_ts: int = 0
    #: its source stages take more input (``InputAppended``) until a last piece
    input_open: bool = False

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def stage(self, name: str) -> StageState | None:
        for st in self.stages:
            if st.name == name:
                return st
        return None

    def active_stages(self) -> tuple[StageState, ...]:
        return tuple(st for st in self.stages if st.status in ACTIVE_STAGE_STATUSES)


class WorkerState(msgspec.Struct, frozen=True, array_like=True, gc=False):
    worker_id: str
    stage: str
    replica: int
    engine: str
    capacity: int
    alive: bool = True
    pid: int = 0
    joined_pos: int = -1
    lost_pos: int = -1
    lost_reason: str = ""
    incarnation: int = 1
