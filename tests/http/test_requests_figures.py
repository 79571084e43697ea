"""``GET /v1/requests/{id}/figures``: TTFT, time to first audio, RTF and each
stage's tokens per second, every one a difference of the times the
request's events recorded in the log."""

from __future__ import annotations

import pytest

from omnix.events.types import Chunk
from omnix.telemetry.setup import sample_rate_of

pytestmark = pytest.mark.asyncio(loop_scope="session")

SPOKEN = {
    "messages": [{"role": "user", "content": "hi"}],
    "modalities": ["text", "audio"],
    "audio": {"format": "wav", "voice": "default"},
}


async def test_figures_are_the_logs_times(omni_server, http):
    async with http.post(omni_server.url + "/v1/chat/completions", json=SPOKEN) as r:
        assert r.status == 200
        rid = r.headers["X-Request-Id"]
    async with http.get(f"{omni_server.url}/v1/requests/{rid}/figures") as r:
        assert r.status == 200
        f = await r.json()
    rs = omni_server.omni.state(rid)
    events = [ev async for ev in omni_server.omni.events(rid)]
    t0 = rs.admitted_ts
    assert f["admitted_ts_ns"] == t0 and f["status"] == "finished"
    assert f["ttft_ms"] == (rs.first_token_ts - t0) / 1e6
    assert f["time_to_first_audio_ms"] == (rs.first_audio_ts - t0) / 1e6
    assert f["time_to_first_image_ms"] is None
    assert f["e2e_ms"] == (rs.terminal_ts - t0) / 1e6
    samples = sum(
        ev.blob.shape[0]
        for ev in events
        if type(ev) is Chunk and ev.modality == "audio" and ev.blob is not None
    )
    assert samples > 0
    assert f["audio_s"] == samples / sample_rate_of(omni_server.omni.pipeline)
    assert f["rtf"] == pytest.approx(f["e2e_ms"] / 1e3 / f["audio_s"])
    thinker = next(s for s in f["stages"] if s["name"] == "thinker")
    st = rs.stage("thinker")
    assert thinker["output_tokens"] == st.output_tokens > 0
    run = st.finished_ts - st.started_ts
    assert thinker["run_ms"] == run / 1e6
    assert thinker["tokens_per_s"] == pytest.approx(st.output_tokens / (run / 1e9))
    assert [s["name"] for s in f["stages"]] == [s.name for s in rs.stages]


async def test_figures_of_an_unknown_request_are_404(omni_server, http):
    async with http.get(f"{omni_server.url}/v1/requests/nope/figures") as r:
        assert r.status == 404
