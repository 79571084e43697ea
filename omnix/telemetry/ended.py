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

from omnix.events.reducer import RequestState, StageState
from omnix.events.types import Chunk, Event
from omnix.telemetry.metrics import Cell, MetricSet

_NS = 1e-9
_ACTIVE = frozenset({"routed", "running"})

Add = Callable[[float], None]
#: ``event_at(request_id, pos)``: one of a request's events, read back.
EventAt = Callable[[str, int], Event | None]


class _AddBy(dict[str, Add]):
    """label value -> the ``add`` of its series, made on first use (``d[k]``
    is one specialised dict subscript when present)."""

    def __init__(self, make: Callable[[str], Add]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, key: str) -> Add:
        add = self[key] = self._make(key)
        return add


class StageSeries:
    """One (pipeline, stage)'s series and its learned output modality."""

    __slots__ = (
        "dur",
        "finished",
        "modality",
        "queue",
        "text",
        "tokens_in",
        "tokens_out",
        "tpot",
        "unfinished",
    )

    def __init__(self, m: MetricSet, pipeline: str, stage: str) -> None:
        duration = m.histogram("omnix.stage.duration")
        #: stage status -> add
        self.dur = _AddBy(lambda status: duration.get((pipeline, stage, status), _NS).add)
        self.unfinished = self.dur["unfinished"]
        self.finished = self.dur["finished"]
        self.queue = m.histogram("omnix.stage.queue_time").get((pipeline, stage), _NS).add
        self.tpot = (
            m.histogram("gen_ai.server.time_per_output_token").get((pipeline, stage), _NS).add
        )
        tokens = m.sum("omnix.stage.tokens")
        self.tokens_in: Cell = tokens.get((pipeline, stage, "input"))
        self.tokens_out: Cell = tokens.get((pipeline, stage, "output"))
        self.modality: str | None = None
        self.text = False

    def learn(self, modality: str) -> None:
        self.modality = modality
        self.text = modality == "text"


class PipelineSeries:
    """One pipeline's request-level series.  Histogram series exist from the
    pipeline's first ended request; collection shows only those recorded."""

    __slots__ = ("audio", "dur", "rtf", "stages", "ttfp_audio", "ttfp_image", "ttft")

    def __init__(self, m: MetricSet, pipeline: str) -> None:
        duration = m.histogram("gen_ai.server.request.duration")
        #: request status -> add
        self.dur = _AddBy(lambda status: duration.get((pipeline, status), _NS).add)
        #: stage name -> its series
        self.stages: dict[str, StageSeries] = {}
        key = (pipeline,)
        self.ttft = m.histogram("gen_ai.server.time_to_first_token").get(key, _NS).add
        ttfp = m.histogram("omnix.server.time_to_first_packet")
        self.ttfp_audio = ttfp.get((pipeline, "audio"), _NS).add
        self.ttfp_image = ttfp.get((pipeline, "image"), _NS).add
        self.rtf = m.histogram("omnix.server.real_time_factor").get(key, _NS).add
        self.audio: Cell | None = None


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
        event_at: EventAt,
    ) -> None:
        """Observe one ended request.  ``event_at(request_id, pos)`` reads
        back one of its events (only to learn a stage's modality, once per
        stage)."""
        try:
            ps = self.pipelines[rs.pipeline]
        except KeyError:
            ps = self.pipelines[rs.pipeline] = PipelineSeries(self.metrics, rs.pipeline)
        adm = rs.admitted_ts
        end = rs.terminal_ts
        status = rs.status
        ps.dur[status](end - adm)
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
            try:
                ss = stages[st.name]
            except KeyError:
                ss = stages[st.name] = StageSeries(self.metrics, rs.pipeline, st.name)
            routed = st.routed_ts
            sst = st.status
            if sst == "finished":
                ss.finished(st.finished_ts - routed)
                if ss.text:
                    n = st.output_tokens or st.chunks
                    if n > 1:
                        ss.tpot((st.last_chunk_ts - st.first_chunk_ts) / (n - 1))
            elif sst in _ACTIVE:
                ss.unfinished(end - routed)
            else:
                ss.dur[sst]((st.finished_ts or end) - routed)
            t = st.started_ts
            if t:
                ss.queue(t - routed)
            n = st.prompt_tokens
            if n:
                ss.tokens_in.value += n
            n = st.output_tokens
            if n:
                ss.tokens_out.value += n
            if ss.modality is None and st.first_chunk_pos >= 0:
                self._learn(rs, st, ss, event_at)
        if audio_samples:
            seconds = audio_samples / self.sample_rate
            (ps.audio or self._audio_cell(ps, rs.pipeline)).value += seconds
            if status == "finished":
                ps.rtf((end - adm) / seconds)

    def _learn(self, rs: RequestState, st: StageState, ss: StageSeries, event_at: EventAt) -> None:
        # A stage's output modality is its engine's: learned once, from its
        # first chunk; a text stage then gets TPOT, from this request on.
        first = event_at(rs.request_id, st.first_chunk_pos)
        if type(first) is Chunk:
            ss.learn(first.modality)
            if ss.text and st.status == "finished":
                n = st.output_tokens or st.chunks
                if n > 1:
                    ss.tpot((st.last_chunk_ts - st.first_chunk_ts) / (n - 1))

    def _audio_cell(self, ps: PipelineSeries, pipeline: str) -> Cell:
        ps.audio = self.metrics.sum("omnix.audio.generated").get((pipeline,))
        return ps.audio
