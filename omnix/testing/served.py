"""``omnix serve`` as a subprocess, for tests and benchmarks that kill it.

Owns: ``ServeProcess`` (the process and its merged output, read line by
line in the background, so a test can wait for a log line, in order with
``until`` or anywhere in the output with ``seen``, and the pipe never
fills) and ``omnix_serve``, which starts one, waits until it is
ready and kills whatever is left of it on exit.  Does not own the server
(``omnix.http.serve``) nor any assertion about it.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class ServeProcess:
    """One ``omnix serve`` subprocess; ``url`` is known once ``ready`` returned."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.url = ""
        self._cursor = 0  # lines before it were matched by an earlier ``until``
        self._more = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, *args: str, verb: str = "serve") -> ServeProcess:
        """``omnix serve --port 0 ARGS...`` (Python unbuffered, stderr
        merged); ``verb="frontend"`` for ``omnix frontend``."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "omnix.cli", verb, "--port", "0", *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        return cls(proc)

    async def _read(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        while line := await stdout.readline():
            self.lines.append(line.decode())
            self._more.set()
        self._more.set()  # end of output: waiters see it

    async def until(self, pattern: str, timeout: float = 60) -> re.Match[str]:  # noqa: ASYNC109
        """The first line after the last match that matches ``pattern``."""
        async with asyncio.timeout(timeout):
            while True:
                while self._cursor < len(self.lines):
                    line = self.lines[self._cursor]
                    self._cursor += 1
                    if m := re.search(pattern, line):
                        return m
                if self._reader.done():
                    raise AssertionError(
                        f"omnix serve exited before {pattern!r}:\n" + "".join(self.lines)
                    )
                self._more.clear()
                await self._more.wait()

    async def seen(self, pattern: str, timeout: float = 60) -> re.Match[str]:  # noqa: ASYNC109
        """The first line of all the output so far or to come that matches
        ``pattern``, without moving ``until``'s place: several tasks may
        wait on one process this way, and one cancelled loses nothing."""
        checked = 0
        async with asyncio.timeout(timeout):
            while True:
                while checked < len(self.lines):
                    checked += 1
                    if m := re.search(pattern, self.lines[checked - 1]):
                        return m
                if self._reader.done():
                    raise AssertionError(
                        f"omnix serve exited before {pattern!r}:\n" + "".join(self.lines)
                    )
                self._more.clear()
                await self._more.wait()

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    async def ready(self, timeout: float = 60) -> str:  # noqa: ASYNC109
        """Wait for the 'listening on' and 'ready in' lines; returns the url."""
        self.url = (await self.until(r"listening on (http://\S+)", timeout)).group(1)
        await self.until(r"ready in [0-9.]+ s", timeout)
        return self.url

    async def kill9(self) -> None:
        """SIGKILL, as a crash would: nothing gets to clean up."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self, grace_s: float = 60.0) -> None:
        """SIGTERM, as a user stops it (its workers shut down with it);
        SIGKILL if it is still running ``grace_s`` later."""
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), grace_s)
            except TimeoutError:
                pass
        await self.close()

    async def close(self) -> None:
        await self.kill9()
        self._reader.cancel()


@asynccontextmanager
async def omnix_serve(*args: str) -> AsyncIterator[ServeProcess]:
    """A ready ``omnix serve ARGS...``; killed on exit if still running."""
    served = await ServeProcess.start(*args)
    try:
        await served.ready()
        yield served
    finally:
        await served.close()
