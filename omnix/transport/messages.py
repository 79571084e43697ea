"""The stage protocol: every message between the runtime and its workers.

Owns: the message types (one byte each, the first frame of a message), the
msgspec Structs of their bodies, the batched output records a worker sends,
``PROTOCOL_VERSION`` and one typed decoder per message type.  Does not own
sockets (``sockets.py``), encoding rules (``codec.py``) or what either side
does with a message (``omnix.stages.runtime``, ``omnix.stages.worker``).

Conversation (worker DEALER -> server ROUTER, one endpoint)::

    worker                              server
    HELLO(stage, replica|-1, pid, token, auth) ->
                                     <- WELCOME(replica, StageConfig, timings)
                                        or REFUSED(reason)   (worker exits 2)
    [heartbeat thread starts: HEARTBEAT -> / <- HEARTBEAT_ACK, own socket]
    [loads its engine: load_engine(kind, cfg.engine); start()]
    READY(engine info) ->               emits WorkerJoined
                                     <- WORK([WorkItem, ...]) / ABORT(request_id)
    OUTPUTS([Started|Output|ProgressRec|Done|Error, ...]) ->
                                     <- PROFILE(start|stop)  (omnix serve --profile-dir)
    PROFILED(ok, detail) ->
    GOODBYE(reason) ->                  (on a clean exit)
                                     <- SHUTDOWN

Compatibility: bodies are ``array_like`` Structs; a field may only be
appended with a default.  A HELLO whose ``protocol`` differs from ours is
refused with a message naming both versions.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
import numpy as np

from omnix.events.types import Modality, TokenLogprob, ToolCallDelta
from omnix.pipelines.config import StageConfig
from omnix.transport.codec import FrameDecoder
from omnix.transport.work import WorkItem

# 2: WORK carries a list of WorkItems; 3: PROFILE/PROFILED; 4: WorkItem.feeds;
# 5: READY carries the engine's settings, a stage its devices and engine_args;
# 6: ProgressRec.preview (a partial image)
PROTOCOL_VERSION = 6

# -- message type bytes (first frame) ---------------------------------------
HELLO = b"H"
WELCOME = b"C"
REFUSED = b"N"
READY = b"R"
START_FAILED = b"X"
OUTPUTS = b"O"
GOODBYE = b"G"
HEARTBEAT = b"B"
HEARTBEAT_ACK = b"b"
WORK = b"W"
ABORT = b"A"
SHUTDOWN = b"S"
PROFILE = b"P"
PROFILED = b"p"

_MSG = dict(frozen=True, array_like=True, gc=False)


class Hello(msgspec.Struct, **_MSG):
    """First message of a worker.  ``replica == -1`` asks the server to
    assign a free one.  ``token`` names this worker incarnation: heartbeats
    carry it, and a spawned worker gets it from the server (env var) so the
    server can tell its own child from a stranger.  ``auth`` is the shared
    worker token (``--worker-token``) a server started with one requires."""

    protocol: int
    stage: str
    replica: int
    pid: int
    token: str
    host: str = ""
    auth: str = ""


class Welcome(msgspec.Struct, frozen=True, array_like=True):
    """The server's answer: which replica this worker is, the stage's whole
    config (a hand-started worker needs only ``--connect`` and ``--stage``)
    and the liveness timings both sides use."""

    replica: int
    config: StageConfig
    pipeline: str
    heartbeat_interval_s: float
    server_lost_after_s: float
    #: where this replica writes profiler traces (``DIR/<stage>/<replica>``)
    #: when the server profiles (``omnix serve --profile-dir``); "" when it
    #: does not: engines that profile themselves set up for it at start
    profile_dir: str = ""


class Refused(msgspec.Struct, **_MSG):
    """The server will not take this worker; ``reason`` says why and what to do."""

    reason: str


class Ready(msgspec.Struct, **_MSG):
    """The engine is loaded; ``capacity`` concurrent requests may be sent."""

    token: str
    engine: str
    capacity: int
    device: str = "cpu"
    model: str = ""
    #: ``EngineInfo.settings``: the engine's configuration as it resolved it
    settings: dict[str, Any] = {}


class StartFailed(msgspec.Struct, **_MSG):
    """The engine could not be loaded; the worker exits after sending this."""

    token: str
    message: str


class Goodbye(msgspec.Struct, **_MSG):
    """The worker is exiting on purpose (signal, shutdown, server lost)."""

    token: str
    reason: str


class Heartbeat(msgspec.Struct, **_MSG):
    token: str
    active: int = 0


class HeartbeatAck(msgspec.Struct, **_MSG):
    pass


class Abort(msgspec.Struct, **_MSG):
    request_id: str


class Shutdown(msgspec.Struct, **_MSG):
    reason: str = ""


ProfileAction = Literal["start", "stop"]


class Profile(msgspec.Struct, **_MSG):
    """Start or stop profiling this worker (into ``Welcome.profile_dir``)."""

    action: ProfileAction


class Profiled(msgspec.Struct, **_MSG):
    """A worker's answer to ``Profile``: ``detail`` is where the traces go
    (start) or the files written (stop), or what went wrong."""

    token: str
    action: ProfileAction
    ok: bool
    detail: str


# -- output records (worker -> server, several per OUTPUTS message) -----------
_REC = dict(frozen=True, array_like=True, gc=False, tag_field="k")


class Started(msgspec.Struct, tag="s", **_REC):
    request_id: str


class Output(msgspec.Struct, tag="o", **_REC):
    """One chunk.  ``index`` counts from 0 per request on this stage."""

    request_id: str
    index: int
    modality: Modality
    text: str = ""
    token_ids: tuple[int, ...] = ()
    array: np.ndarray | None = None
    data: bytes = b""
    media_type: str = ""
    piece: int = 0  # the input piece that produced it (Chunk.piece)
    logprobs: tuple[TokenLogprob, ...] = ()  # Chunk.logprobs
    reasoning: str = ""  # Chunk.reasoning
    tool_calls: tuple[ToolCallDelta, ...] = ()  # Chunk.tool_calls


class ProgressRec(msgspec.Struct, tag="p", **_REC):
    """A step done; ``preview``: a partial image decoded at it (the
    ``Progress`` event's blob), of type ``media_type``."""

    request_id: str
    step: int
    total: int
    preview: bytes = b""
    media_type: str = ""


class Done(msgspec.Struct, tag="f", **_REC):
    request_id: str
    chunks: int
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    output_tokens: int = 0


class Error(msgspec.Struct, tag="e", **_REC):
    request_id: str
    message: str
    #: False: the engine refused the request's own input (see StageFailed.retry)
    retry: bool = True


Record = Started | Output | ProgressRec | Done | Error

# One typed decoder per message type (the worker and the server each build
# their own set: decoders hold per-call state and are not thread-safe).
SERVER_BOUND: dict[bytes, type[Any]] = {
    HELLO: Hello,
    READY: Ready,
    START_FAILED: StartFailed,
    OUTPUTS: list[Record],
    GOODBYE: Goodbye,
    HEARTBEAT: Heartbeat,
    PROFILED: Profiled,
}
WORKER_BOUND: dict[bytes, type[Any]] = {
    WELCOME: Welcome,
    REFUSED: Refused,
    # Everything the server routes to one worker in one loop turn, in order
    # (a burst of admissions is one message, not one per request).
    WORK: list[WorkItem],
    ABORT: Abort,
    SHUTDOWN: Shutdown,
    HEARTBEAT_ACK: HeartbeatAck,
    PROFILE: Profile,
}


def decoders(table: dict[bytes, type[Any]]) -> dict[bytes, FrameDecoder[Any]]:
    return {k: FrameDecoder(t) for k, t in table.items()}
