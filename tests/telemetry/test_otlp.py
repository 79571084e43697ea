"""OTLP export: configured only by the standard variables (or the CLI's
endpoint), and what arrives at a receiver is the projection's spans and
metrics.  The receiver is a stdlib HTTP server on loopback in a thread (the
exporters post from their own threads, blocking)."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from omnix.telemetry import OtlpConfig, Telemetry
from tests.telemetry.scenario import PARENT_SPAN_ID, PIPELINE, TRACE_ID, Scenario


class Receiver:
    def __init__(self) -> None:
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/v1/traces":
                    outer.traces.append(ExportTraceServiceRequest.FromString(body))
                elif self.path == "/v1/metrics":
                    outer.metrics.append(ExportMetricsServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def spans(self) -> list:
        return [
            s for req in self.traces for rs in req.resource_spans for ss in rs.scope_spans
            for s in ss.spans
        ]  # fmt: skip

    def metric_names(self) -> set[str]:
        return {
            m.name for req in self.metrics for rm in req.resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics
        }  # fmt: skip


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    yield r
    r.server.shutdown()
    r.server.server_close()
    r.thread.join(timeout=5)


def test_otlp_config_from_the_standard_variables() -> None:
    off = OtlpConfig.resolve({})
    assert not off.enabled
    both = OtlpConfig.resolve({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"})
    assert both.traces_endpoint == "http://c:4318/v1/traces"
    assert both.metrics_endpoint == "http://c:4318/v1/metrics"
    only = OtlpConfig.resolve({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/x"})
    assert only.traces_endpoint == "http://t:4318/x" and only.metrics_endpoint is None
    grpc = OtlpConfig.resolve(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    )
    assert grpc.traces_endpoint == "http://c:4317" and grpc.traces_protocol == "grpc"
    no_metrics = OtlpConfig.resolve(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_METRICS_EXPORTER": "none"}
    )
    assert no_metrics.traces_endpoint and no_metrics.metrics_endpoint is None
    disabled = OtlpConfig.resolve(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}
    )
    assert not disabled.enabled
    cli = OtlpConfig.resolve({}, "http://cli:4318")
    assert cli.metrics_endpoint == "http://cli:4318/v1/metrics"


def test_otlp_export_when_the_endpoint_is_set(receiver: Receiver) -> None:
    tel = Telemetry.from_env(PIPELINE, environ={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
    assert tel.tracing
    sc = Scenario().all()
    tel.catch_up(sc.log)
    tel.shutdown()  # flushes spans; the metric reader exports once more
    spans = receiver.spans()
    names = sorted(s.name for s in spans)
    assert names.count(f"chat {PIPELINE}") == 3  # ok, cancel, refused
    root = next(
        s for s in spans
        if any(a.key == "omnix.request_id" and a.value.string_value == "r-ok" for a in s.attributes)
    )  # fmt: skip
    assert root.trace_id.hex() == TRACE_ID
    assert root.parent_span_id.hex() == PARENT_SPAN_ID
    assert root.start_time_unix_nano == sc.ts("admitted")
    assert root.end_time_unix_nano == sc.ts("finished")
    assert "gen_ai.server.time_to_first_token" in receiver.metric_names()
    assert "omnix.server.real_time_factor" in receiver.metric_names()


def test_cli_reemits_a_trace_over_otlp(receiver: Receiver, capsys: pytest.CaptureFixture) -> None:
    from omnix.telemetry import cli
    from omnix.trace import read_trace

    path = Path(__file__).parents[2] / "replay" / "tiny-omni-normal.trace"
    if not path.exists():
        pytest.skip(f"{path} not in this checkout")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--trace", str(path), "--otlp-endpoint", receiver.url])
    assert cli.run(args) == 0
    trace = read_trace(path)
    times = {ev.ts_ns for ev in trace.events}
    spans = receiver.spans()
    assert {s.name for s in spans} == {
        "chat tiny-omni", "stage thinker", "stage talker", "stage code2wav",
    }  # fmt: skip
    for s in spans:
        assert s.start_time_unix_nano in times and s.end_time_unix_nano in times
    assert "omnix.stage.duration" in receiver.metric_names()
