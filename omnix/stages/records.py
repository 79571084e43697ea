"""What a worker reports, as log events: the runtime's receiving side.

Owns: ``deliver``, which turns one OUTPUTS message of a replica (its
``Record``s, in order) into the events handed to ``emit``: ``StageStarted``,
``Chunk`` (payloads stored in the blob store first), ``Progress``,
``StageFinished``, ``StageFailed``.  A ``Done`` or ``Error`` ends the
request's run on the replica and returns its credit, whether or not the
request was released; a released request's records emit nothing.

Does not own what the events mean (the orchestrator's), the credits
themselves (``credits.py``) nor the socket (``omnix.transport.inbox``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import assert_never

from omnix.events.blobs import BlobStore
from omnix.events.types import Chunk, Event, Progress, StageFailed, StageFinished, StageStarted
from omnix.stages.slots import Slot
from omnix.transport import messages as m


def deliver(
    slot: Slot,
    records: list[m.Record],
    blobs: BlobStore,
    emit: Callable[[Event], None],
    credit_back: Callable[[Slot], None],
) -> None:
    """Emit the events ``slot``'s worker reports in ``records``.
    ``credit_back(slot)`` runs when a request's end frees a credit that a
    deferred request waits for."""
    stage = slot.stage
    replica = slot.replica
    active = slot.active
    for rec in records:
        # Outputs, the common record, take one exact type test before the
        # match: measured with ``omnix bench hop`` (chunk events/s), the
        # match's class patterns cost ~70 ns more per record, a third of
        # this loop.
        if type(rec) is m.Output:
            rid = rec.request_id
            run = active.get(rid)
            if run is None or run.released:
                continue
            blob = None
            if rec.array is not None:
                blob = blobs.put_array(rec.array, rec.media_type)
            elif rec.data:
                blob = blobs.put(rec.data, rec.media_type)
            emit(
                Chunk(
                    request_id=rid,
                    stage=stage,
                    replica=replica,
                    index=rec.index,
                    modality=rec.modality,
                    text=rec.text,
                    token_ids=rec.token_ids,
                    blob=blob,
                    piece=rec.piece,
                    logprobs=rec.logprobs,
                    reasoning=rec.reasoning,
                    tool_calls=rec.tool_calls,
                )
            )
        elif not _other(slot, rec, blobs, emit, credit_back):
            continue
        if slot.state != "ready":
            return  # an event listener shut us down or lost the slot


def _other(
    slot: Slot,
    rec: m.Record,
    blobs: BlobStore,
    emit: Callable[[Event], None],
    credit_back: Callable[[Slot], None],
) -> bool:
    """Every record but an output (every kind is handled: a new one fails
    the type check at ``assert_never``); False when it emitted nothing
    because its request was released (or never ran here)."""
    rid = rec.request_id
    stage = slot.stage
    replica = slot.replica
    run = slot.active.get(rid)
    live = run is not None and not run.released
    match rec:
        case m.Output():  # the fast path in ``deliver``
            return True
        case m.Started():
            if live:
                emit(StageStarted(request_id=rid, stage=stage, replica=replica))
        case m.ProgressRec():
            if live:
                preview = blobs.put(rec.preview, rec.media_type) if rec.preview else None
                emit(
                    Progress(
                        request_id=rid,
                        stage=stage,
                        replica=replica,
                        step=rec.step,
                        total=rec.total,
                        blob=preview,
                    )
                )
        case m.Done():
            _ended(slot, rid, credit_back)
            if live:
                emit(
                    StageFinished(
                        request_id=rid,
                        stage=stage,
                        replica=replica,
                        chunks=rec.chunks,
                        finish_reason=rec.finish_reason,
                        prompt_tokens=rec.prompt_tokens,
                        output_tokens=rec.output_tokens,
                    )
                )
        case m.Error():
            _ended(slot, rid, credit_back)
            if live:
                emit(
                    StageFailed(
                        request_id=rid,
                        stage=stage,
                        replica=replica,
                        message=rec.message,
                        retry=rec.retry,
                    )
                )
        case _:
            assert_never(rec)
    return live


def _ended(slot: Slot, rid: str, credit_back: Callable[[Slot], None]) -> None:
    """The request's run on ``slot`` is over: its credit comes back."""
    slot.active.pop(rid, None)
    if slot.deferred:
        credit_back(slot)
