"""A real Prometheus server scrapes omnix's /metrics; PromQL sees the data.

Needs Debian's ``prometheus`` binary (``scripts/test-deps.sh`` installs it);
skipped with the reason when it is absent, a failure under
``OMNIX_REQUIRE_ALL=1`` (CI).  Everything binds to loopback,
every wait is bounded, and the server is killed in teardown.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from omnix.events.clock import ManualClock
from omnix.events.log import MemoryLog
from omnix.telemetry import Telemetry
from omnix.telemetry.http import serve_metrics
from omnix.telemetry.synthetic import tiny_omni_events, worker_events
from tests.telemetry.test_exposition import DASHBOARD, _dashboard_exprs

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="the prometheus binary is not installed (apt-get install prometheus; "
        "scripts/test-deps.sh does it)",
    ),
]

T0 = 1_700_000_000_000_000_000
READY_TIMEOUT_S = 30
DATA_TIMEOUT_S = 45


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Feeder:
    """A log followed by telemetry, fed a tiny-omni request every 200 ms."""

    def __init__(self) -> None:
        self.log = MemoryLog(ManualClock(T0))
        self.tel = Telemetry.from_env("tiny-omni", environ={})
        self.n = 0
        for ev in worker_events():
            self.log.append(ev)

    def append_request(self) -> None:
        outcome = "cancelled" if self.n % 5 == 4 else "finished"
        t0 = T0 + self.n * 1_000_000_000
        for ev in tiny_omni_events(f"req-{self.n}", t0, self.log.next_pos, outcome=outcome):
            self.log.append(ev)
        self.n += 1

    async def run(self) -> None:
        while True:
            self.append_request()
            await asyncio.sleep(0.2)  # the feed's rate: Prometheus rates need a live series


# Function-scoped loop: the fixtures' servers must run on the test's loop.
@pytest_asyncio.fixture(loop_scope="function")
async def omnix_metrics() -> AsyncIterator[tuple[Feeder, int]]:
    feeder = Feeder()
    follow = asyncio.create_task(feeder.tel.run(feeder.log))
    feed = asyncio.create_task(feeder.run())
    runner, port = await serve_metrics(feeder.tel, "127.0.0.1", 0)
    try:
        yield feeder, port
    finally:
        feed.cancel()
        await feeder.tel.aclose(follow)
        await runner.cleanup()


@pytest_asyncio.fixture(loop_scope="function")
async def prometheus(tmp_path: Path, omnix_metrics: tuple[Feeder, int]) -> AsyncIterator[str]:
    _, target_port = omnix_metrics
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: omnix\n"
        "    metrics_path: /metrics\n"
        "    static_configs:\n"
        f"      - targets: ['127.0.0.1:{target_port}']\n"
    )
    log_path = tmp_path / "prometheus.log"
    with log_path.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        async with aiohttp.ClientSession() as http:
            while True:
                if proc.returncode is not None:
                    pytest.fail(
                        f"prometheus exited ({proc.returncode}):\n{log_path.read_text()[-2000:]}"
                    )
                try:
                    async with http.get(
                        f"{url}/-/ready", timeout=aiohttp.ClientTimeout(total=2)
                    ) as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"prometheus not ready in {READY_TIMEOUT_S}s:\n{log_path.read_text()[-2000:]}"
                    )
                await asyncio.sleep(0.2)
        yield url
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await asyncio.wait_for(proc.wait(), 10)


async def _query(http: aiohttp.ClientSession, url: str, promql: str) -> dict:
    async with http.get(
        f"{url}/api/v1/query", params={"query": promql}, timeout=aiohttp.ClientTimeout(total=5)
    ) as r:
        return json.loads(await r.text())


async def test_prometheus_scrapes_ttft_histogram(prometheus: str) -> None:
    ttft = "gen_ai_server_time_to_first_token_seconds_bucket"
    p50 = f"histogram_quantile(0.5, sum by (le) (rate({ttft}[10s])))"
    deadline = time.monotonic() + DATA_TIMEOUT_S
    async with aiohttp.ClientSession() as http:
        while True:
            got = await _query(http, prometheus, f'{ttft}{{pipeline="tiny-omni"}}')
            assert got["status"] == "success", got
            series = got["data"]["result"]
            quantile = await _query(http, prometheus, p50)
            q = quantile["data"]["result"]
            if (
                series
                and any(float(s["value"][1]) > 0 for s in series)
                and q
                and q[0]["value"][1] not in ("NaN",)
            ):
                break
            if time.monotonic() > deadline:
                targets = await (await http.get(f"{prometheus}/api/v1/targets")).text()
                pytest.fail(
                    f"no TTFT data in Prometheus after {DATA_TIMEOUT_S}s; targets: {targets[:1500]}"
                )
            await asyncio.sleep(0.5)
        les = {s["metric"]["le"] for s in series}
        assert "0.005" in les and "+Inf" in les
        assert all("request_id" not in s["metric"] for s in series)
        # Synthetic requests have a 5 ms time to first token: bucket (2.5 ms, 5 ms],
        # within which histogram_quantile interpolates.
        assert 0.0025 < float(q[0]["value"][1]) <= 0.005

        # Every query of the Grafana dashboard is valid PromQL over this data.
        for expr in _dashboard_exprs():
            promql = expr.replace("$pipeline", ".*").replace("$__rate_interval", "10s")
            got = await _query(http, prometheus, promql)
            assert got["status"] == "success", (DASHBOARD.name, expr, got)
