"""The stage runtime's own errors.

Owns: the exceptions ``StageRuntime`` and its helpers raise (start-up that
fails, inconsistent options, work sent where it cannot go).  Kept apart so
that every helper module of the runtime can raise them without importing
the runtime; ``omnix.stages.runtime`` re-exports them.  Does not own
errors of the worker or of engines.
"""

from __future__ import annotations


class StageRuntimeError(RuntimeError):
    """Base of the runtime's own errors."""


class WorkerStartError(StageRuntimeError):
    """``start()`` could not bring every replica up."""


class RuntimeConfigError(StageRuntimeError, ValueError):
    """The runtime's options are inconsistent (bad ``spawn`` list, a public
    tcp endpoint without a worker token, ...): raised at construction."""


class ReplicaUnavailable(StageRuntimeError):
    """Work was sent to a replica that is not ready (never joined, or lost)."""


class CapacityExceeded(StageRuntimeError):
    """A new request (seq 0) was sent to a replica with no free credit."""
