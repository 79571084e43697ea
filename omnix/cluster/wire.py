"""What a frontend asks of the leader, and the answers, as msgspec values.

Owns: ``Call`` (the tagged union of a frontend's calls: admit a group,
cancel, more input, a realtime session's change, delete, profile, the
engines), ``Reply`` (the events it appended, or a ``CallError``),
``LeaderInfo`` (what the leader publishes beside its lease: where it
serves, the pipeline it runs, its engines) and their encoders.  Subjects
are named here too, one per log, so two omnix logs on one NATS never hear
each other.

A call carries everything the leader needs: the arrays a request's media
parts reference travel with its admission, a session change's audio with
the change (a frontend's blob store is a follower's, not the leader's).

Does not own sending (``remote``) or answering (``answerer``).
"""

from __future__ import annotations

from typing import Literal

import msgspec
import numpy as np

from omnix.events.blobs import BlobStore
from omnix.events.types import (
    Admitted,
    BlobRef,
    CancelReason,
    Rejected,
    RequestSpec,
    SessionChanged,
)
from omnix.orchestrator.scaling import StageReplicas
from omnix.pipelines.config import PipelineConfig
from omnix.transport.work import EngineInfo


class Blob(msgspec.Struct, frozen=True):
    """A blob's bytes and the reference they were stored under."""

    ref: BlobRef
    data: bytes

    @classmethod
    def of_array(cls, array: np.ndarray, media_type: str) -> Blob:
        from omnix.events.blobs import array_ref

        arr = np.ascontiguousarray(array)
        return cls(ref=array_ref(arr, media_type), data=arr.tobytes())

    def array(self) -> np.ndarray:
        """The array ``of_array`` was given (a read-only view of the bytes)."""
        return np.frombuffer(self.data, dtype=np.dtype(self.ref.dtype)).reshape(self.ref.shape)

    def store(self, blobs: BlobStore) -> None:
        """Put the bytes in ``blobs``: content addressing gives them the
        digest ``ref`` names, array or not."""
        blobs.put(self.data, self.ref.media_type)


class AdmitCall(msgspec.Struct, frozen=True, tag="admit"):
    members: tuple[tuple[str, RequestSpec], ...]
    media: tuple[Blob, ...] = ()


class CancelCall(msgspec.Struct, frozen=True, tag="cancel"):
    request_id: str
    reason: CancelReason = "client"


class InputCall(msgspec.Struct, frozen=True, tag="input"):
    request_id: str
    text: str
    last: bool = False
    #: a duplex session's user frame (``Omni.append_input``'s ``audio``)
    audio: Blob | None = None


class RecordCall(msgspec.Struct, frozen=True, tag="record"):
    event: SessionChanged
    blobs: tuple[Blob, ...] = ()


class DeleteCall(msgspec.Struct, frozen=True, tag="delete"):
    request_id: str


class ProfileCall(msgspec.Struct, frozen=True, tag="profile"):
    action: Literal["start", "stop"]
    stages: tuple[str, ...] = ()


class EnginesCall(msgspec.Struct, frozen=True, tag="engines"):
    pass


class ScaleCall(msgspec.Struct, frozen=True, tag="scale"):
    stage: str
    count: int


Call = (
    AdmitCall
    | CancelCall
    | InputCall
    | RecordCall
    | DeleteCall
    | ProfileCall
    | EnginesCall
    | ScaleCall
)

ErrorKind = Literal[
    "duplicate", "request", "shutting_down", "profiling_off", "value", "scale", "internal"
]


class CallError(msgspec.Struct, frozen=True, tag="error"):
    """What the leader refused, as the exception ``Omni`` raised: ``kind``
    names it, the rest rebuilds it on the frontend."""

    kind: ErrorKind
    message: str
    request_id: str = ""
    param: str | None = None
    code: str = "invalid_value"
    status: int = 0  # a refused scale's HTTP status


class Appended(msgspec.Struct, frozen=True, tag="appended"):
    """An admission's events (``AdmitCall``), or the one a call appended."""

    events: tuple[Admitted | Rejected, ...] = ()
    session: SessionChanged | None = None


class Done(msgspec.Struct, frozen=True, tag="done"):
    """A call that answers yes or no (cancel, input, delete)."""

    ok: bool


class Profiled(msgspec.Struct, frozen=True, tag="profiled"):
    reports: tuple[tuple[str, int, bool, str], ...]


class Engines(msgspec.Struct, frozen=True, tag="engines"):
    engines: tuple[tuple[str, int, EngineInfo], ...]


class Replicas(msgspec.Struct, frozen=True, tag="replicas"):
    replicas: StageReplicas


Reply = Appended | Done | Profiled | Engines | Replicas | CallError


class LeaderInfo(msgspec.Struct, frozen=True):
    """What a leader publishes with its lease (the lease's endpoints,
    ``LeaderLease``): its HTTP URL, where its workers connect, and the
    pipeline it serves (a frontend serves the same API for it)."""

    holder: str
    http_url: str
    workers_endpoint: str
    pipeline: PipelineConfig
    served_model_names: tuple[str, ...] = ()


_call_encoder = msgspec.msgpack.Encoder()
_call_decoder = msgspec.msgpack.Decoder(Call)
_reply_decoder = msgspec.msgpack.Decoder(Reply)


def encode(value: Call | Reply) -> bytes:
    return _call_encoder.encode(value)


def decode_call(data: bytes) -> Call:
    return _call_decoder.decode(data)


def decode_reply(data: bytes) -> Reply:
    return _reply_decoder.decode(data)


def calls_subject(log_name: str) -> str:
    """Where a log's leader answers its frontends' calls."""
    return f"omnix.{log_name}.calls"


def media_blobs(blobs: BlobStore, refs: list[BlobRef]) -> tuple[Blob, ...]:
    """The bytes of ``refs`` from a frontend's store, to travel with a call."""
    return tuple(Blob(ref=ref, data=blobs.get(ref)) for ref in refs)
