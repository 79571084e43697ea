"""Fixtures for the telemetry tests: a Telemetry with in-memory exporters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from omnix.telemetry import Telemetry
from tests.telemetry.scenario import PIPELINE


class Harness:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.reader = InMemoryMetricReader()
        self.tel = Telemetry.from_env(
            PIPELINE, environ={}, span_exporter=self.spans, metric_reader=self.reader
        )

    def points(self, name: str) -> dict[tuple[tuple[str, str], ...], object]:
        """Data points of metric ``name`` by sorted attribute items."""
        data = self.reader.get_metrics_data()
        out: dict[tuple[tuple[str, str], ...], object] = {}
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == name:
                        for p in m.data.data_points:
                            out[tuple(sorted(p.attributes.items()))] = p
        return out

    def by_name(self) -> dict[str, object]:
        return {s.name: s for s in self.spans.get_finished_spans()}


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.tel.shutdown()
