"""A stage worker's control messages that act on running work: abort, profile.

Owns: ``Aborts`` (ABORT from the server: remember the id, tell the engine,
cancel the request's task, whose end acknowledges with ``Done(aborted)``;
an abort for a request not running is ignored, with no reply; and
``drop_all`` when the server is lost: every request forgotten without a
word, its engine work aborted) and ``Profiling`` (PROFILE start/stop: the
engine's own profiler where it has one, else torch's around this process;
answered with PROFILED).

Does not own which requests run (``worker_requests.py``), the engine loop
that acknowledges an abort (``worker_engine_loop.py``) nor the
connection's lifecycle (``worker.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from omnix.stages.engine import Engine, ProfilingEngine
from omnix.stages.profiler import ProfileError, WorkerProfiler
from omnix.stages.worker_outbox import Outbox
from omnix.stages.worker_requests import Requests
from omnix.transport import messages as m

log = logging.getLogger("omnix.worker")


class Aborts:
    def __init__(self, requests: Requests, outbox: Outbox) -> None:
        self._requests = requests
        self._outbox = outbox
        self._aborting: set[asyncio.Task[None]] = set()  # engine.abort calls in flight

    def on_abort(self, _: bytes, msg: m.Abort) -> None:
        rid = msg.request_id
        self._requests.remember_aborted(rid)
        req = self._requests.active.get(rid)
        if req is None or req.done or req.aborted:
            return  # not running (any more): ignored, no reply
        req.aborted = True
        # Tell the engine (it frees its own resources: vLLM's KV blocks) and
        # stop consuming its outputs now; the task's end acknowledges.
        self._engine_abort(rid)
        if req.task is not None:
            req.task.cancel()

    def drop_all(self) -> None:
        """Forget every request: the server that sent them is gone, and a
        restarted one continues them elsewhere from its log."""
        requests = self._requests
        for rid, req in list(requests.active.items()):
            req.done = req.aborted = True  # its task's end reports nothing
            requests.aborted[rid] = None
            if req.task is not None and not req.task.done():
                req.task.cancel()
            if requests.engine is not None:
                self._engine_abort(rid)
        requests.active.clear()
        self._outbox.clear()

    def _engine_abort(self, rid: str) -> None:
        assert self._outbox.loop is not None and self._requests.engine is not None
        task = self._outbox.loop.create_task(_engine_abort(self._requests.engine, rid))
        # The loop holds tasks weakly: keep this one until it ends.
        self._aborting.add(task)
        task.add_done_callback(self._aborting.discard)


async def _engine_abort(engine: Engine, rid: str) -> None:
    try:
        await engine.abort(rid)
    except Exception:
        log.exception("engine.abort(%r) raised", rid)


class Profiling:
    """``profiler`` is set when the server profiles (``omnix serve
    --profile-dir``); ``token`` and ``who`` name this worker's current
    incarnation."""

    def __init__(self, outbox: Outbox, *, token: Callable[[], str], who: Callable[[], str]) -> None:
        self._outbox = outbox
        self._token = token
        self._who = who
        self.profiler: WorkerProfiler | None = None
        self.engine: Engine | None = None
        self._running: asyncio.Task[None] | None = None

    def on_profile(self, _: bytes, msg: m.Profile) -> None:
        if self._running is not None and not self._running.done():
            self._outbox.send(
                m.PROFILED,
                m.Profiled(
                    self._token(),
                    msg.action,
                    False,
                    "the previous start or stop is still in progress; retry",
                ),
            )
            return
        assert self._outbox.loop is not None
        self._running = self._outbox.loop.create_task(self._profile(msg.action))

    async def _profile(self, action: m.ProfileAction) -> None:
        """Start or stop profiling: the engine's own profiler where it has
        one (it covers this process too: two torch profilers in one process
        do not mix), else torch's around this process."""
        prof, engine = self.profiler, self.engine
        try:
            if prof is None:
                raise ProfileError(
                    "the server did not enable profiling (omnix serve --profile-dir DIR)"
                )
            if isinstance(engine, ProfilingEngine):
                await (engine.start_profile() if action == "start" else engine.stop_profile())
                detail = str(prof.root)
            elif action == "start":
                prof.start()
                detail = str(prof.root)
            else:
                ended = prof.stop()
                detail = str(await asyncio.to_thread(prof.write, ended))
            ok = True
        except Exception as exc:
            log.warning("worker %s: profile %s failed: %s", self._who(), action, exc)
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        if self._outbox.sock is not None:
            self._outbox.send(m.PROFILED, m.Profiled(self._token(), action, ok, detail))
