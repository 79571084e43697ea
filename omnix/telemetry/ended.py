"""Metric observations of an ended request, from its final reducer state.

Owns: ``EndedRequests.record``, which the projection calls at a request's
terminal event with the log's final ``RequestState`` and the request's
audio sample count, and the per-pipeline/per-stage series it holds
(``PipelineSeries``/``StageSeries``) so that recording builds no label
tuple and makes no lookup beyond a dict get; also the stage output
modalities (learned once per stage from its first chunk), which decide
which stages have a time per output token.

Does not own the metric vocabulary or bucketing (``metrics.py``) nor event
reading (``projection.py``).

Recording is a ``list.append`` of a raw integer (nanoseconds) per
observation; ``metrics.py`` scales and buckets in bulk.  What is observed
(times are event timestamps, via the reducer's state):
  * gen_ai.server.request.duration: admitted -> terminal, by status
  * gen_ai.server.time_to_first_token: admitted -> first text chunk
  * omnix.server.time_to_first_packet: admitted -> first audio/image chunk
  * omnix.server.real_time_factor: duration / audio seconds (finished only)
  * omnix.audio.generated: audio seconds
  * per stage: omnix.stage.duration (first Routed -> its end, by status;
    "unfinished" and the request's end for a stage still active then),
    omnix.stage.queue_time (first Routed -> StageStarted),
    omnix.stage.tokens (input/output, as StageFinished reported them), and
    for text stages that finished, gen_ai.server.time_per_output_token:
    (last chunk - first chunk) / (output tokens - 1).
"""

from __future__ import annotations

from collections.abc import Callable

from omnix.events.reducer import RequestState
from omnix.events.types import Chunk, Event
from omnix.telemetry.metrics import Cell, MetricSet

_NS = 1e-9
_ACTIVE = frozenset({"routed", "running"})

Add = Callable[[float], None]


class StageSeries:
    """One (pipeline, stage)'s series and its learned output modality."""

    __slots__ = ("_m", "_p", "_s", "dur", "modality", "queue", "text", "tokens_in",
                 "tokens_out", "tpot", "unfinished")  # fmt: skip

    def __init__(self, m: MetricSet, pipeline: str, stage: str) -> None:
        self._m, self._p, self._s = m, pipeline, stage
        #: stage status -> add
        self.dur: dict[str, Add] = {}
        self.unfinished = self._duration("unfinished")
        self.queue = m.histogram("omnix.stage.queue_time").get((pipeline, stage), _NS).add
        self.tpot = m.histogram("gen_ai.server.time_per_output_token").get(
            (pipeline, stage), _NS
        ).add
        self.tokens_in: Cell | None = None
        self.tokens_out: Cell | None = None
        self.modality: str | None = None
        self.text = False

    def _duration(self, status: str) -> Add:
        h = self._m.histogram("omnix.stage.duration")
        return h.get((self._p, self._s, status), _NS).add

    def make_dur(self, status: str) -> Add:
        add = self.dur[status] = self._duration(status)
        return add

    def make_tokens(self, kind: str) -> Cell:
        cell = self._m.sum("omnix.stage.tokens").get((self._p, self._s, kind))
        if kind == "input":
            self.tokens_in = cell
        else:
            self.tokens_out = cell
        return cell

    def learn(self, modality: str) -> None:
        self.modality = modality
        self.text = modality == "text"


class PipelineSeries:
    """One pipeline's request-level series.  Histogram series exist from the
    pipeline's first ended request; collection shows only those recorded."""

    __slots__ = ("_m", "_p", "audio", "dur", "rtf", "stages", "ttfp_audio", "ttfp_image", "ttft")

    def __init__(self, m: MetricSet, pipeline: str) -> None:
        self._m, self._p = m, pipeline
        self.dur: dict[str, Add] = {}
        self.stages: dict[str, StageSeries] = {}
        key = (pipeline,)
        self.ttft = m.histogram("gen_ai.server.time_to_first_token").get(key, _NS).add
        ttfp = m.histogram("omnix.server.time_to_first_packet")
        self.ttfp_audio = ttfp.get((pipeline, "audio"), _NS).add
        self.ttfp_image = ttfp.get((pipeline, "image"), _NS).add
        self.rtf = m.histogram("omnix.server.real_time_factor").get(key, _NS).add
        self.audio: Cell | None = None

    def make_dur(self, status: str) -> Add:
        h = self._m.histogram("gen_ai.server.request.duration")
        add = self.dur[status] = h.get((self._p, status), _NS).add
        return add

    def stage(self, name: str) -> StageSeries:
        ss = self.stages[name] = StageSeries(self._m, self._p, name)
        return ss

    def make_audio(self) -> Cell:
        self.audio = self._m.sum("omnix.audio.generated").get((self._p,))
        return self.audio


class EndedRequests:
    """Records ended requests into ``metrics`` (one writer thread)."""

    def __init__(self, metrics: MetricSet, sample_rate: int) -> None:
        self.metrics = metrics
        self.sample_rate = sample_rate
        self.pipelines: dict[str, PipelineSeries] = {}

    def modality(self, pipeline: str, stage: str) -> str:
        ps = self.pipelines.get(pipeline)
        ss = ps.stages.get(stage) if ps is not None else None
        return (ss.modality or "") if ss is not None else ""

    def record(
        self,
        rs: RequestState,
        audio_samples: int,
        event_at: Callable[[str, int], Event | None],
    ) -> None:
        """Observe one ended request.  ``event_at(request_id, pos)`` reads
        back one of its events (only to learn a stage's modality, once per
        stage)."""
        ps = self.pipelines.get(rs.pipeline)
        if ps is None:
            ps = self.pipelines[rs.pipeline] = PipelineSeries(self.metrics, rs.pipeline)
        adm = rs.admitted_ts
        end = rs.terminal_ts
        status = rs.status
        (ps.dur.get(status) or ps.make_dur(status))(end - adm)
        t = rs.first_token_ts
        if t:
            ps.ttft(t - adm)
        t = rs.first_audio_ts
        if t:
            ps.ttfp_audio(t - adm)
        t = rs.first_image_ts
        if t:
            ps.ttfp_image(t - adm)
        stages = ps.stages
        for st in rs.stages:
            ss = stages.get(st.name) or ps.stage(st.name)
            routed = st.routed_ts
            sst = st.status
            if sst in _ACTIVE:
                ss.unfinished(end - routed)
            else:
                (ss.dur.get(sst) or ss.make_dur(sst))((st.finished_ts or end) - routed)
            t = st.started_ts
            if t:
                ss.queue(t - routed)
            n = st.prompt_tokens
            if n:
                (ss.tokens_in or ss.make_tokens("input")).value += n
            n = st.output_tokens
            if n:
                (ss.tokens_out or ss.make_tokens("output")).value += n
            if ss.modality is None and st.first_chunk_pos >= 0:
                # A stage's output modality is its engine's: learned once.
                first = event_at(rs.request_id, st.first_chunk_pos)
                if type(first) is Chunk:
                    ss.learn(first.modality)  # type: ignore[union-attr]
            if ss.text and sst == "finished":
                n = st.output_tokens or st.chunks
                if n > 1:
                    ss.tpot((st.last_chunk_ts - st.first_chunk_ts) / (n - 1))
        if audio_samples:
            seconds = audio_samples / self.sample_rate
            (ps.audio or ps.make_audio()).value += seconds
            if status == "finished":
                ps.rtf((end - adm) / seconds)
