"""Child processes of the stage runtime: spawn, watch, capture output, kill.

Owns: ``WorkerProcess``, one spawned worker: started (``Start``: a fresh
Python by default, ``popen``; or forked by a zygote, ``zygote.py``) in its
own session (process group) so that killing it also kills anything it
spawned (vLLM starts an engine-core process); watched with a pidfd on the
event loop (a forked one: by its zygote's word), so a ``kill -9`` is
noticed within milliseconds (a killed process sends nothing); its
stdout+stderr read through one pipe on the loop, forwarded line by line
with a ``[stage/replica]`` prefix and the last lines kept for error
messages.  Does not own restarts or what a death means (``runtime.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from omnix.stages.zygote import ForkedProcess

TAIL_LINES = 30
# A DEBUG or INFO line of the worker's own logging (worker_cli's format).
_WORKER_INFO = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO) worker\[")


#: Starts a worker with its stdout and stderr on the given descriptor.
Start = Callable[[int], "subprocess.Popen[bytes] | ForkedProcess"]


def popen(argv: Sequence[str], env: Mapping[str, str]) -> Start:
    """A fresh ``argv`` process with exactly ``env``."""

    def start(out_fd: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out_fd,
            stderr=out_fd,
            env=dict(env),
            start_new_session=True,  # own process group: killpg reaches grandchildren
            close_fds=True,
        )

    return start


class WorkerProcess:
    def __init__(
        self,
        start: Start,
        label: str,
        loop: asyncio.AbstractEventLoop,
        on_exit: Callable[[WorkerProcess], None],
        *,
        forward_output: bool = True,
    ) -> None:
        self.label = label
        self._loop = loop
        self._on_exit = on_exit
        self._forward = forward_output
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._partial = b""
        self._exited = False
        r, w = os.pipe()
        try:
            self.popen = start(w)
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
        self.pid = self.popen.pid
        self._out_fd: int | None = r
        os.set_blocking(r, False)
        loop.add_reader(r, self._read_output)
        self._pidfd: int | None = None
        if isinstance(self.popen, ForkedProcess):
            # Not our child: its exit status comes from the zygote, after the
            # pidfd would fire.
            self.popen.on_exit(self._exited_elsewhere)
            return
        try:
            self._pidfd = os.pidfd_open(self.pid)
            loop.add_reader(self._pidfd, self.poll)
        except (AttributeError, OSError):
            self._pidfd = None  # no pidfd (old kernel): the runtime's tick polls

    def _exited_elsewhere(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody watches
            self._loop.call_soon_threadsafe(self.poll)

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def describe_exit(self) -> str:
        rc = self.popen.returncode
        if rc is None:
            return f"worker process {self.pid} is running"
        if rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            return f"worker process {self.pid} was killed by {name}"
        return f"worker process {self.pid} exited with code {rc}"

    def last_output(self, n: int = 12) -> str:
        """Its last ``n`` lines, indented, without the worker's own DEBUG and
        INFO log lines ("ready", "stopping"): what explains a death is what
        came after them (a traceback, a warning, a message from its engine)."""
        lines = [ln for ln in self.tail if not _WORKER_INFO.match(ln)][-n:]
        return "\n".join("    " + ln for ln in lines) if lines else "    (no output)"

    def poll(self) -> int | None:
        """Reap if exited; calls ``on_exit`` once.  Safe to call any time."""
        rc = self.popen.poll()
        if rc is None or self._exited:
            return rc
        self._exited = True
        self._read_output()  # what it said last, before we describe its death
        self._close_fds()
        # Anything it spawned dies with it (same process group).
        self._killpg(signal.SIGKILL)
        self._on_exit(self)
        return rc

    def terminate(self) -> None:
        self._killpg(signal.SIGTERM)

    def kill(self) -> None:
        self._killpg(signal.SIGKILL)

    def _killpg(self, sig: int) -> None:
        # The group outlives its leader while members remain, and Linux does
        # not reuse a pid that is still a group id: this cannot hit a stranger.
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            # No group yet: a worker forked a moment ago (``zygote``) that
            # has not called setsid; unreaped, its pid is still its own.
            if self.popen.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(self.pid, sig)
        except PermissionError:
            pass

    def wait_blocking(self, timeout: float) -> int | None:
        """Wait for the exit (any thread: does not touch the loop; ``poll()`` after)."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def _read_output(self) -> None:
        fd = self._out_fd
        if fd is None:
            return
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                if self._partial:
                    self._line(self._partial)
                    self._partial = b""
                with contextlib.suppress(ValueError, OSError, RuntimeError):
                    self._loop.remove_reader(fd)
                os.close(fd)
                self._out_fd = None
                return
            data = self._partial + data
            *lines, self._partial = data.split(b"\n")
            for ln in lines:
                self._line(ln)

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        self.tail.append(text)
        if self._forward:
            try:
                sys.stderr.write(f"[{self.label}] {text}\n")
            except (ValueError, OSError):
                pass

    def _close_fds(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(ValueError, OSError, RuntimeError):
                self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def close(self) -> None:
        """Stop watching (after the process is gone); closes our fds."""
        self._read_output()
        if self._out_fd is not None:
            with contextlib.suppress(ValueError, OSError, RuntimeError):
                self._loop.remove_reader(self._out_fd)
            os.close(self._out_fd)
            self._out_fd = None
        self._close_fds()
