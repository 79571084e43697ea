"""Warm worker starts: workers forked from a process that imported their engines once.

Owns ``Zygote``, the server's side of one zygote process
(``zygote_main``): the process that imported the heavy modules of the
engines a runtime spawns (torch, transformers' Qwen3-Omni model code,
vLLM) and forks each worker from itself (``fork``), and ``ForkedProcess``,
one forked worker as ``procs.WorkerProcess`` watches it (the part of
``subprocess.Popen`` it uses: ``pid``, ``poll``, ``wait``,
``returncode``), its exit status told by the zygote.  ``acquire_zygote``
and ``release_zygote`` share one zygote per Python, module list and
environment among a process's runtimes: the servers of a test session
share theirs, and a worker the runtime restarts is forked warm.  One idle
zygote is kept for the next runtime like it; starting one of another kind
closes the idle ones (each holds a few hundred MB).

Why: a cold worker of tiny-omni spends ~4 CPU-s importing transformers'
model code (talker, code2wav) and ~9 importing vLLM (thinker) before it
loads anything; on a small machine that is most of a server's start and
every restart's.  Why a fork is safe here: the zygote is single-threaded
and computes nothing (no OpenMP pool, no CUDA context), and each child
takes its own environment, CPUs, session and output before the worker
starts; what libraries read at import (``HF_HUB_OFFLINE``,
``VLLM_LOGGING_LEVEL``, ``OMP_NUM_THREADS``) is in the zygote's own
environment (``zygote_env``), which the workers' shares.

When the zygote dies its workers are killed (they would have no one to
report their exits) and the runtime restarts them cold.  Does not own the
worker's command line and environment (``spawner.py``) nor its watching
and output (``procs.py``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence

import msgspec

from omnix.models.paths import stay_offline
from omnix.stages.zygote_wire import MAX_MESSAGE, Exited, Fork, Forked, Ready, ZygoteMessage

log = logging.getLogger("omnix.runtime")

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(ZygoteMessage).decode


class ZygoteGone(RuntimeError):
    """The zygote died or never became ready: start the worker cold."""


class ForkedProcess:
    """A worker forked by a zygote, as ``subprocess.Popen`` shows a child."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._watchers: list[Callable[[], None]] = []

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def on_exit(self, watcher: Callable[[], None]) -> None:
        """Call ``watcher`` (from any thread) once it has exited."""
        with self._lock:
            if self.returncode is None:
                self._watchers.append(watcher)
                return
        watcher()

    def exited(self, returncode: int) -> None:
        with self._lock:
            if self.returncode is not None:
                return
            self.returncode = returncode
            watchers, self._watchers = self._watchers, []
        self._done.set()
        for w in watchers:
            with contextlib.suppress(Exception):
                w()


class Zygote:
    """One zygote process (see the module docstring); ``fork`` once ``wait_ready``."""

    def __init__(self, python: str, modules: Sequence[str], env: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [python, "-m", "omnix.stages.zygote_main", str(theirs.fileno()), *modules],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
                start_new_session=True,  # a terminal's Ctrl-C is the server's
            )
        finally:
            theirs.close()
        self.modules = tuple(modules)
        self.pid = 0  # the zygote's, once ready: its workers' parent
        self.dead = False
        self.users = 0  # the runtimes using it (``acquire_zygote``)
        self._closing = False
        self._sock = ours
        self._tickets = itertools.count()
        self._send_lock = threading.Lock()
        self._state = threading.Lock()
        self._ready = threading.Event()
        self._answers: dict[int, tuple[threading.Event, list[ForkedProcess]]] = {}
        self._children: dict[int, ForkedProcess] = {}
        threading.Thread(target=self._read, name="omnix-zygote", daemon=True).start()

    def wait_ready(self, timeout: float) -> bool:
        """Block until its modules are imported; False if it died first or took longer."""
        return self._ready.wait(timeout) and not self.dead

    def fork(
        self, args: Sequence[str], env: Mapping[str, str], out_fd: int, cpus: Sequence[int] = ()
    ) -> ForkedProcess:
        """``omnix worker ARGS`` as a child of the zygote, with exactly ``env``,
        on ``cpus`` (empty: the zygote's), its stdout and stderr to
        ``out_fd``; ``ZygoteGone`` when it cannot."""
        if not self._ready.is_set() or self.dead:
            raise ZygoteGone("the zygote is not ready")
        ticket = next(self._tickets)
        done, got = threading.Event(), list[ForkedProcess]()
        with self._state:
            self._answers[ticket] = (done, got)
        req = Fork(ticket=ticket, args=tuple(args), env=dict(env), cpus=tuple(cpus))
        try:
            with self._send_lock:
                socket.send_fds(self._sock, [_encode(req)], [out_fd])
        except OSError as exc:
            raise ZygoteGone(f"the zygote is gone ({exc})") from None
        if not done.wait(30.0) or not got:
            raise ZygoteGone("the zygote did not fork the worker")
        return got[0]

    def close(self) -> None:
        """Its end of the socket closed: the zygote exits (its workers stay)."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            msg = _decode(data)
            if isinstance(msg, Ready):
                self.pid = msg.pid
                self._ready.set()
            elif isinstance(msg, Forked):
                proc = ForkedProcess(msg.pid)
                with self._state:
                    self._children[msg.pid] = proc
                    done, got = self._answers.pop(msg.ticket, (None, []))
                got.append(proc)
                if done is not None:
                    done.set()
            elif isinstance(msg, Exited):
                with self._state:
                    child = self._children.pop(msg.pid, None)
                if child is not None:
                    child.exited(msg.returncode)
        self._died()

    def _died(self) -> None:
        """Its workers could report no exit now: killed, and told so.  Closed
        on purpose (``close``), those it still tracks are left alone: their
        runtimes have stopped them already."""
        self.dead = True
        with self._state:
            children, self._children = self._children, {}
            answers, self._answers = self._answers, {}
        for done, _ in answers.values():
            done.set()
        self._ready.set()
        with contextlib.suppress(OSError):
            self._sock.close()
        if self._closing:
            children = {}
        for pid, child in children.items():
            # By pid too: a child forked a moment ago may not lead its group yet.
            for kill in (os.kill, os.killpg):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(pid, signal.SIGKILL)
            child.exited(-signal.SIGKILL)
        if children:
            log.warning(
                "the workers' zygote (pid %d) died: its %d workers were killed; they start cold",
                self.proc.pid,
                len(children),
            )
        with contextlib.suppress(Exception):
            self.proc.wait(5.0)


_Key = tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]
_shared: dict[_Key, Zygote] = {}
_shared_lock = threading.Lock()
#: Variables that differ from one runtime to the next and that no library
#: reads at import: left out of the key (a worker still gets its own).
_NOT_READ_AT_IMPORT = frozenset({"PYTEST_CURRENT_TEST"})


def acquire_zygote(python: str, modules: Sequence[str], env: Mapping[str, str]) -> Zygote:
    """This process's zygote for ``python``, ``modules`` and ``env``
    (``zygote_env``), started if there is none alive; hand it back with
    ``release_zygote`` once its runtime has stopped its workers."""
    key = (
        python,
        tuple(modules),
        tuple(sorted((k, v) for k, v in env.items() if k not in _NOT_READ_AT_IMPORT)),
    )
    with _shared_lock:
        zygote = _shared.get(key)
        if zygote is None or zygote.dead:
            for other_key, other in list(_shared.items()):
                if other.users == 0 or other.dead:
                    other.close()
                    del _shared[other_key]
            zygote = _shared[key] = Zygote(python, modules, env)
        zygote.users += 1
        return zygote


def release_zygote(zygote: Zygote) -> None:
    """One runtime less uses ``zygote``; the last leaves it idle, alive for
    the next runtime like it until one of another kind starts."""
    with _shared_lock:
        zygote.users -= 1


def zygote_env(worker_env: Mapping[str, str]) -> dict[str, str]:
    """The zygote's environment: every worker's (``worker_environ``) with
    the defaults a vLLM stage's worker sets before importing vLLM
    (``vllm_setup.set_env_defaults``), which its libraries read at import."""
    env = dict(worker_env)
    stay_offline(env)
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return env
