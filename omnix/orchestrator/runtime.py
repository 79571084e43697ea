"""The stage runtime as the orchestrator and ``Omni`` see it.

Owns: ``Runtime``, the one protocol every stage runtime implements
structurally (``omnix.stages.runtime.StageRuntime`` with worker processes,
``omnix.testing.serving.InProcessRuntime`` in process,
``omnix.testing.sim.SimRuntime`` on virtual time), and ``RuntimeFactory``,
how ``Omni`` builds one from the pipeline, the sequencer's ``emit`` and
the blob store.

Does not own any runtime, nor what the calls mean for a worker
(docs/CONTRACTS.md, "Runtime").  Readiness is not asked of the runtime:
it reports each replica as ``WorkerJoined``/``WorkerLost`` through
``emit``, and the orchestrator answers readiness from the log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from omnix.events.blobs import BlobStore
from omnix.events.types import Event, Scaled
from omnix.pipelines.config import PipelineConfig
from omnix.transport.work import WorkItem


class Runtime(Protocol):
    """Runs a pipeline's stages; worker events come back through ``emit``.

    ``send``, ``abort``, ``release`` and ``scale`` are the ``Dispatcher``'s, called
    from inside an append cascade: they never block and never call
    ``emit`` themselves.  ``start`` and ``shutdown`` are ``Omni``'s.
    """

    async def start(self) -> None:
        """Bring the replicas up; each one that is ready emits ``WorkerJoined``."""
        ...

    def send(self, work: WorkItem) -> None:
        """Hand one routed piece to ``work.stage``'s replica ``work.replica``."""
        ...

    def abort(self, request_id: str, stage: str, replica: int) -> None:
        """Ask the replica to stop the request; it answers ``StageFinished(aborted)``."""
        ...

    def release(self, request_id: str) -> None:
        """Forget a request after its terminal event."""
        ...

    def scale(self, ev: Scaled) -> None:
        """Carry out a scale event (``op`` ``start`` or ``drain``): start
        the replica (it emits ``WorkerJoined`` once ready), or drain it:
        the orchestrator routes it nothing new; once the requests it runs
        are done its worker is stopped and the runtime emits
        ``Scaled(op="left")`` (a drained replica that was not ready yet is
        just stopped; one that dies first is ``WorkerLost``, as any)."""
        ...

    async def shutdown(self) -> None:
        """Stop every replica; idempotent."""
        ...


#: Builds the runtime an ``Omni`` drives: ``(pipeline, emit, blobs) -> Runtime``.
RuntimeFactory = Callable[[PipelineConfig, Callable[[Event], None], BlobStore], Runtime]
