"""Running diffusion jobs: equal shapes batched into one call, one call at a time.

Owns ``Batcher``: jobs submitted by the engine's ``generate`` calls wait
in arrival order; while the pipeline thread is busy they pile up, and
when it frees the oldest job is run together with every waiting job of
the same key (``Job.key``: the same task, size, steps and guidance), up
to ``max_batch``, as one pipeline call.  Before forming a group the
batcher lets the event loop run a few turns, so requests that arrived
together (one WORK message) start together; and while recent calls saw
more requests at once than wait now (clients that send their next
request when their last one is answered come back a few milliseconds
after the call ends), it holds the group open for them, at most a
quarter of the last call's time (20 ms at most), so a steady load of
``k`` clients runs in calls of ``k`` rather than alternating short and
long ones.  A lone client never waits: its recent concurrency is 1.  ``run_group`` (in the
pipeline thread) makes the call with a step callback that, after each
step: posts each live job its progress (and a partial image where it
asked for one), drops a job whose request was aborted (it is posted
``Stopped`` and gets nothing more; the call goes on for the others) and
stops the call when every job is dropped, before the next step and the
VAE decode.  Then each live job gets its file or the error.

Does not own what a job's call is (``diffusers_jobs.py``) nor the
engine's protocol (``diffusers_engine.py``).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

from omnix.engines.diffusers_jobs import (
    Job,
    Raised,
    Result,
    Step,
    Stopped,
    call_kwargs,
    outputs,
    preview,
    preview_steps,
)

#: Event-loop turns the batcher waits before forming a group from an idle
#: start: the generate calls of one WORK message reach ``submit`` within
#: a few turns of each other.
_SETTLE_TURNS = 4
#: How long a group is held open for expected requests: this share of the
#: last call's duration, at most ``_HOLD_MAX_S``.
_HOLD_SHARE = 0.25
_HOLD_MAX_S = 0.02
#: Calls whose concurrency the expectation remembers.
_RECENT = 4


class _Aborted(Exception):
    """Raised from the step callback to stop a pipeline call."""


class Batcher:
    """Groups jobs into pipeline calls and runs them in ``pool``'s thread.

    ``pipeline(task)``: the pipeline a task runs on; ``prepare(pipe, jobs,
    kwargs)``: last changes to a call's arguments (prompt embeddings a
    class cannot make itself), and the context the call runs in (the
    step cache's); ``history``: (request id, steps run,
    outcome) per finished job."""

    def __init__(
        self,
        pool: ThreadPoolExecutor,
        pipeline: Callable[[str], Any],
        prepare: Callable[[Any, list[Job], dict[str, Any]], AbstractContextManager[Any]],
        max_batch: int,
        history: collections.deque[tuple[str, int, str]],
    ) -> None:
        self._pool = pool
        self._pipeline = pipeline
        self._prepare = prepare
        self.max_batch = max(1, max_batch)
        self.history = history
        self._waiting: list[Job] = []
        self._task: asyncio.Task[None] | None = None
        self._arrived = asyncio.Event()
        #: requests seen at once around each recent call (waiting + running)
        self._recent: collections.deque[int] = collections.deque(maxlen=_RECENT)
        self._last_call_s = 0.0
        #: sizes of the calls made, newest last (tests and the bench read it)
        self.calls: collections.deque[int] = collections.deque(maxlen=256)

    def submit(self, job: Job) -> None:
        self._waiting.append(job)
        self._arrived.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="omnix-diffusion")

    def close(self) -> None:
        for job in self._waiting:
            job.flag.set()
        self._waiting.clear()
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        settle = True
        while self._waiting:
            if settle and self.max_batch > 1:
                for _ in range(_SETTLE_TURNS):
                    await asyncio.sleep(0)
            await self._hold()
            group = self._take()
            if group:
                self.calls.append(len(group))
                t0 = loop.time()
                running = asyncio.ensure_future(
                    loop.run_in_executor(self._pool, self.run_group, group)
                )
                self._arrived.clear()
                await running
                self._last_call_s = loop.time() - t0
                self._recent.append(len(group) + len(self._waiting))
            # Jobs that came while the call ran waited a whole call already.
            settle = False

    async def _hold(self) -> None:
        """Wait a little for the requests recent calls saw at once."""
        if self.max_batch <= 1 or not self._recent:
            return
        want = min(self.max_batch, max(self._recent))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(_HOLD_SHARE * self._last_call_s, _HOLD_MAX_S)
        while len(self._waiting) < want:
            left = deadline - loop.time()
            if left <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                return

    def _take(self) -> list[Job]:
        """The oldest live job and the waiting jobs of its key."""
        waiting = [j for j in self._waiting if not self._dropped_early(j)]
        if not waiting:
            self._waiting = []
            return []
        key = waiting[0].key()
        group = [j for j in waiting if j.key() == key][: self.max_batch]
        taken = set(map(id, group))
        self._waiting = [j for j in waiting if id(j) not in taken]
        return group

    def _dropped_early(self, job: Job) -> bool:
        if job.flag.is_set():
            self.history.append((job.rid, 0, "aborted"))
            return True
        return False

    # -- in the pipeline thread ----------------------------------------------
    def run_group(self, jobs: list[Job]) -> None:
        """One pipeline call for ``jobs``; every live job is posted its
        steps, then its file, its error, or ``Stopped``."""
        live = [j for j in jobs if not self._dropped_early(j)]
        if not live:
            return
        pipe = self._pipeline(live[0].task)
        kwargs = call_kwargs(live, frozenset(_accepts(pipe)))
        dropped: set[int] = set()
        wanted: dict[int, frozenset[int]] = {}

        def on_step_end(p: Any, i: int, t: Any, tensors: dict[str, Any]) -> dict[str, Any]:
            total = int(getattr(p, "_num_timesteps", 0) or live[0].steps)
            done = i + 1
            for k, job in enumerate(live):
                if k in dropped:
                    continue
                job.done = done
                if job.flag.is_set():
                    dropped.add(k)
                    self.history.append((job.rid, done, "aborted"))
                    job.post(Stopped())
                    continue
                steps = wanted.setdefault(k, preview_steps(job.partial_images, total))
                image = b""
                if done in steps and "latents" in tensors:
                    image = preview(p, job, tensors["latents"][k : k + 1])
                job.post(Step(done, total, image))
            if len(dropped) == len(live):
                raise _Aborted
            return tensors

        if "callback_on_step_end" in _accepts(pipe):
            kwargs["callback_on_step_end"] = on_step_end
        try:
            with self._prepare(pipe, live, kwargs):
                files = outputs(live, pipe(**kwargs))
        except _Aborted:
            return
        except Exception as exc:
            for k, job in enumerate(live):
                if k not in dropped:
                    self.history.append((job.rid, job.done, "error"))
                    job.post(Raised(exc))
            return
        for k, (job, data) in enumerate(zip(live, files, strict=True)):
            if k in dropped:
                continue
            if job.flag.is_set():
                self.history.append((job.rid, job.done, "aborted"))
                job.post(Stopped())
                continue
            self.history.append((job.rid, job.done, "done"))
            job.post(Result(data))


def _accepts(pipe: Any) -> set[str]:
    import inspect

    found = getattr(pipe, "_omnix_accepts", None)
    if found is None:
        found = set(inspect.signature(pipe.__call__).parameters)
    return set(found)
