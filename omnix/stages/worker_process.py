"""A stage worker as a process: its exit codes and how it ends, its heap.

Owns: the worker's exit codes and ``WorkerExit`` (an end with a code and a
message for its operator), the environment names a spawning runtime sets,
how the process exits (``exit_now`` taking its engine's processes along,
``exit_without_finalizing`` after a clean teardown), ``say`` (a line to the
operator that survives a dead pipe), and the heap and thread settings made
after an engine load (``freeze_heap``, ``apply_thread_limits``).

Does not own the worker's protocol or requests (``worker.py`` and the
``worker_*`` modules beside it) nor its command line (``worker_cli.py``).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys

TOKEN_ENV = "OMNIX_WORKER_INCARNATION"  # set by the runtime for the workers it spawns
AUTH_ENV = "OMNIX_WORKER_TOKEN"  # the shared secret a server started with --worker-token requires
PARENT_ENV = "OMNIX_PARENT_PID"  # the spawning runtime's pid: die with it
#: Set by a worker's entry point, taken by its first engine: this process
#: has computed nothing yet, so a child may be forked from it
#: (``omnix.engines.vllm_setup.fork_engine_core``).
FRESH_ENV = "OMNIX_FRESH_PROCESS"

EXIT_OK = 0
EXIT_REFUSED = 2
EXIT_ENGINE_FAILED = 3
EXIT_NO_SERVER = 4
EXIT_SERVER_LOST = 5


class WorkerExit(Exception):
    """Ends the worker with an exit code and a message for its operator."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def exit_now(code: int) -> None:
    """Exit without cleanup, taking the engine's processes along."""
    if os.getsid(0) == os.getpid():
        # We lead our own session (spawned by a runtime): take any engine
        # subprocesses down with us.
        os.killpg(os.getpgrp(), signal.SIGKILL)
    else:  # started by hand, in somebody's process group: only our children
        _kill_children()
    os._exit(code)


def exit_without_finalizing(code: int) -> None:
    """Exit with ``code`` once the worker has torn everything down (call it
    after ``Worker.run`` returned), skipping the interpreter's finalization.

    The worker froze its heap after the engine load (``freeze_heap``):
    finalizing would leave those objects alive, and triton's nanobind
    bindings (imported by vLLM) then print dozens of "leaked" lines on
    every clean stop; unfreezing first makes the exit walk and free the
    whole torch/vLLM heap instead (~1.3 s more per worker on 2 cores).
    Nothing is left to finalize by then: the engine is closed (its
    processes joined), the sockets and ZMQ context are closed.  An engine
    process still alive (its close ran out of time) would have been
    terminated by finalization (vLLM's engine core is a daemon process);
    it is killed here instead of being left orphaned."""
    _kill_children()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _kill_children() -> None:
    """Kill this process's multiprocessing children (an engine's processes)."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()


def say(text: str) -> None:
    """Tell the operator, even when nobody listens: after the server died our
    stderr is a pipe without a reader, and a BrokenPipeError here must not
    stop the worker from exiting."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def freeze_heap() -> None:
    """Move everything the engine's load created (torch, transformers,
    vLLM: millions of objects) out of the garbage collector's reach, as
    vLLM's own server does after start-up.  Serving allocates many short-
    lived objects per token; every full collection would otherwise walk the
    whole static heap (~0.5 s on a small CPU machine) in the middle of
    somebody's stream."""
    gc.collect()
    gc.freeze()


def apply_thread_limits() -> None:
    """Cap torch's intra-op threads to OMP_NUM_THREADS (the runtime sets 1):
    on small machines a streaming loop and torch's pool fight for cores."""
    torch = sys.modules.get("torch")
    n = os.environ.get("OMP_NUM_THREADS")
    if torch is not None and n and n.isdigit() and int(n) > 0:
        try:
            torch.set_num_threads(int(n))
        except Exception:
            pass
