"""The projection: span trees and metric values from hand-built event logs."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from omnix.events.clock import ManualClock
from omnix.events.log import MemoryLog
from omnix.events.types import Event
from omnix.telemetry import Telemetry
from omnix.telemetry.metrics import DURATION_BUCKETS, INSTRUMENTS
from tests.telemetry.scenario import MS, PARENT_SPAN_ID, PIPELINE, SAMPLES, TRACE_ID, Scenario

ALLOWED_LABELS = {"pipeline", "stage", "modality", "reason", "status", "type"}


def _run(h, sc: Scenario) -> None:
    h.tel.catch_up(sc.log)


def _tree(h):
    spans = h.spans.get_finished_spans()
    roots = [s for s in spans if s.kind == SpanKind.SERVER]
    children = {r.context.span_id: [] for r in roots}
    for s in spans:
        if s.kind != SpanKind.SERVER:
            children[s.parent.span_id].append(s)
    return roots, children


def test_finished_request_span_tree(harness) -> None:
    sc = Scenario()
    sc.workers()
    sc.finished()
    _run(harness, sc)
    roots, children = _tree(harness)
    assert len(roots) == 1
    req = roots[0]
    # GenAI naming: "{operation} {model}", continuing the client's traceparent.
    assert req.name == f"chat {PIPELINE}"
    assert format(req.context.trace_id, "032x") == TRACE_ID
    assert format(req.parent.span_id, "016x") == PARENT_SPAN_ID
    assert req.parent.is_remote
    assert req.start_time == sc.ts("admitted")
    assert req.end_time == sc.ts("finished")
    a = req.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == PIPELINE
    assert a["gen_ai.usage.input_tokens"] == 5
    assert a["gen_ai.usage.output_tokens"] == 3
    assert a["gen_ai.response.finish_reasons"] == ("stop",)
    assert a["omnix.status"] == "finished"
    assert a["omnix.request_id"] == "r-ok"
    assert a["omnix.audio.seconds"] == pytest.approx(2 * SAMPLES / 24000)
    assert req.status.status_code == StatusCode.UNSET
    req_events = {e.name: e.timestamp for e in req.events}
    assert req_events == {
        "first_token": sc.ts("text-0"),
        "first_audio_packet": sc.ts("audio-0"),
    }

    stages = {s.name: s for s in children[req.context.span_id]}
    assert set(stages) == {"stage thinker", "stage talker", "stage code2wav"}
    for s in stages.values():
        assert s.context.trace_id == req.context.trace_id
    th, tk, cw = stages["stage thinker"], stages["stage talker"], stages["stage code2wav"]
    assert (th.start_time, th.end_time) == (sc.ts("routed-thinker"), sc.ts("finished-thinker"))
    assert (tk.start_time, tk.end_time) == (sc.ts("routed-talker"), sc.ts("finished-talker"))
    assert (cw.start_time, cw.end_time) == (sc.ts("routed-c2w-0"), sc.ts("finished-code2wav"))
    assert {e.name: e.timestamp for e in th.events} == {
        "stage_started": sc.ts("started-thinker"),
        "first_token": sc.ts("text-0"),
    }
    assert {e.name: e.timestamp for e in tk.events} == {
        "stage_started": sc.ts("started-talker"),
        "first_codec_chunk": sc.ts("codec-0"),
    }
    assert {e.name: e.timestamp for e in cw.events} == {
        "stage_started": sc.ts("started-code2wav"),
        "first_audio_packet": sc.ts("audio-0"),
    }
    assert th.attributes["omnix.stage"] == "thinker"
    assert th.attributes["omnix.replica"] == 0
    assert th.attributes["omnix.status"] == "finished"
    assert th.attributes["omnix.modality"] == "text"
    assert th.attributes["gen_ai.usage.output_tokens"] == 3
    assert cw.attributes["omnix.pieces"] == 2
    assert cw.attributes["omnix.audio.seconds"] == pytest.approx(0.4)
    assert "omnix.audio.seconds" not in tk.attributes


def test_cancelled_and_failed_spans(harness) -> None:
    sc = Scenario()
    sc.workers()
    sc.cancelled()
    sc.failed()
    sc.rejected()
    _run(harness, sc)
    roots, children = _tree(harness)
    by_rid = {r.attributes["omnix.request_id"]: r for r in roots}
    assert set(by_rid) == {"r-cancel", "r-fail", "r-refused"}

    c = by_rid["r-cancel"]
    assert c.parent is None  # no traceparent: a new trace
    assert (c.start_time, c.end_time) == (sc.ts("c-admitted"), sc.ts("c-cancelled"))
    assert c.attributes["omnix.status"] == "cancelled"
    assert c.attributes["omnix.reason"] == "client"
    assert c.status.status_code == StatusCode.UNSET
    cancel = [e for e in c.events if e.name == "cancel_requested"]
    assert len(cancel) == 1 and cancel[0].timestamp == sc.ts("c-cancel")
    assert cancel[0].attributes["omnix.reason"] == "client"
    (th,) = children[c.context.span_id]
    assert th.attributes["omnix.status"] == "aborted"
    assert th.end_time == sc.ts("c-aborted")

    f = by_rid["r-fail"]
    assert f.name == f"text_to_speech {PIPELINE}"  # api audio.speech, no model: the pipeline
    assert f.status.status_code == StatusCode.ERROR
    assert f.attributes["error.type"] == "stage_lost"
    failed = [e for e in f.events if e.name == "failed"]
    assert failed and failed[0].timestamp == sc.ts("f-failed")
    assert failed[0].attributes["omnix.stage"] == "talker"
    kids = {s.name: s for s in children[f.context.span_id]}
    tk = kids["stage talker"]
    assert tk.attributes["omnix.status"] == "lost"
    assert tk.status.status_code == StatusCode.ERROR
    assert tk.end_time == sc.ts("f-lost")
    lost = [e for e in tk.events if e.name == "worker_lost"]
    assert lost and lost[0].attributes["omnix.reason"] == "exit"
    assert kids["stage thinker"].attributes["omnix.status"] == "finished"

    r = by_rid["r-refused"]
    assert r.start_time == r.end_time == sc.ts("rejected")
    assert r.status.status_code == StatusCode.ERROR
    assert r.attributes["omnix.reason"] == "overloaded"
    assert children[r.context.span_id] == []


def _hist(h, name, **labels):
    pts = h.points(name)
    key = tuple(sorted({"pipeline": PIPELINE, **labels}.items()))
    assert key in pts, f"{name}{labels} not in {list(pts)}"
    return pts[key]


def _sum(h, name, **labels):
    return _hist(h, name, **labels).value


def test_metric_values(harness) -> None:
    sc = Scenario().all()
    _run(harness, sc)
    h = harness
    ms = 1e-3
    d = _hist(h, "gen_ai.server.request.duration", status="finished")
    assert d.count == 1 and d.sum == pytest.approx(67 * ms)
    # The explicit boundaries are the ones exported, and 67 ms lands in (50, 75].
    assert tuple(d.explicit_bounds) == DURATION_BUCKETS
    assert d.bucket_counts[DURATION_BUCKETS.index(0.075)] == 1
    assert _hist(h, "gen_ai.server.request.duration", status="cancelled").sum == pytest.approx(
        25 * ms
    )
    assert _hist(h, "gen_ai.server.request.duration", status="failed").sum == pytest.approx(24 * ms)

    ttft = _hist(h, "gen_ai.server.time_to_first_token")
    assert ttft.count == 3 and ttft.sum == pytest.approx((12 + 15 + 1) * ms)
    tpot = _hist(h, "gen_ai.server.time_per_output_token", stage="thinker")
    assert tpot.count == 1 and tpot.sum == pytest.approx(10 * ms)
    ttfp = _hist(h, "omnix.server.time_to_first_packet", modality="audio")
    assert ttfp.count == 1 and ttfp.sum == pytest.approx(51 * ms)
    rtf = _hist(h, "omnix.server.real_time_factor")
    assert rtf.count == 1 and rtf.sum == pytest.approx(0.067 / (2 * SAMPLES / 24000))
    assert _sum(h, "omnix.audio.generated") == pytest.approx(0.4)

    def stage(name, status):
        return _hist(h, "omnix.stage.duration", stage=name, status=status)

    assert stage("thinker", "finished").count == 2  # r-ok and r-fail
    assert stage("thinker", "finished").sum == pytest.approx((33 + 2) * ms)
    assert stage("thinker", "aborted").sum == pytest.approx(25 * ms)
    assert stage("talker", "finished").sum == pytest.approx(29 * ms)
    assert stage("talker", "lost").sum == pytest.approx(22 * ms)
    assert stage("code2wav", "finished").sum == pytest.approx(21 * ms)
    q = _hist(h, "omnix.stage.queue_time", stage="thinker")
    assert q.count == 3 and q.sum == pytest.approx((2 + 5 + 1) * ms)
    assert _hist(h, "omnix.stage.queue_time", stage="talker").sum == pytest.approx((3 + 2) * ms)
    assert _hist(h, "omnix.stage.queue_time", stage="code2wav").sum == pytest.approx(1 * ms)
    assert _sum(h, "omnix.stage.tokens", stage="thinker", type="input") == 5
    assert _sum(h, "omnix.stage.tokens", stage="thinker", type="output") == 3 + 1
    assert _sum(h, "omnix.stage.tokens", stage="talker", type="output") == 4

    assert _sum(h, "omnix.requests.active") == 0
    assert _sum(h, "omnix.requests.rejected", reason="overloaded") == 1
    assert _sum(h, "omnix.requests.rejected", reason="not_ready") == 0
    assert _sum(h, "omnix.requests.cancelled", reason="client") == 1
    assert _sum(h, "omnix.requests.failed", reason="stage_lost", stage="talker") == 1
    assert _sum(h, "omnix.workers.ready", stage="talker") == 0
    assert _sum(h, "omnix.workers.ready", stage="thinker") == 1
    assert _sum(h, "omnix.events") == len(sc.log)


def test_requests_active_while_running(harness) -> None:
    sc = Scenario()
    sc.workers()
    sc.finished()
    # Cut the log after the admission of a second request.
    from omnix.events.types import Admitted, RequestSpec

    sc.at(1, "x", Admitted(request_id="live", pipeline=PIPELINE, spec=RequestSpec(prompt="x")))
    _run(harness, sc)
    assert _sum(harness, "omnix.requests.active") == 1


def test_labels_are_bounded(harness) -> None:
    sc = Scenario().all()
    _run(harness, sc)
    data = harness.reader.get_metrics_data()
    rids = {"r-ok", "r-cancel", "r-fail", "r-refused"}
    names = set()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                names.add(m.name)
                for p in m.data.data_points:
                    assert set(p.attributes) <= ALLOWED_LABELS, (m.name, p.attributes)
                    for v in p.attributes.values():
                        assert v not in rids and "hi" != v, (m.name, p.attributes)
    assert names == {s.name for s in INSTRUMENTS}


def _span_view(exporter):
    """Spans with ids dropped: what must not depend on how events were fed."""
    out = []
    for s in exporter.get_finished_spans():
        out.append((
            s.name, s.kind, s.start_time, s.end_time, s.status.status_code,
            tuple(sorted(s.attributes.items())),
            tuple((e.name, e.timestamp, tuple(sorted(e.attributes.items()))) for e in s.events),
            s.parent is not None,
        ))  # fmt: skip
    return sorted(out, key=repr)


def _metric_view(tel: Telemetry) -> dict:
    out = {}
    for rm in tel.metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    key = (m.name, tuple(sorted(p.attributes.items())))
                    if hasattr(p, "bucket_counts"):
                        out[key] = (p.count, round(p.sum, 12), tuple(p.bucket_counts))
                    else:
                        out[key] = p.value
    return out


def _fresh() -> tuple[Telemetry, object]:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exp = InMemorySpanExporter()
    return Telemetry.from_env(PIPELINE, environ={}, span_exporter=exp), exp


async def test_observe_equals_run_over_the_log() -> None:
    """The same projection, fed event by event (a trace) or following the
    log (a server), gives the same spans and metrics."""
    sc = Scenario().all()
    standalone, exp1 = _fresh()
    for ev in sc.log.read():
        standalone.observe(ev)
    live, exp2 = _fresh()
    log = MemoryLog(ManualClock(0))
    task = asyncio.create_task(live.run(log))
    for ev in sc.log.read():
        log.append(ev)
        await asyncio.sleep(0)
    log.close()
    live.projection.wake()
    await asyncio.wait_for(task, 5)
    assert _span_view(exp1) == _span_view(exp2)
    assert _metric_view(standalone) == _metric_view(live)
    # r-ok 1+3, r-cancel 1+1, r-fail 1+2, r-refused 1
    assert len(exp1.get_finished_spans()) == 4 + 2 + 3 + 1
    # Working state is released at each request's end.
    assert standalone.projection.live_state_size() == 0
    assert live.projection.live_state_size() == 0
    assert standalone.projection._own.fold.requests == {}
    standalone.shutdown()
    live.shutdown()


@pytest.mark.parametrize(
    "name", ["normal", "cancel", "worker-lost", "rejected", "busy", "deadline"]
)
def test_replay_corpus_traces(name: str) -> None:
    """Captured tiny-omni traces: observe() and a log-following projection
    agree, spans nest under one root per request, times are event times."""
    from pathlib import Path

    from omnix.trace import read_trace

    path = Path(__file__).parents[2] / "replay" / f"tiny-omni-{name}.trace"
    if not path.exists():
        pytest.skip(f"{path} not in this checkout")
    trace = read_trace(path)
    a, exp_a = _fresh()
    for ev in trace.events:
        a.observe(ev)
    b, exp_b = _fresh()
    b.catch_up(MemoryLog(events=trace.events))
    assert _span_view(exp_a) == _span_view(exp_b)
    assert _metric_view(a) == _metric_view(b)
    ts = {ev.ts_ns for ev in trace.events}
    spans = exp_a.get_finished_spans()
    ended = [rid for rid in trace.request_ids if trace.fold().requests[rid].terminal]
    roots = [s for s in spans if s.kind == SpanKind.SERVER]
    assert len(roots) == len([r for r in trace.fold().requests.values() if r.terminal])
    assert set(ended) <= {r.attributes["omnix.request_id"] for r in roots}
    for s in spans:
        assert s.start_time in ts and s.end_time in ts
        for e in s.events:
            assert e.timestamp in ts
    assert a.projection.live_state_size() == 0 or name == "rejected"
    a.shutdown()
    b.shutdown()


def test_run_attached_mid_log_counts_live_requests() -> None:
    sc = Scenario()
    sc.workers()
    sc.finished()
    from omnix.events.types import Admitted, RequestSpec

    sc.at(1, "late", Admitted(request_id="late", pipeline=PIPELINE, spec=RequestSpec(prompt="x")))
    tel = Telemetry.from_env(PIPELINE, environ={})

    async def go() -> None:
        sc.log.close()
        await tel.run(sc.log, start=len(sc.log))

    asyncio.run(go())
    pts = {k: p.value for k, p in _points(tel, "omnix.workers.ready").items()}
    assert pts[(("pipeline", PIPELINE), ("stage", "thinker"))] == 1
    assert _points(tel, "omnix.requests.active")[(("pipeline", PIPELINE),)].value == 1
    tel.shutdown()


def _points(tel: Telemetry, name: str) -> dict:
    out = {}
    for rm in tel.metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    for p in m.data.data_points:
                        out[tuple(sorted(p.attributes.items()))] = p
    return out


def test_no_tracer_without_exporter() -> None:
    """Off by default and cheap: no tracer provider, no span work at all."""
    tel = Telemetry.from_env(PIPELINE, environ={})
    assert tel.tracer_provider is None and tel.projection.spans is None
    sc = Scenario().all()
    tel.catch_up(sc.log)
    assert _points(tel, "gen_ai.server.request.duration")
    tel.shutdown()


def test_sample_rate_is_a_parameter() -> None:
    tel = Telemetry.from_env(PIPELINE, environ={}, sample_rate=48000)
    sc = Scenario()
    sc.workers()
    sc.finished()
    tel.catch_up(sc.log)
    (p,) = _points(tel, "omnix.audio.generated").values()
    assert p.value == pytest.approx(2 * SAMPLES / 48000)
    tel.shutdown()


def test_histogram_bucket_edges() -> None:
    """A value equal to a bound is counted in that bound's bucket (le)."""
    from omnix.telemetry.metrics import HistogramSeries

    s = HistogramSeries((0.1, 0.2, 0.5), scale=1e-9)
    for ns in (100 * MS, 100 * MS + 1, 500 * MS, 600 * MS):
        s.add(ns)
    s.fold()
    assert s.counts.tolist() == [1, 1, 1, 1]
    assert s.min == pytest.approx(0.1) and s.max == pytest.approx(0.6)
    assert math.isclose(s.sum, 1.3, rel_tol=1e-9)


def test_sample_rate_from_the_pipeline_config() -> None:
    import msgspec

    from omnix.pipelines.config import CodecArgs, PipelineConfig, StageConfig

    codec = StageConfig(name="code2wav", engine=CodecArgs(model="c", sample_rate=16000))
    pipeline = PipelineConfig(name=PIPELINE, stages=(codec,), outputs={"audio": "code2wav"})
    tel = Telemetry.from_env(pipeline, environ={})
    assert tel.pipeline == PIPELINE and tel.projection.sample_rate == 16000
    tel.shutdown()
    other = msgspec.structs.replace(pipeline, outputs={})
    assert Telemetry.from_env(other, environ={}).projection.sample_rate == 24000


async def test_aclose_reads_what_the_last_pass_missed() -> None:
    sc = Scenario()
    sc.workers()
    tel = Telemetry.from_env(PIPELINE, environ={})
    task = asyncio.create_task(tel.run(sc.log))
    await asyncio.sleep(0)
    sc.finished()  # appended while the follower waits
    await tel.aclose(task)
    assert tel.projection.position == len(sc.log)
    assert tel.projection.requests_ended == 1


class _CountingLog(MemoryLog):
    """A MemoryLog that counts the events read back from it."""

    def __init__(self) -> None:
        super().__init__(ManualClock(0))
        self.reads = 0

    def read(self, start: int = 0, stop: int | None = None) -> Iterator[Event]:
        for ev in super().read(start, stop):
            self.reads += 1
            yield ev

    def get(self, pos: int) -> Event:
        self.reads += 1
        return super().get(pos)


def test_live_metrics_read_no_event_back_from_the_log() -> None:
    # The projection polls the log's fold (ended requests, audio samples):
    # it must not read the log's events one by one, which would cost every
    # append a share of the server's CPU (docs/telemetry.md, "Cost").
    sc = Scenario(log=_CountingLog())
    sc.all()
    tel = Telemetry.from_env(PIPELINE, environ={})
    tel.catch_up(sc.log)
    # Once per stage for the projection's life: its output modality, from
    # its first chunk.  Once per Failed: the stage it names.
    assert sc.log.reads <= 3 + 1
    reads, ended = sc.log.reads, _sum_points(tel, "gen_ai.server.request.duration")
    for i in range(5):
        sc.finished(rid=f"r-more-{i}", traceparent="")
    sc.cancelled(rid="r-cancel-2")
    tel.catch_up(sc.log)
    assert sc.log.reads == reads
    assert _sum_points(tel, "gen_ai.server.request.duration") == ended + 6
    tel.shutdown()


def _sum_points(tel: Telemetry, name: str) -> int:
    n = 0
    for rm in tel.metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    n += sum(p.count for p in metric.data.data_points)
    return n
