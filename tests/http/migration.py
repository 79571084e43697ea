"""What the tests that kill a serving worker share: the kill (SIGKILL of
the worker a request's stage was routed to, or its vLLM engine core), and
the log's account of what followed (the request's terminal events and
continuations, a stage's chunks, the seam between the killed replica's and
its successor's, the ``worker_lost`` recorded)."""

from __future__ import annotations

import os
import signal

import psutil

from omnix.events.types import Chunk, Routed, TerminalEvent, WorkerJoined, WorkerLost, is_terminal
from omnix.http.app import HttpServer


def kill_serving(
    server: HttpServer, rid: str, stage: str, engine_core: bool = False
) -> tuple[int, int]:
    """SIGKILL the worker of ``stage`` the request was routed to (the pid
    its replica's latest ``WorkerJoined`` recorded), or with
    ``engine_core`` the vLLM engine-core process that worker started.
    (replica, pid killed)."""
    log = server.omni.log
    first = [
        e for e in log.events_for(rid) if type(e) is Routed and e.stage == stage and e.seq == 0
    ][-1]
    joined = [
        e
        for e in log.read()
        if type(e) is WorkerJoined and e.stage == stage and e.replica == first.replica
    ]
    pid = joined[-1].pid
    assert pid > 0, f"{stage}/{first.replica} joined without a pid"
    if engine_core:
        (core,) = [
            p for p in psutil.Process(pid).children(recursive=True) if "EngineCore" in p.name()
        ]
        pid = core.pid
    os.kill(pid, signal.SIGKILL)
    return first.replica, pid


def migration_facts(server: HttpServer, rid: str) -> tuple[list[TerminalEvent], list[Routed]]:
    """The request's terminal events and its continuations."""
    events = server.omni.log.events_for(rid)
    terminal = [e for e in events if is_terminal(e)]
    resumed = [e for e in events if type(e) is Routed and e.resume > 0]
    return terminal, resumed


def stage_chunks(server: HttpServer, rid: str, stage: str) -> list[Chunk]:
    return [e for e in server.omni.log.events_for(rid) if type(e) is Chunk and e.stage == stage]


def assert_seam(chunks: list[Chunk], killed: int, cont: Routed) -> None:
    """The stage's logged chunks are numbered 0..n-1 once each, those
    before the seam from the killed replica, the rest from the new one."""
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert 0 < cont.resume < len(chunks), (
        f"the seam {cont.resume} is not inside {len(chunks)} chunks"
    )
    assert {c.replica for c in chunks[: cont.resume]} == {killed}
    assert {c.replica for c in chunks[cont.resume :]} == {cont.replica}


def lost(server: HttpServer, stage: str, replica: int) -> list[WorkerLost]:
    return [
        e
        for e in server.omni.log.read()
        if type(e) is WorkerLost and e.stage == stage and e.replica == replica
    ]
