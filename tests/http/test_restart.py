"""``omnix serve --log-dir`` killed with SIGKILL and started again on the
same directory: it serves again, every request it had in flight gets its
one terminal event, the restart is in the log for replay to see, and the
dead server's socket directory is cleaned up."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import subprocess
import sys
import tempfile
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import aiohttp
import pytest

from omnix.events.types import Chunk, Routed, WorkerJoined, WorkerLost
from omnix.orchestrator.recovery import RESTART_REASON
from omnix.replay.drive import drive
from omnix.testing.served import ServeProcess
from omnix.testing.served import omnix_serve as serve_process
from omnix.trace import Trace, read_trace

from .conftest import use_processes

pytestmark = pytest.mark.skipif(not use_processes(), reason="needs the process runtime")
in_session_loop = pytest.mark.asyncio(loop_scope="session")

# One slow stage: a request streams for ~4 s, long enough to kill the
# server in the middle of it.
PIPELINE = """
name = "restart-test"
[[stages]]
name = "thinker"
engine = { kind = "scripted", chunks_per_piece = 200, delay_ms = 20 }
[outputs]
text = "thinker"
"""


def omnix_serve(cfg: Path, log_dir: Path) -> AbstractAsyncContextManager[ServeProcess]:
    return serve_process("--pipeline", str(cfg), "--log-dir", str(log_dir))


async def chat(http: aiohttp.ClientSession, url: str) -> dict[str, object]:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        out: dict[str, object] = await r.json()
        return out


def _pipeline(tmp_path: Path, text: str = PIPELINE) -> Path:
    cfg = tmp_path / "p.toml"
    cfg.write_text(text)
    return cfg


@in_session_loop
async def test_server_killed_idle_serves_again_on_its_log_dir(tmp_path: Path) -> None:
    cfg, log_dir = _pipeline(tmp_path), tmp_path / "log"
    async with aiohttp.ClientSession() as http:
        async with omnix_serve(cfg, log_dir) as first:
            await chat(http, first.url)
            dead_pid = first.proc.pid
            await first.kill9()
        async with omnix_serve(cfg, log_dir) as second:
            async with http.get(second.url + "/ready") as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["stages"] == {"thinker": 1}
            await chat(http, second.url)
    # The dead server's socket dir went with the restart.
    assert not glob.glob(os.path.join(tempfile.gettempdir(), f"omnix-{dead_pid}-*"))


async def _stream_until_killed(http: aiohttp.ClientSession, served: ServeProcess) -> str:
    """Start a streamed chat, kill the server with SIGKILL after 10 SSE
    events; the request id."""
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with http.post(served.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        rid = r.headers["X-Request-Id"]
        seen = 0
        async for line in r.content:
            seen += line.startswith(b"data: ")
            if seen >= 10:
                break
        await served.kill9()
    return rid


async def _events_to_the_end(
    http: aiohttp.ClientSession, url: str, rid: str
) -> tuple[list[str], dict[str, object]]:
    """The request's event kinds, read until its terminal event (the stream
    of a live request would not end), and the last event's data."""
    async with asyncio.timeout(60):
        async with http.get(f"{url}/v1/requests/{rid}/events?format=object") as r:
            text = await r.text()
    kinds = [x[7:] for x in text.splitlines() if x.startswith("event: ")]
    last = json.loads([x for x in text.splitlines() if x.startswith("data: ")][-1][6:])
    return kinds, last


async def _replayed_trace(http: aiohttp.ClientSession, url: str, rid: str) -> Trace:
    async with http.get(f"{url}/v1/requests/{rid}/trace") as r:
        assert r.status == 200, await r.text()
        trace = read_trace(await r.read())
    assert any(isinstance(ev, WorkerLost) and ev.reason == RESTART_REASON for ev in trace.events)
    assert drive(trace).ok  # the restart is recorded; replay re-derives every decision
    return trace


@in_session_loop
async def test_server_killed_mid_stream_continues_the_request_on_restart(tmp_path: Path) -> None:
    cfg, log_dir = _pipeline(tmp_path), tmp_path / "log"
    async with aiohttp.ClientSession() as http:
        async with omnix_serve(cfg, log_dir) as first:
            rid = await _stream_until_killed(http, first)
        async with omnix_serve(cfg, log_dir) as second:
            kinds, _ = await _events_to_the_end(http, second.url, rid)
            assert kinds[-1] == "finished" and not [
                k for k in kinds if k in ("failed", "cancelled")
            ]
            trace = await _replayed_trace(http, second.url, rid)
            # One continuation, on the restarted worker, after the chunks the
            # dead server had logged; the text is the undisturbed run's.
            (lost,) = [
                e for e in trace.events if isinstance(e, WorkerLost) and e.reason == RESTART_REASON
            ]
            (cont,) = [e for e in trace.events if isinstance(e, Routed) and e.resume]
            rejoined = [
                e
                for e in trace.events
                if isinstance(e, WorkerJoined) and lost.pos < e.pos < cont.pos
            ]
            assert cont.resume > 0 and [e.worker_id for e in rejoined] == ["thinker/0"]
            chunks = [e for e in trace.events if isinstance(e, Chunk) and e.request_id == rid]
            assert [c.index for c in chunks] == list(range(200))
            assert "".join(c.text for c in chunks) == "".join(f"t{n} " for n in range(200))
            await chat(http, second.url)  # and new requests are served


@in_session_loop
async def test_server_killed_mid_stream_fails_a_request_whose_stage_does_not_retry(
    tmp_path: Path,
) -> None:
    cfg, log_dir = (
        _pipeline(tmp_path, PIPELINE.replace("[outputs]", "retry = false\n[outputs]")),
        tmp_path / "log",
    )
    async with aiohttp.ClientSession() as http:
        async with omnix_serve(cfg, log_dir) as first:
            rid = await _stream_until_killed(http, first)
        async with omnix_serve(cfg, log_dir) as second:
            async with http.get(f"{second.url}/v1/requests/{rid}") as r:
                state = await r.json()
            assert state["status"] == "failed", state
            kinds, last = await _events_to_the_end(http, second.url, rid)
            assert kinds[-1] == "failed" and kinds.count("failed") == 1
            assert RESTART_REASON in str(last["message"])
            await _replayed_trace(http, second.url, rid)
            await chat(http, second.url)


def _serve_once(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "omnix.cli", "serve", "--port", "0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_a_corrupt_log_is_refused_in_one_line(tmp_path: Path) -> None:
    from omnix.events.disklog import DiskLog
    from omnix.events.types import WorkerJoined

    log_dir = tmp_path / "log"
    log = DiskLog(log_dir / "events")
    for i in range(200):
        log.append(
            WorkerJoined(worker_id=f"w/{i}", stage="w", replica=i, engine="scripted", capacity=1)
        )
    log.close()
    (segment,) = (log_dir / "events").glob("*.seg")
    data = bytearray(segment.read_bytes())
    data[len(data) // 3] ^= 0xFF
    segment.write_bytes(bytes(data))
    done = _serve_once("--pipeline", str(_pipeline(tmp_path)), "--log-dir", str(log_dir))
    assert done.returncode == 2
    assert "corrupt event log" in done.stderr and "Traceback" not in done.stderr


def test_a_bad_pipeline_file_is_refused_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[[stages]]\nname = "a"\nengine = { kind = "nope" }\n')
    done = _serve_once("--pipeline", str(bad))
    assert done.returncode == 2
    assert "bad.toml" in done.stderr and "Traceback" not in done.stderr
