"""omnix's metric instruments: cheap recording, OpenTelemetry collection.

Owns: the metric vocabulary (``INSTRUMENTS``: name, unit, kind, labels and
explicit bucket boundaries, the table that plays the part of OTel Views),
the aggregation behind it (``MetricSet``), the snapshot in OpenTelemetry's
data model (``MetricSet.collect() -> MetricsData``) and the attachment of
any OTel SDK ``MetricReader`` to that snapshot (``MetricSet.attach``):
PrometheusMetricReader for /metrics, PeriodicExportingMetricReader with an
OTLP exporter, InMemoryMetricReader in tests.

Does not own what is measured (``projection.py`` turns events into
observations), exporter selection (``setup.py``) or HTTP (``http.py``).

Why not the SDK's instruments: recording through an SDK ``Histogram`` costs
~10 us per observation here (attribute cleaning, hashing, measurement
objects), more than a whole log append (3-6 us); a request makes about a
dozen observations, so SDK recording alone would cost ~15% of the log's
throughput.  Here recording is a ``list.append`` of a raw integer on a
series the recorder holds; bucketing is done in bulk (numpy
``searchsorted``/``bincount``) at collection and every few hundred requests.  Collection, naming, Prometheus
translation and OTLP export stay OpenTelemetry's: readers are given a
collect callback exactly as ``MeterProvider`` gives them one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricReader,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from omnix import __version__

Kind = Literal["histogram", "counter", "updown", "gauge"]

# Explicit bucket boundaries (seconds unless noted).  OTel's default
# histogram boundaries (0, 5, 10, 25, 50, 75, 100, 250, ... 10000) are meant
# for milliseconds and put every sub-5 s latency into one or two buckets.
#: First-output latencies (TTFT, TTFP) and queue time: 0.5 ms .. 30 s.
FIRST_OUTPUT_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0,
)  # fmt: skip
#: Whole-request and whole-stage durations: 1 ms .. 10 min.
DURATION_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
    0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
    300.0, 600.0,
)  # fmt: skip
#: Time per output token: 0.1 ms .. 2.5 s.
TPOT_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02,
    0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
)  # fmt: skip
#: Real-time factor (dimensionless; < 1 is faster than real time).
RTF_BUCKETS: tuple[float, ...] = (
    0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.75, 0.9, 1.0,
    1.25, 1.5, 2.0, 3.0, 5.0, 10.0,
)  # fmt: skip


@dataclass(frozen=True)
class InstrumentSpec:
    """One metric: its OTel name and unit, kind, label names, buckets."""

    name: str
    unit: str
    kind: Kind
    labels: tuple[str, ...]
    description: str
    buckets: tuple[float, ...] = ()


# The vocabulary.  Label values are bounded: pipeline and stage names come
# from configuration, reasons and statuses from closed sets in
# omnix.events.types, token types input/output.  Never a request id, a
# prompt or a path.
INSTRUMENTS: tuple[InstrumentSpec, ...] = (
    InstrumentSpec(
        "gen_ai.server.request.duration",
        "s",
        "histogram",
        ("pipeline", "status"),
        "Admission to the terminal event (finished, cancelled or failed).",
        DURATION_BUCKETS,
    ),
    InstrumentSpec(
        "gen_ai.server.time_to_first_token",
        "s",
        "histogram",
        ("pipeline",),
        "Admission to the first text chunk of any stage.",
        FIRST_OUTPUT_BUCKETS,
    ),
    InstrumentSpec(
        "gen_ai.server.time_per_output_token",
        "s",
        "histogram",
        ("pipeline", "stage"),
        "Per finished text stage: (last chunk - first chunk) / (output tokens - 1).",
        TPOT_BUCKETS,
    ),
    InstrumentSpec(
        "omnix.server.time_to_first_packet",
        "s",
        "histogram",
        ("pipeline", "modality"),
        "Admission to the first streamed media chunk (audio: TTFP; image).",
        FIRST_OUTPUT_BUCKETS,
    ),
    InstrumentSpec(
        "omnix.server.real_time_factor",
        "1",
        "histogram",
        ("pipeline",),
        "Request duration / seconds of audio generated (finished requests with audio).",
        RTF_BUCKETS,
    ),
    InstrumentSpec(
        "omnix.stage.duration",
        "s",
        "histogram",
        ("pipeline", "stage", "status"),
        "A stage's hold on a request: first Routed to its end (finished, "
        "aborted, failed, lost, or the request's end when unfinished).",
        DURATION_BUCKETS,
    ),
    InstrumentSpec(
        "omnix.stage.queue_time",
        "s",
        "histogram",
        ("pipeline", "stage"),
        "First Routed to StageStarted (or the first chunk when no start was recorded).",
        FIRST_OUTPUT_BUCKETS,
    ),
    InstrumentSpec(
        "omnix.stage.tokens",
        "{token}",
        "counter",
        ("pipeline", "stage", "type"),
        "Tokens a stage reported at StageFinished; type is input or output.",
    ),
    InstrumentSpec(
        "omnix.audio.generated",
        "s",
        "counter",
        ("pipeline",),
        "Seconds of audio in audio chunks (samples / sample rate).",
    ),
    InstrumentSpec(
        "omnix.requests.active",
        "{request}",
        "updown",
        ("pipeline",),
        "Requests admitted and not yet terminal.",
    ),
    InstrumentSpec(
        "omnix.requests.rejected",
        "{request}",
        "counter",
        ("pipeline", "reason"),
        "Admissions refused (Rejected) by reason.",
    ),
    InstrumentSpec(
        "omnix.requests.cancelled",
        "{request}",
        "counter",
        ("pipeline", "reason"),
        "Requests that ended Cancelled, by reason.",
    ),
    InstrumentSpec(
        "omnix.requests.failed",
        "{request}",
        "counter",
        ("pipeline", "reason", "stage"),
        "Requests that ended Failed, by reason and the stage named by the failure.",
    ),
    InstrumentSpec(
        "omnix.events",
        "{event}",
        "counter",
        ("pipeline",),
        "Events in the log (its length).",
    ),
    InstrumentSpec(
        "omnix.workers.ready",
        "{worker}",
        "updown",
        ("pipeline", "stage"),
        "Stage replicas joined and not lost.",
    ),
    InstrumentSpec(
        "omnix.log.retained_events",
        "{event}",
        "gauge",
        ("pipeline",),
        "Request events the log holds for retained requests (in flight and ended within "
        "the retention window).",
    ),
    InstrumentSpec(
        "omnix.log.retained_bytes",
        "By",
        "gauge",
        ("pipeline",),
        "Approximate encoded bytes of those events (what the --retain-bytes bound counts, "
        "with the blobs).",
    ),
    InstrumentSpec(
        "omnix.blobs.retained_bytes",
        "By",
        "gauge",
        ("pipeline",),
        "Bytes of the distinct blobs retained events refer to.",
    ),
    InstrumentSpec(
        "omnix.requests.retained",
        "{request}",
        "gauge",
        ("pipeline",),
        "Requests whose events and state are held: in flight, and ended within the window.",
    ),
    InstrumentSpec(
        "omnix.telemetry.dropped",
        "{event}",
        "counter",
        ("pipeline",),
        "Events the standalone projection could not fold (illegal in its view).",
    ),
)

SPECS: dict[str, InstrumentSpec] = {s.name: s for s in INSTRUMENTS}

#: Series per instrument beyond which new label sets fold into one overflow
#: series (OpenTelemetry's cardinality limit, same marker value).
MAX_SERIES = 2000
_OVERFLOW = "__overflow__"

Key = tuple[str, ...]


class HistogramSeries:
    """One label set's buckets, fed through a pending list.

    ``series.add(raw)`` is a bound ``list.append``: one C call, atomic under
    the GIL, no lock.  ``raw`` is in the series' own unit times ``scale``
    (nanoseconds for the latency series, ``scale=1e-9``), so the recorder
    does no float arithmetic either.  ``fold`` moves pending values into the
    buckets in bulk (numpy ``searchsorted``/``bincount``); collection folds
    first, and the recorder folds every few hundred requests to bound the
    pending list.
    """

    __slots__ = ("_np_bounds", "add", "bounds", "counts", "max", "min", "pending", "scale", "sum")

    def __init__(self, bounds: tuple[float, ...], scale: float = 1.0) -> None:
        self.bounds = bounds
        self.scale = scale
        self._np_bounds = np.asarray(bounds, dtype=np.float64)
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)
        self.sum = 0.0
        self.min = float("inf")
        self.max = float("-inf")
        self.pending: list[float] = []
        self.add: Callable[[float], None] = self.pending.append

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def record(self, value: float) -> None:
        """One value in the series' unit (not scaled)."""
        self.record_many(np.asarray([value], dtype=np.float64))

    def fold(self) -> None:
        """Move pending values into the buckets.  Call with ``MetricSet.lock``
        held (folds must not interleave; ``add`` needs no lock)."""
        pending = self.pending
        n = len(pending)
        if not n:
            return
        values = pending[:n]
        # Values appended meanwhile by another thread sit after n and stay.
        del pending[:n]
        arr = np.asarray(values, dtype=np.float64)
        if self.scale != 1.0:
            arr *= self.scale
        self.record_many(arr)

    def record_many(self, values: np.ndarray) -> None:
        if not len(values):
            return
        # searchsorted "left" is bisect_left: a value equal to a bound is in
        # that bound's bucket (OpenTelemetry's and Prometheus's ``le``).
        idx = np.searchsorted(self._np_bounds, values, side="left")
        self.counts += np.bincount(idx, minlength=len(self.counts))
        self.sum += float(values.sum())
        self.min = min(self.min, float(values.min()))
        self.max = max(self.max, float(values.max()))


class Cell:
    """One label set's number (a counter or up-down counter)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: float = 0


def _capped(series: Mapping[Key, object], key: Key) -> Key:
    # Past MAX_SERIES, new label sets share one overflow series.
    if len(series) >= MAX_SERIES:
        return (_OVERFLOW,) * len(key)
    return key


class HistogramInstrument:
    """Explicit-bucket histogram: bucket i counts ``bounds[i-1] < v <= bounds[i]``
    (OpenTelemetry's and Prometheus's ``le`` convention)."""

    __slots__ = ("bounds", "series", "spec")

    def __init__(self, spec: InstrumentSpec) -> None:
        self.spec = spec
        self.bounds = spec.buckets
        self.series: dict[Key, HistogramSeries] = {}

    def get(self, key: Key, scale: float = 1.0) -> HistogramSeries:
        """The series for ``key``; ``scale`` applies to ``add`` (raw) values
        and is fixed by whoever creates the series first."""
        s = self.series.get(key)
        if s is None:
            key = _capped(self.series, key)
            s = self.series.get(key)
            if s is None:
                s = self.series[key] = HistogramSeries(self.bounds, scale)
        return s

    def record(self, key: Key, value: float) -> None:
        self.get(key).record(value)


class SumInstrument:
    """A counter (monotonic) or an up-down counter: a number per label set.

    ``callback`` (if set) supplies the values instead at collection time:
    for figures the projection already keeps (events by type, workers,
    requests in flight) so the hot path records nothing twice.
    """

    __slots__ = ("callback", "series", "spec")

    def __init__(self, spec: InstrumentSpec) -> None:
        self.spec = spec
        self.series: dict[Key, Cell] = {}
        self.callback: Callable[[], Iterable[tuple[Key, float]]] | None = None

    def get(self, key: Key) -> Cell:
        c = self.series.get(key)
        if c is None:
            key = _capped(self.series, key)
            c = self.series.get(key)
            if c is None:
                c = self.series[key] = Cell()
        return c

    def add(self, key: Key, value: float = 1) -> None:
        self.get(key).value += value

    def points(self) -> list[tuple[Key, float]]:
        if self.callback is not None:
            return list(self.callback())
        return [(k, c.value) for k, c in list(self.series.items())]


class MetricSet:
    """All of omnix's instruments for one process, and their readers.

    Threads: one writer (the projection, on the event loop thread).  Counter
    cells are single attribute updates and histogram values list appends,
    so recording takes no lock; ``lock`` serialises folding pending values
    and collecting (a PeriodicExportingMetricReader collects from its own
    thread, /metrics from the loop).
    """

    def __init__(self, resource: Resource | None = None) -> None:
        self.resource = resource or Resource.create({"service.name": "omnix"})
        self.scope = InstrumentationScope("omnix.telemetry", __version__)
        self.lock = threading.Lock()
        self.start_ns = time.time_ns()
        self.histograms: dict[str, HistogramInstrument] = {}
        self.sums: dict[str, SumInstrument] = {}
        for spec in INSTRUMENTS:
            if spec.kind == "histogram":
                self.histograms[spec.name] = HistogramInstrument(spec)
            else:
                self.sums[spec.name] = SumInstrument(spec)
        self.readers: list[MetricReader] = []

    def flush(self) -> None:
        """Fold every pending value now (bounds the pending lists)."""
        with self.lock:
            for h in self.histograms.values():
                for series in list(h.series.values()):
                    series.fold()

    def histogram(self, name: str) -> HistogramInstrument:
        return self.histograms[name]

    def sum(self, name: str) -> SumInstrument:
        return self.sums[name]

    # -- collection ------------------------------------------------------
    def collect(self) -> MetricsData:
        """A cumulative snapshot of every instrument with data, as OTel data."""
        now = time.time_ns()
        start = self.start_ns
        metrics: list[Metric] = []
        with self.lock:
            for h in self.histograms.values():
                for series in list(h.series.values()):
                    series.fold()
            for spec in INSTRUMENTS:
                names = spec.labels
                if spec.kind == "histogram":
                    h = self.histograms[spec.name]
                    hpoints = [
                        HistogramDataPoint(
                            attributes=dict(zip(names, key, strict=True)),
                            start_time_unix_nano=start,
                            time_unix_nano=now,
                            count=s.count,
                            sum=s.sum,
                            bucket_counts=s.counts.tolist(),
                            explicit_bounds=list(h.bounds),
                            min=s.min,
                            max=s.max,
                        )
                        for key, s in sorted(list(h.series.items()))
                        if s.max >= s.min  # recorded at least once
                    ]
                    if hpoints:
                        data = Histogram(hpoints, AggregationTemporality.CUMULATIVE)
                        metrics.append(Metric(spec.name, spec.description, spec.unit, data))
                    continue
                npoints = [
                    NumberDataPoint(
                        attributes=dict(zip(names, key, strict=True)),
                        start_time_unix_nano=start,
                        time_unix_nano=now,
                        value=value,
                    )
                    for key, value in sorted(self.sums[spec.name].points())
                ]
                if not npoints:
                    continue
                if spec.kind == "gauge":
                    ndata: Sum | Gauge = Gauge(npoints)
                else:
                    ndata = Sum(
                        npoints,
                        AggregationTemporality.CUMULATIVE,
                        is_monotonic=spec.kind == "counter",
                    )
                metrics.append(Metric(spec.name, spec.description, spec.unit, ndata))
        scope = ScopeMetrics(self.scope, metrics, "")
        return MetricsData([ResourceMetrics(self.resource, [scope], "")])

    def attach(self, reader: MetricReader) -> MetricReader:
        """Make ``reader`` collect this set, as a ``MeterProvider`` would.

        ``_set_collect_callback`` is the SDK's own hook between a provider
        and its readers (internal, stable since 1.x): the reader then works
        unchanged -- Prometheus translation, periodic OTLP export, in-memory
        collection for tests.  Only cumulative temporality is produced.
        """
        setter = getattr(reader, "_set_collect_callback", None)
        if setter is None:  # pragma: no cover - a future SDK without the hook
            raise RuntimeError(
                "this opentelemetry-sdk's MetricReader has no _set_collect_callback; "
                "omnix.telemetry needs opentelemetry-sdk 1.x"
            )

        def _collect(_reader: MetricReader, timeout_millis: float = 10_000) -> MetricsData:
            return self.collect()

        setter(_collect)
        self.readers.append(reader)
        return reader

    def shutdown(self) -> None:
        readers, self.readers = self.readers, []
        for reader in readers:
            try:
                reader.shutdown()
            except Exception:  # a failing exporter must not block shutdown
                pass


def prometheus_name(spec: InstrumentSpec) -> str:
    """The family name OTel's Prometheus exporter gives ``spec`` (documented
    in docs/telemetry.md; the tests check it against the exporter)."""
    from opentelemetry.exporter.prometheus._mapping import map_unit, sanitize_full_name

    name = sanitize_full_name(spec.name)
    unit = map_unit(spec.unit)
    if unit and not name.endswith("_" + unit):
        name += "_" + unit
    return name


def prometheus_samples(spec: InstrumentSpec) -> Sequence[str]:
    """Sample names a family produces in the text exposition."""
    base = prometheus_name(spec)
    if spec.kind == "histogram":
        return (base + "_bucket", base + "_sum", base + "_count")
    if spec.kind == "counter":
        return (base + "_total",)
    return (base,)
