"""Retention over HTTP: a released request is 410 Gone with an OpenAI-style
body that says how to keep traces longer; one within the window is 200 as
before; an id the server never had is 404.  And ``omnix serve``'s
``--retain*`` flags: what they parse to, and one-line refusals (exit 2)."""

from __future__ import annotations

import aiohttp

from omnix.events.retention import RetentionPolicy
from omnix.http.quantities import parse_duration, parse_size
from omnix.http.serve_options import retention_policy
from omnix.pipelines.validate import parse_pipeline
from omnix.testing.pipelines import scripted_omni_toml
from omnix.testing.serving import serve_scripted

PIPELINE = scripted_omni_toml(
    "retain-omni",
    thinker='engine = { kind = "scripted", chunks_per_piece = 3, delay_ms = 0 }',
    talker='engine = { kind = "scripted", chunks_per_piece = 2, delay_ms = 0, output_modality = "codec" }',
)
USER = [{"role": "user", "content": "hello"}]
#: Keep the newest two ended requests; no time or byte bound.
POLICY = RetentionPolicy(window_s=None, max_requests=2, max_bytes=None)


async def _chat(http: aiohttp.ClientSession, url: str) -> str:
    async with http.post(url + "/v1/chat/completions", json={"messages": USER}) as r:
        assert r.status == 200, await r.text()
        return r.headers["X-Request-Id"]


async def test_released_is_410_retained_is_200_unknown_is_404() -> None:
    cfg = parse_pipeline(PIPELINE, "toml")
    async with (
        serve_scripted(cfg, telemetry=True, omni_options={"retention": POLICY}) as server,
        aiohttp.ClientSession() as http,
    ):
        url = server.url
        rids = [await _chat(http, url) for _ in range(6)]
        omni = server.omni
        assert omni.retention is not None
        old, new = rids[0], rids[-1]
        assert omni.request_status(old) == "released"
        assert omni.request_status(new) == "retained"

        for method, path in (
            ("GET", ""),
            ("GET", "/events"),
            ("GET", "/trace"),
            ("GET", "/stream"),
            ("POST", "/cancel"),
        ):
            async with http.request(method, f"{url}/v1/requests/{old}{path}") as r:
                assert r.status == 410, (path, await r.text())
                assert r.headers["X-Request-Id"] == old
                err = (await r.json())["error"]
                assert err["code"] == "request_released"
                assert err["type"] == "not_found_error"
                assert err["param"] == "id"
                msg = err["message"]
                assert old in msg and "retention window" in msg
                assert "--retain" in msg and "--log-dir" in msg and "--archive" in msg

        async with http.get(f"{url}/v1/requests/{new}") as r:
            assert r.status == 200
            assert (await r.json())["status"] == "finished"
        async with http.get(f"{url}/v1/requests/{new}/events") as r:
            assert r.status == 200
            body = await r.read()
            assert b"finished" in body
        async with http.get(f"{url}/v1/requests/{new}/trace") as r:
            assert r.status == 200
            from omnix.trace import read_trace

            assert new in read_trace(await r.read()).targets

        async with http.get(f"{url}/v1/requests/req-never-was") as r:
            assert r.status == 404
            assert (await r.json())["error"]["code"] == "request_not_found"

        # The retention gauges are on /metrics.
        async with http.get(url + "/metrics") as r:
            text = await r.text()
        values = {
            line.split("{")[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(
                ("omnix_requests_retained", "omnix_log_retained", "omnix_blobs_retained")
            )
        }
        assert set(values) == {
            "omnix_requests_retained",
            "omnix_log_retained_events",
            "omnix_log_retained_bytes",
            "omnix_blobs_retained_bytes",
        }
        assert 1 <= values["omnix_requests_retained"] <= 2
        assert values["omnix_log_retained_events"] > 0
        # Every request was counted by telemetry, released ones included.
        tel = server.state.telemetry
        assert tel is not None
        tel.catch_up(omni.log)
        assert tel.projection.requests_ended == 6
        assert tel.projection.ended_missed == 0


async def test_no_retention_keeps_everything() -> None:
    cfg = parse_pipeline(PIPELINE, "toml")
    async with (
        serve_scripted(cfg, omni_options={"retention": None}) as server,
        aiohttp.ClientSession() as http,
    ):
        rids = [await _chat(http, server.url) for _ in range(4)]
        assert server.omni.retention is None
        for rid in rids:
            async with http.get(f"{server.url}/v1/requests/{rid}") as r:
                assert r.status == 200


def test_retain_flags_parse() -> None:
    assert retention_policy("10m", "2000", "512MB") == RetentionPolicy()
    assert parse_duration("90") == 90.0
    assert parse_duration("90s") == 90.0
    assert parse_duration("1.5h") == 5400.0
    assert parse_duration("0") == 0.0
    assert parse_duration("off") is None
    assert parse_size("100KB") == 100 * 1024
    assert parse_size("2gb") == 2 << 30
    assert parse_size("4096") == 4096
    assert parse_size("off") is None
    p = retention_policy("off", "off", "off")
    assert (p.window_s, p.max_requests, p.max_bytes) == (None, None, None)
