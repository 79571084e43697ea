"""Prometheus exposition: names, format, the /metrics handler, the dashboard."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from omnix.telemetry import Telemetry, metrics_handler, render_metrics
from omnix.telemetry.metrics import INSTRUMENTS, prometheus_name, prometheus_samples
from tests.telemetry.scenario import PIPELINE, Scenario

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana-dashboard.json"


@pytest.fixture(scope="module")
def exposition() -> str:
    tel = Telemetry.from_env(PIPELINE, environ={})
    tel.catch_up(Scenario().all().log)
    content_type, body = render_metrics(tel)
    assert content_type.startswith("text/plain; version=0.0.4")
    tel.shutdown()
    return body.decode()


def _samples(text: str) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_every_instrument_is_exposed(exposition: str) -> None:
    names = _samples(exposition)
    for spec in INSTRUMENTS:
        for sample in prometheus_samples(spec):
            assert sample in names, f"{spec.name} -> {sample} missing"
    assert "gen_ai_server_time_to_first_token_seconds_bucket" in names


def test_bucket_boundaries_are_the_declared_ones(exposition: str) -> None:
    fams = {f.name: f for f in text_string_to_metric_families(exposition)}
    for spec in INSTRUMENTS:
        if spec.kind != "histogram":
            continue
        fam = fams[prometheus_name(spec)]
        les = sorted({float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket")})
        assert les == sorted([*spec.buckets, float("inf")]), spec.name


def test_names_match_the_otel_sdk_exporter() -> None:
    """Our families are named as OpenTelemetry's own SDK + Prometheus
    exporter would name the same instruments (the GenAI names line up with
    other GenAI dashboards)."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    reader = PrometheusMetricReader(registry=registry, scope_info_enabled=False)
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("parity")
    for spec in INSTRUMENTS:
        if spec.kind == "histogram":
            meter.create_histogram(spec.name, unit=spec.unit).record(1.0, {"pipeline": "p"})
        elif spec.kind == "counter":
            meter.create_counter(spec.name, unit=spec.unit).add(1, {"pipeline": "p"})
        else:
            meter.create_up_down_counter(spec.name, unit=spec.unit).add(1, {"pipeline": "p"})
    sdk_names = _samples(generate_latest(registry).decode()) - {"target_info"}
    ours = {n for spec in INSTRUMENTS for n in prometheus_samples(spec)}
    provider.shutdown()
    assert sdk_names == ours


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = []

    def walk(panels: list) -> None:
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))

    walk(dash["panels"])
    return exprs


_FUNCS = {
    "histogram_quantile", "sum", "rate", "by", "le", "irate", "increase", "avg", "max",
    "min", "without", "on", "ignoring", "and", "or", "unless", "count", "clamp_min",
}  # fmt: skip


def dashboard_metric_names() -> set[str]:
    names = set()
    for expr in _dashboard_exprs():
        # Drop label matchers, by(...) lists and strings; what is left that
        # looks like a metric name is one.
        body = re.sub(r"\{[^}]*\}", "", expr)
        body = re.sub(r"by \([^)]*\)", "", body)
        body = re.sub(r'"[^"]*"', "", body)
        for tok in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", body):
            if tok not in _FUNCS and not tok.startswith("__"):
                names.add(tok)
    return names


def test_dashboard_uses_only_exposed_metrics(exposition: str) -> None:
    used = dashboard_metric_names()
    assert used, "no metric found in the dashboard's queries"
    missing = used - _samples(exposition)
    assert not missing, f"dashboard queries metrics that /metrics does not expose: {missing}"
    # It shows the headline figures.
    for name in (
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "omnix_server_time_to_first_packet_seconds_bucket",
        "omnix_server_real_time_factor_bucket",
        "omnix_stage_duration_seconds_bucket",
        "omnix_requests_failed_total",
        "omnix_workers_ready",
    ):
        assert name in used


async def test_metrics_handler_serves_the_exposition() -> None:
    tel = Telemetry.from_env(PIPELINE, environ={})
    tel.catch_up(Scenario().all().log)
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(tel))
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/metrics")
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await resp.text()
        assert "gen_ai_server_time_to_first_token_seconds_bucket{" in text
        assert "r-ok" not in text  # never a request id
        resp = await client.get(
            "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert (await resp.text()).rstrip().endswith("# EOF")
    tel.shutdown()


def test_two_telemetries_do_not_share_a_registry() -> None:
    a = Telemetry.from_env("a", environ={})
    b = Telemetry.from_env("b", environ={})
    a.catch_up(Scenario().all().log)
    assert 'pipeline="tiny-omni"' in a.prometheus_text()[1].decode()
    assert 'status="finished"' not in b.prometheus_text()[1].decode()
    a.shutdown()
    b.shutdown()
