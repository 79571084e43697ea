"""A live run through real worker processes and the HTTP API, then replayed
in every mode: the trace the server hands out, the one the CLI exports
from the log directory and the one the API exports are the same bytes;
they fold, drive with the same decisions, and regenerate the exact bytes
each client received."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from omnix.cli import main
from omnix.events.types import Chunk
from omnix.pipelines.validate import parse_pipeline
from omnix.replay.client import client_bytes, client_response
from omnix.replay.counterfactual import counterfactual
from omnix.replay.drive import drive
from omnix.replay.faults import inject
from omnix.stages.options import RuntimeOptions
from omnix.testing.pipelines import scripted_omni_toml
from omnix.trace import export_trace, read_trace
from omnix.traceview.show import render_timeline

pytestmark = pytest.mark.slow

LIVE = scripted_omni_toml(
    "live-omni",
    thinker='engine = { kind = "scripted", chunks_per_piece = 10, delay_ms = 2 }',
    talker='replicas = 2\nengine = { kind = "scripted", chunks_per_piece = 4, delay_ms = 1, output_modality = "codec" }',
    edge_thinker='forward = "chunk"\nevery = 3',
)


async def _chat(session, url: str, *, audio: bool, stream: bool = True) -> tuple[str, bytes]:
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": stream, "seed": 5}
    if audio:
        body |= {"modalities": ["text", "audio"], "audio": {"format": "pcm16"}}
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return r.headers["X-Request-Id"], await r.read()


async def test_live_http_run_replays_in_every_mode(tmp_path, capsys):
    from omnix.testing.serving import serve_scripted

    log_dir = tmp_path / "log"
    served: dict[str, bytes] = {}
    api: dict[str, bytes] = {}
    async with serve_scripted(
        parse_pipeline(LIVE),
        processes=True,
        omni_options={"log_dir": log_dir},
        runtime_options=RuntimeOptions(forward_worker_output=False),
    ) as server:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            results = await asyncio.gather(
                _chat(http, server.url, audio=True),
                _chat(http, server.url, audio=True),
                _chat(http, server.url, audio=False),
                _chat(http, server.url, audio=True, stream=False),
            )
            for rid, _ in results:
                async with http.get(f"{server.url}/v1/requests/{rid}/trace") as r:
                    assert r.status == 200
                    served[rid] = await r.read()
        omni = server.omni
        for rid, _ in results:
            api[rid] = export_trace(omni.log, omni.blobs, omni.pipeline, [rid])
        # Both talker replicas were used: the decisions are cross-request.
        talkers = {
            e.replica for e in omni.log.read() if isinstance(e, Chunk) and e.stage == "talker"
        }
        assert talkers == {0, 1}

    for rid, received in results:
        assert served[rid] == api[rid]
        out = tmp_path / f"{rid}.trace"
        assert (
            main(["trace", "export", "--log-dir", str(log_dir), "--request", rid, "-o", str(out)])
            == 0
        )
        assert out.read_bytes() == api[rid], "CLI export differs from the API's"

        trace = read_trace(api[rid])
        assert drive(trace).ok
        assert "re-folded, matches" in render_timeline(trace)
        assert counterfactual(trace).same
        assert client_bytes(trace, rid) == received
        assert client_response(trace, rid).head.status == 200
        # Faults on a real recording: the invariants hold wherever it lands.
        firsts = [e.pos for e in trace.events_for(rid) if isinstance(e, Chunk)]
        for p in (firsts[0], firsts[len(firsts) // 2]):
            for spec in (f"cancel@{p}", f"worker-lost@{p}"):
                res = inject(trace, [spec])
                assert res.ok, res.report(trace)
        body = tmp_path / f"{rid}.body"
        capsys.readouterr()
        assert main(["replay", str(out), "--client-bytes", "-o", str(body)]) == 0
        assert body.read_bytes() == received
