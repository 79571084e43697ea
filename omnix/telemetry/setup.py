"""The ``Telemetry`` facade: one process's projection, readers and exporters.

Owns: building the pieces from configuration (``Telemetry.from_env``): the
Prometheus reader behind /metrics (always, on a private registry), OTLP
trace and metric export (only when the standard ``OTEL_EXPORTER_OTLP_*``
variables, or an explicit endpoint, ask for it), test hooks (an injected
span exporter or metric reader), and their shutdown.

Does not own what is measured (``projection.py``), the metric vocabulary
(``metrics.py``) or the HTTP server (the HTTP layer mounts
``omnix.telemetry.http.metrics_handler``).

With no exporter and no test hook there is no tracer provider at all: the
projection then skips span work entirely (not even no-op span objects).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import (
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)

from omnix import __version__
from omnix.events.log import EventLog
from omnix.events.types import Event
from omnix.pipelines.config import AudioEngineArgs, PipelineConfig
from omnix.telemetry.metrics import MetricSet
from omnix.telemetry.projection import DEFAULT_SAMPLE_RATE, Projection, RetentionCounters
from omnix.telemetry.spans import SpanWriter

_HTTP = "http/protobuf"
_GRPC = "grpc"


class OtlpConfig:
    """Where OTLP goes, resolved from the environment per the OTel spec.

    ``traces_endpoint``/``metrics_endpoint`` are ``None`` when that signal is
    not exported.  For http/protobuf the generic ``OTEL_EXPORTER_OTLP_ENDPOINT``
    gets ``/v1/traces`` or ``/v1/metrics`` appended; a per-signal endpoint is
    used as given.  gRPC endpoints are used as given.
    """

    def __init__(
        self,
        traces_endpoint: str | None,
        metrics_endpoint: str | None,
        traces_protocol: str,
        metrics_protocol: str,
    ) -> None:
        self.traces_endpoint = traces_endpoint
        self.metrics_endpoint = metrics_endpoint
        self.traces_protocol = traces_protocol
        self.metrics_protocol = metrics_protocol

    @classmethod
    def resolve(cls, environ: Mapping[str, str], endpoint: str | None = None) -> OtlpConfig:
        def truthy(name: str) -> bool:
            return environ.get(name, "").strip().lower() == "true"

        base_protocol = environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", _HTTP).strip() or _HTTP
        out: dict[str, tuple[str | None, str]] = {}
        for signal, path in (("TRACES", "v1/traces"), ("METRICS", "v1/metrics")):
            protocol = environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL", base_protocol).strip()
            protocol = protocol or base_protocol
            specific = environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT", "").strip()
            generic = endpoint or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
            url: str | None
            if endpoint:
                url = _signal_url(endpoint, path, protocol)
            elif specific:
                url = specific
            elif generic:
                url = _signal_url(generic, path, protocol)
            else:
                url = None
            # OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER = none turn a signal off.
            if (
                environ.get(f"OTEL_{signal}_EXPORTER", "").strip().lower() == "none"
                and not endpoint
            ):
                url = None
            if truthy("OTEL_SDK_DISABLED"):
                url = None
            out[signal] = (url, protocol)
        return cls(out["TRACES"][0], out["METRICS"][0], out["TRACES"][1], out["METRICS"][1])

    @property
    def enabled(self) -> bool:
        return bool(self.traces_endpoint or self.metrics_endpoint)


def _signal_url(base: str, path: str, protocol: str) -> str:
    if protocol == _GRPC:
        return base
    return base.rstrip("/") + "/" + path


def _span_exporter(protocol: str, endpoint: str) -> SpanExporter:
    if protocol == _GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint)
    if protocol not in (_HTTP, "http/json"):
        raise ValueError(f"unsupported OTLP protocol {protocol!r} (grpc or http/protobuf)")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpSpanExporter,
    )

    return HttpSpanExporter(endpoint=endpoint)


def _metric_reader(protocol: str, endpoint: str) -> MetricReader:
    if protocol == _GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        exporter: Any = OTLPMetricExporter(endpoint=endpoint)
    else:
        if protocol not in (_HTTP, "http/json"):
            raise ValueError(f"unsupported OTLP protocol {protocol!r} (grpc or http/protobuf)")
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HttpMetricExporter,
        )

        exporter = HttpMetricExporter(endpoint=endpoint)
    # Interval from OTEL_METRIC_EXPORT_INTERVAL (ms, default 60000), read by the reader.
    return PeriodicExportingMetricReader(exporter)


class Telemetry:
    """One process's telemetry: a projection of the log plus its outputs.

    tel = Telemetry.from_env("tiny-omni")
    task = asyncio.create_task(tel.run(log))      # follow the live log
    app.router.add_get("/metrics", metrics_handler(tel))
    ...
    await tel.aclose(task)                        # or tel.shutdown()
    """

    def __init__(
        self,
        pipeline: str = "",
        *,
        tracer_provider: TracerProvider | None = None,
        metric_readers: Sequence[MetricReader] = (),
        prometheus: bool = True,
        sample_rate: int = DEFAULT_SAMPLE_RATE,
        resource: Resource | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.resource = resource or default_resource(pipeline)
        self.metrics = MetricSet(self.resource)
        self.tracer_provider = tracer_provider
        self.prometheus_registry = None
        if prometheus:
            self.prometheus_registry = _prometheus_reader(self.metrics)
        for reader in metric_readers:
            self.metrics.attach(reader)
        spans = None
        if tracer_provider is not None:
            spans = SpanWriter(tracer_provider.get_tracer("omnix.telemetry", __version__))
        self.projection = Projection(
            self.metrics, spans, pipeline=pipeline, sample_rate=sample_rate
        )
        #: where OTLP goes (set by ``from_env``)
        self.otlp: OtlpConfig | None = None
        self._log: EventLog | None = None
        self._closed = False

    @classmethod
    def from_env(
        cls,
        pipeline_name: str | PipelineConfig,
        *,
        environ: Mapping[str, str] | None = None,
        otlp_endpoint: str | None = None,
        span_exporter: SpanExporter | None = None,
        metric_reader: MetricReader | None = None,
        prometheus: bool = True,
        sample_rate: int | None = None,
    ) -> Telemetry:
        """Configure from ``OTEL_*`` variables (``environ``, default ``os.environ``).

        ``pipeline_name`` labels the process-wide metrics; given the
        ``PipelineConfig`` itself, the audio sample rate also comes from its
        codec stage (else ``sample_rate``, default 24000).
        ``otlp_endpoint`` overrides the variables' endpoint (the CLI's
        ``--otlp-endpoint``).  ``span_exporter`` and ``metric_reader`` are
        test hooks (e.g. ``InMemorySpanExporter``, ``InMemoryMetricReader``);
        spans go to an injected exporter synchronously.
        """
        if isinstance(pipeline_name, PipelineConfig):
            if sample_rate is None:
                sample_rate = sample_rate_of(pipeline_name)
            pipeline_name = pipeline_name.name
        if sample_rate is None:
            sample_rate = DEFAULT_SAMPLE_RATE
        env = os.environ if environ is None else environ
        otlp = OtlpConfig.resolve(env, otlp_endpoint)
        resource = default_resource(pipeline_name, env)
        provider = None
        if otlp.traces_endpoint or span_exporter is not None:
            # The sampler comes from OTEL_TRACES_SAMPLER (default: parent-based
            # always-on, so a client's sampled flag is honoured).
            provider = TracerProvider(resource=resource)
            if otlp.traces_endpoint:
                provider.add_span_processor(
                    BatchSpanProcessor(_span_exporter(otlp.traces_protocol, otlp.traces_endpoint))
                )
            if span_exporter is not None:
                provider.add_span_processor(SimpleSpanProcessor(span_exporter))
        readers: list[MetricReader] = []
        if otlp.metrics_endpoint:
            readers.append(_metric_reader(otlp.metrics_protocol, otlp.metrics_endpoint))
        if metric_reader is not None:
            readers.append(metric_reader)
        tel = cls(
            pipeline_name,
            tracer_provider=provider,
            metric_readers=readers,
            prometheus=prometheus,
            sample_rate=sample_rate,
            resource=resource,
        )
        tel.otlp = otlp
        return tel

    @property
    def tracing(self) -> bool:
        return self.tracer_provider is not None

    # -- feeding -------------------------------------------------------------
    def observe(self, ev: Event) -> None:
        """One event in log order (standalone: a trace, a test)."""
        self.projection.observe(ev)

    async def run(self, log: EventLog, start: int | None = 0, *, interval_s: float = 0.05) -> None:
        """Follow ``log`` from ``start`` until it closes (run it as a task);
        see ``Projection.run``."""
        self._log = log
        await self.projection.run(log, start, interval_s=interval_s)

    def catch_up(self, log: EventLog) -> int:
        """Read what ``log`` has beyond the projection's position, now."""
        return self.projection.catch_up(log)

    def follow_retention(self, retention: RetentionCounters | None) -> None:
        """Export a server's retention counters (``omnix.events.retention.
        Retention``) as the ``omnix_*_retained*`` gauges."""
        self.projection.follow_retention(retention)

    # -- outputs -------------------------------------------------------------
    def prometheus_text(self, accept: str = "") -> tuple[str, bytes]:
        """(content type, body) of the Prometheus exposition.  ``accept`` is
        the scraper's Accept header (OpenMetrics when it asks for it)."""
        from prometheus_client.exposition import choose_encoder

        if self.prometheus_registry is None:
            raise RuntimeError("this Telemetry was built with prometheus=False")
        encoder, content_type = choose_encoder(accept)
        return content_type, encoder(self.prometheus_registry)

    def metrics_data(self) -> MetricsData:
        """A snapshot in OpenTelemetry's data model."""
        return self.metrics.collect()

    def force_flush(self) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush()
        for reader in self.metrics.readers:
            reader.force_flush()

    def shutdown(self) -> None:
        """Flush and stop exporters.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        self.metrics.shutdown()

    async def aclose(self, task: Any = None) -> None:
        """Stop the ``run`` task (if given), read what the log gained since
        its last pass, and shut down (flushing exporters)."""
        import asyncio

        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        if self._log is not None and not self._closed:
            self.projection.catch_up(self._log)
        self.shutdown()


def sample_rate_of(pipeline: PipelineConfig) -> int:
    """The sample rate of the stage that produces the pipeline's audio."""
    stage = pipeline.outputs.get("audio")
    for st in pipeline.stages:
        if st.name == stage and isinstance(st.engine, AudioEngineArgs):
            return st.engine.sample_rate
    return DEFAULT_SAMPLE_RATE


def default_resource(pipeline: str, environ: Mapping[str, str] | None = None) -> Resource:
    env = os.environ if environ is None else environ
    attrs: dict[str, Any] = {
        "service.name": env.get("OTEL_SERVICE_NAME", "") or "omnix",
        "service.version": __version__,
    }
    if pipeline:
        attrs["omnix.pipeline"] = pipeline
    # Resource.create also merges OTEL_RESOURCE_ATTRIBUTES (from os.environ).
    return Resource.create(attrs)


def _prometheus_reader(metrics: MetricSet) -> Any:
    """OTel's Prometheus reader on a private registry (never the global
    one: two Telemetry objects in one process, as in tests, must not clash)."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    # scope_info off: no otel_scope_* labels on every series; the label set
    # stays the documented one.
    reader = PrometheusMetricReader(registry=registry, scope_info_enabled=False)
    metrics.attach(reader)
    return registry
