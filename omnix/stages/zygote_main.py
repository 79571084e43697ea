"""The zygote process: imports a worker's heavy modules once, forks workers.

Owns the process side of ``zygote.py``: ``main`` (run as ``python -m
omnix.stages.zygote_main FD MODULE...``) imports the modules it is given
(torch, transformers' model code, vLLM: ~4-10 CPU-s each time a worker
starts cold), then serves fork requests on the socket ``FD`` until its
parent, the server, goes: each request forks a child that becomes an
``omnix worker`` with the request's command line, environment, CPUs and
output pipe (``_become_worker``); each child's exit status is sent back.
The zygote stays single-threaded and computes nothing, so a fork copies no
lock held by another thread and no OpenMP pool (module docstring of
``zygote.py``).

Does not own the server side (``zygote.py``) nor the worker
(``worker_cli.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import select
import signal
import socket
import sys

import msgspec

from omnix.stages.zygote_wire import MAX_MESSAGE, Exited, Fork, Forked, Ready, ZygoteMessage

_PR_SET_PDEATHSIG = 1
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Fork).decode


def main(argv: list[str]) -> int:
    fd, modules = int(argv[0]), argv[1:]
    parent = os.getppid()
    _die_with_parent()
    sock = socket.socket(fileno=fd)
    for name in modules:
        importlib.import_module(name)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd is what wakes the loop
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the server's to handle
    _send(sock, Ready(pid=os.getpid()))
    while os.getppid() == parent:
        ready, _, _ = select.select([sock.fileno(), wake_r], [], [], 1.0)
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError, InterruptedError):
                os.read(wake_r, 4096)
        _reap(sock)
        if sock.fileno() in ready:
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 1)
            except InterruptedError:
                continue
            if not data:
                return 0  # the server closed its end
            req = _decode(data)
            pid = os.fork()
            if pid == 0:
                os.close(wake_r)
                os.close(wake_w)
                _become_worker(req, fds[0], sock)
            os.close(fds[0])
            _send(sock, Forked(ticket=req.ticket, pid=pid))
    return 0


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, Exited(pid=pid, returncode=os.waitstatus_to_exitcode(status)))


def _send(sock: socket.socket, msg: ZygoteMessage) -> None:
    with contextlib.suppress(OSError):  # the server is gone: the loop ends
        sock.sendall(_encode(msg))


def _become_worker(req: Fork, out: int, sock: socket.socket) -> None:
    """In the child: the request's process, then ``omnix worker``; never returns."""
    code = 1
    try:
        _title(req.args)
        sock.close()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        os.setsid()  # its own process group, as a spawned worker: killpg reaches its engine's
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        os.environ.clear()
        os.environ.update(req.env)
        if req.cpus:
            os.sched_setaffinity(0, req.cpus)
        sys.argv = ["omnix worker", *req.args]
        from omnix.stages.worker_cli import main as worker_main

        code = worker_main(list(req.args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _title(args: tuple[str, ...]) -> None:
    """The command line a cold-started worker shows (``ps``, ``top``).
    First thing in the child: ``setproctitle`` finds the memory it rewrites
    beside the environment, which the child then replaces; vLLM titles its
    engine core (``VLLM::EngineCore``) through it later."""
    try:
        import setproctitle
    except ImportError:  # vLLM's dependency: without it, the zygote's title
        return
    setproctitle.setproctitle(" ".join((sys.executable, "-m", "omnix.stages.worker_cli", *args)))


def _die_with_parent() -> None:
    """SIGKILL when the server dies (Linux): its workers then see their
    parent gone and exit as spawned ones do."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
