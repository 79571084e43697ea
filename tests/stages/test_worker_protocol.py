"""The worker against a hand-driven server socket: its side of the protocol,
its own guards (capacity, aborted ids) and its exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest
import zmq

from omnix.engines.scripted import JOURNAL_ENV
from omnix.pipelines.config import ScriptedArgs, StageConfig
from omnix.transport import messages as m
from omnix.transport.codec import FrameEncoder
from omnix.transport.sockets import make_router, readable, recv_parts
from omnix.transport.work import InputPiece, WorkItem
from tests.waiting import wait_until_blocking


class RawServer:
    """The test plays the server: it sees every frame the worker sends."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock, self.endpoint = make_router(self.ctx, endpoint)
        self.enc = FrameEncoder()
        self.dec = m.decoders(m.SERVER_BOUND)
        self.worker_id: bytes | None = None
        self.ack_heartbeats = True
        self.heartbeats = 0

    def recv(self, timeout: float = 10.0) -> tuple[bytes, object]:
        """Next non-heartbeat message from the worker (heartbeats are answered)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000)):
                raise AssertionError("no message from the worker")
            while readable(self.sock):
                ident = self.sock.recv()
                mtype, body, aux = recv_parts(self.sock)
                msg = self.dec[mtype].decode(body, aux)
                if mtype == m.HEARTBEAT:
                    self.heartbeats += 1
                    if self.ack_heartbeats:
                        self.sock.send_multipart(
                            self.enc.encode(m.HEARTBEAT_ACK, m.HeartbeatAck(), ident)
                        )
                    continue
                if mtype == m.HELLO:
                    self.worker_id = ident
                return mtype, msg

    def records(self, n: int, timeout: float = 10.0) -> list:
        out: list = []
        while len(out) < n:
            mtype, msg = self.recv(timeout)
            assert mtype == m.OUTPUTS, mtype
            out.extend(msg)
        return out

    def quiet(self, seconds: float) -> list:
        """Everything but heartbeats that arrives within ``seconds``."""
        got = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                got.append(self.recv(left))
            except AssertionError:
                break
        return got

    def send(self, mtype: bytes, msg: object) -> None:
        assert self.worker_id is not None
        self.sock.send_multipart(self.enc.encode(mtype, msg, self.worker_id), copy=False)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def server(tmp_path):
    s = RawServer(f"ipc://{tmp_path}/raw.sock")
    yield s
    s.close()


def _worker(endpoint: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "omnix.stages.worker_cli",
            "--connect",
            endpoint,
            "--stage",
            "s",
            *extra,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )


def _welcome(server: RawServer, args: ScriptedArgs, lost_after: float = 10.0) -> m.Ready:
    mtype, hello = server.recv()
    assert mtype == m.HELLO
    assert (hello.protocol, hello.stage, hello.replica) == (m.PROTOCOL_VERSION, "s", -1)
    server.send(m.WELCOME, m.Welcome(0, StageConfig(name="s", engine=args), "p", 0.1, lost_after))
    mtype, ready = server.recv()
    assert mtype == m.READY and ready.token == hello.token
    return ready


def _work(rid: str, seq: int = 0, last: bool = True) -> WorkItem:
    return WorkItem(rid, "s", 0, seq, last, (InputPiece(text="x"),))


def test_worker_guards_capacity_and_aborted_ids(server):
    proc = _worker(server.endpoint)
    try:
        ready = _welcome(server, ScriptedArgs(capacity=1, chunks_per_piece=5, hang_at=1))
        assert (ready.engine, ready.capacity) == ("scripted", 1)
        server.send(m.WORK, [_work("r1")])
        recs = server.records(2)
        assert recs[0] == m.Started("r1") and isinstance(recs[1], m.Output) and recs[1].index == 0
        server.send(m.WORK, [_work("r2")])  # over its capacity of 1
        [err] = server.records(1)
        assert (
            isinstance(err, m.Error) and err.request_id == "r2" and "capacity of 1" in err.message
        )
        server.send(m.ABORT, m.Abort("r1"))
        [done] = server.records(1)
        assert done == m.Done("r1", 1, "aborted", 0, 0)
        server.send(m.ABORT, m.Abort("never-ran"))  # ignored: no reply
        server.send(m.WORK, [_work("r1", seq=1)])  # late piece for an aborted request: dropped
        server.send(m.WORK, [_work("r1")])  # even a fresh start under that id: dropped
        assert server.quiet(0.5) == []
        server.send(m.WORK, [_work("r3")])  # the credit came back
        assert server.records(2)[0] == m.Started("r3")
        assert server.heartbeats >= 2
        server.send(m.SHUTDOWN, m.Shutdown("test over"))
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_worker_runs_every_item_of_one_work_message_in_order(server):
    proc = _worker(server.endpoint)
    try:
        _welcome(server, ScriptedArgs(capacity=2, chunks_per_piece=1))
        # Two starts and a continuation in one message, as the runtime
        # batches what it routes in one loop turn.
        server.send(m.WORK, [_work("a", last=False), _work("b"), _work("a", seq=1)])
        recs = server.records(7)
        assert [r for r in recs if isinstance(r, m.Started)] == [m.Started("a"), m.Started("b")]
        done = {r.request_id: r for r in recs if isinstance(r, m.Done)}
        assert done["a"].prompt_tokens == 2 and done["b"].prompt_tokens == 1  # a got both pieces
        server.send(m.SHUTDOWN, m.Shutdown("test over"))
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.may_skip("vLLM brings triton on Linux x86-64 only; without it there is no leak to see")
def test_worker_clean_stop_prints_no_leak_reports(server):
    # The worker freezes its heap after the engine load; objects left frozen
    # at exit made triton's bindings (imported by vLLM) print dozens of
    # "nanobind: leaked ..." lines on every clean stop.
    pytest.importorskip("triton")
    code = (
        "import sys, triton; from omnix.stages.worker_cli import main; "
        f"sys.exit(main(['--connect', {server.endpoint!r}, '--stage', 's']))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    try:
        _welcome(server, ScriptedArgs())
        server.send(m.SHUTDOWN, m.Shutdown("test over"))
        assert proc.wait(20) == 0
        assert "leaked" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def test_worker_clean_stop_leaves_no_engine_process(server, tmp_path, monkeypatch):
    # The worker skips the interpreter's finalization, which would have
    # terminated a daemon engine process still running (a vLLM engine core
    # whose close ran out of time); it must kill it itself.
    journal = tmp_path / "journal.jsonl"
    monkeypatch.setenv(JOURNAL_ENV, str(journal))
    proc = _worker(server.endpoint)
    try:
        _welcome(server, ScriptedArgs(leave_child=True))
        [child] = [
            e["child_pid"]
            for e in map(json.loads, journal.read_text().splitlines())
            if e["event"] == "child"
        ]
        assert psutil.pid_exists(child)
        server.send(m.SHUTDOWN, m.Shutdown("test over"))
        assert proc.wait(20) == 0
        wait_until_blocking(lambda: not _alive(child), "the engine's child process to die")
        assert not _alive(child)
    finally:
        proc.kill()
        proc.wait()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_worker_exits_when_server_stops_answering(server):
    proc = _worker(server.endpoint, "--reconnect-for", "0")
    try:
        _welcome(server, ScriptedArgs(), lost_after=0.6)
        server.ack_heartbeats = False
        server.quiet(0.1)
        assert proc.wait(10) == 5
        assert "has not answered heartbeats" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def test_worker_that_lost_its_server_joins_again_with_its_loaded_engine(
    server, tmp_path, monkeypatch
):
    journal = tmp_path / "journal.jsonl"
    monkeypatch.setenv(JOURNAL_ENV, str(journal))
    proc = _worker(server.endpoint, "--reconnect-for", "60")
    try:
        args = ScriptedArgs(chunks_per_piece=1000, delay_ms=5)
        first = _welcome(server, args, lost_after=0.6)
        server.send(m.WORK, [_work("old")])
        assert server.records(1)[0] == m.Started("old")
        server.ack_heartbeats = False  # the server "died": silence
        while (got := server.recv(10))[
            0
        ] == m.OUTPUTS:  # "old" streams until the worker gives up on us
            pass
        mtype, hello = got  # it says hello again, as a new incarnation
        assert mtype == m.HELLO and hello.token != first.token and hello.replica == -1
        server.ack_heartbeats = True
        server.send(m.WELCOME, m.Welcome(0, StageConfig(name="s", engine=args), "p", 0.1, 0.6))
        mtype, ready = server.recv()
        # READY at once: the engine stayed loaded; the old request's outputs stopped.
        assert mtype == m.READY and ready.token == hello.token
        server.send(m.WORK, [_work("new")])
        recs = server.records(2)
        assert recs[0] == m.Started("new") and all(r.request_id == "new" for r in recs)
        server.send(m.SHUTDOWN, m.Shutdown("test over"))
        assert proc.wait(10) == 0
        assert "joined " + server.endpoint + " again" in proc.stderr.read()
        events = [json.loads(ln)["event"] for ln in journal.read_text().splitlines()]
        assert events.count("start") == 1 and "abort" in events
    finally:
        proc.kill()
        proc.wait()


def test_worker_gives_up_rejoining_after_reconnect_for(server):
    proc = _worker(server.endpoint, "--reconnect-for", "1")
    try:
        _welcome(server, ScriptedArgs(), lost_after=0.6)
        server.ack_heartbeats = False
        assert proc.wait(20) == 5
        err = proc.stderr.read()
        assert (
            "has not answered heartbeats" in err and "within 1 s (--reconnect-for); exiting" in err
        )
    finally:
        proc.kill()
        proc.wait()


def test_worker_reports_no_server_and_refusal(tmp_path, server):
    lonely = _worker(f"ipc://{tmp_path}/nobody.sock", "--hello-timeout", "0.5")
    assert lonely.wait(20) == 4
    assert "no answer from a stage runtime" in lonely.stderr.read()
    refused = _worker(server.endpoint)
    server.recv()
    server.send(m.REFUSED, m.Refused("go away, for a test"))
    assert refused.wait(20) == 2
    assert "go away, for a test" in refused.stderr.read()


def test_parse_cpus():
    from omnix.stages.worker_cli import parse_cpus

    assert parse_cpus("1") == {1} and parse_cpus("0,2-3") == {0, 2, 3} and parse_cpus("") == set()
    with pytest.raises(ValueError, match="bad CPU"):
        parse_cpus("a-b")
    with pytest.raises(ValueError, match="bad CPU range"):
        parse_cpus("3-1")


def test_worker_that_lost_its_server_while_loading_joins_again_once_loaded(server):
    proc = _worker(server.endpoint, "--reconnect-for", "60")
    try:
        args = ScriptedArgs(start_delay_ms=2000)  # blocks the worker's loop, as a model load does
        mtype, hello = server.recv()
        assert mtype == m.HELLO
        server.send(m.WELCOME, m.Welcome(0, StageConfig(name="s", engine=args), "p", 0.1, 0.6))
        server.ack_heartbeats = False  # gone while the engine loads
        mtype, again = server.recv(15)
        # Not READY to the old incarnation: a new HELLO, once the load is over.
        assert mtype == m.HELLO and again.token != hello.token
        server.ack_heartbeats = True
        server.send(m.WELCOME, m.Welcome(0, StageConfig(name="s", engine=args), "p", 0.1, 0.6))
        mtype, ready = server.recv()
        assert mtype == m.READY and ready.token == again.token
        server.send(m.SHUTDOWN, m.Shutdown("test over"))
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()
