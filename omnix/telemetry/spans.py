"""Spans of an ended request, built from its events after the fact.

Owns: ``SpanWriter``, which turns a request's final state (a reducer
``RequestState``) and the few events it reads back (admission, cancel,
first chunks, the cause of a failure) into one OpenTelemetry span per
request and a child span per stage execution, with start and end times
equal to event timestamps, continuing the client's W3C ``traceparent``.
Also the GenAI semantic-convention naming (``operation_name``).

Does not own the tracer provider or exporters (``setup.py``), nor when a
request is ended (``projection.py`` calls in at the terminal event).

Shape (times are the events' ``ts_ns``)::

    "{operation} {model}"  SERVER   Admitted -> Finished/Cancelled/Failed
      events: first_token, first_audio_packet, first_image, cancel_requested, failed
      "stage {name}"       INTERNAL Routed seq 0 -> StageFinished/StageFailed/lost
                                    (or the request's end when unfinished)
        events: stage_started, first_token | first_audio_packet | first_image |
                first_codec_chunk, stage_failed, worker_lost

A ``Rejected`` request gets one zero-length span with status ERROR.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from omnix.events.reducer import RequestState, StageState
from omnix.events.types import (
    Admitted,
    CancelRequested,
    DeadlineExpired,
    Event,
    Failed,
    Rejected,
    RequestEvent,
    RequestSpec,
    StageFailed,
    WorkerLost,
)
from omnix.telemetry.sources import EventSource

_propagator = TraceContextTextMapPropagator()

#: span event name for a stage's first chunk, by modality
FIRST_CHUNK_EVENT = {
    "text": "first_token",
    "audio": "first_audio_packet",
    "image": "first_image",
    "codec": "first_codec_chunk",
}


def operation_name(spec: RequestSpec) -> str:
    """``gen_ai.operation.name`` from the API the request came through
    (``RequestSpec.api``), or from the outputs it asked for."""
    api = spec.api.lower()
    if "speech" in api or "tts" in api or "audio" in api:
        return "text_to_speech"
    if "image" in api:
        return "image_generation"
    if "chat" in api:
        return "chat"
    if "completion" in api:
        return "text_completion"
    outs = tuple(spec.outputs)
    if "image" in outs and "text" not in outs:
        return "image_generation"
    if "audio" in outs and "text" not in outs:
        return "text_to_speech"
    return "chat"


def parent_context(traceparent: str) -> Context:
    """The client's span as parent, or an empty context (a new trace).

    Always an explicit context: the span must never inherit whatever span
    happens to be current in the task that runs the projection.
    """
    if traceparent:
        return _propagator.extract({"traceparent": traceparent})
    return Context()


class SpanWriter:
    """Creates and ends the spans of one request at its terminal event."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def rejected(self, ev: Rejected) -> None:
        spec = ev.spec
        op = operation_name(spec)
        model = spec.model or ev.pipeline
        span = self.tracer.start_span(
            f"{op} {model}",
            context=parent_context(spec.traceparent),
            kind=SpanKind.SERVER,
            start_time=ev.ts_ns,
            attributes={
                "gen_ai.operation.name": op,
                "gen_ai.request.model": model,
                "omnix.pipeline": ev.pipeline,
                "omnix.request_id": ev.request_id,
                "omnix.status": "rejected",
                "omnix.reason": ev.reason,
                "error.type": ev.reason,
            },
        )
        span.set_status(Status(StatusCode.ERROR, f"rejected: {ev.reason} {ev.message}".strip()))
        span.end(end_time=ev.ts_ns)

    def request(
        self,
        rs: RequestState,
        terminal: RequestEvent,
        src: EventSource,
        modalities: Mapping[str, str],
        audio_samples: int,
        sample_rate: int,
    ) -> None:
        rid = rs.request_id
        admitted = src.event(rid, rs.admitted_pos)
        spec = admitted.spec if isinstance(admitted, Admitted) else RequestSpec()
        op = operation_name(spec)
        model = spec.model or rs.pipeline
        end = rs.terminal_ts
        audio_s = audio_samples / sample_rate
        cause = src.event(rid, terminal.cause) if isinstance(terminal, Failed) else None

        span = self.tracer.start_span(
            f"{op} {model}",
            context=parent_context(spec.traceparent),
            kind=SpanKind.SERVER,
            start_time=rs.admitted_ts,
            attributes=_request_attributes(
                rs, spec, op, model, terminal, modalities, audio_samples, audio_s
            ),
        )
        if rs.first_token_ts:
            span.add_event("first_token", timestamp=rs.first_token_ts)
        if rs.first_audio_ts:
            span.add_event("first_audio_packet", timestamp=rs.first_audio_ts)
        if rs.first_image_ts:
            span.add_event("first_image", timestamp=rs.first_image_ts)
        cancel = src.event(rid, rs.cancel_pos)
        if isinstance(cancel, CancelRequested):
            span.add_event(
                "cancel_requested", {"omnix.reason": cancel.reason}, timestamp=cancel.ts_ns
            )

        ctx = trace.set_span_in_context(span, Context())
        # The request's audio is its audio stage's (one per pipeline).
        audio_stages = [name for name, m in modalities.items() if m == "audio"]
        for st in rs.stages:
            stage_audio_s = audio_s if audio_samples and audio_stages == [st.name] else None
            self._stage(ctx, st, modalities.get(st.name, ""), end, cause, stage_audio_s)

        if isinstance(terminal, Failed):
            fattrs: dict[str, AttributeValue] = {"omnix.reason": terminal.reason}
            if terminal.stage:
                fattrs["omnix.stage"] = terminal.stage
            if terminal.message:
                fattrs["omnix.message"] = terminal.message
            if isinstance(cause, DeadlineExpired):
                fattrs["omnix.deadline_scope"] = cause.scope
            span.add_event("failed", fattrs, timestamp=end)
            span.set_status(
                Status(StatusCode.ERROR, f"{terminal.reason}: {terminal.message}".rstrip(": "))
            )
        span.end(end_time=end)

    def _stage(
        self,
        ctx: Context,
        st: StageState,
        modality: str,
        end: int,
        cause: Event | None,
        audio_s: float | None,
    ) -> None:
        """The child span of one stage execution, ended at its own end (or
        the request's, ``end``, when it never finished)."""
        status = "unfinished" if st.active else st.status
        sattrs: dict[str, AttributeValue] = {
            "omnix.stage": st.name,
            "omnix.replica": st.replica,
            "omnix.status": status,
            "omnix.chunks": st.chunks,
            "omnix.pieces": st.pieces,
        }
        if modality:
            sattrs["omnix.modality"] = modality
        if st.finish_reason:
            sattrs["omnix.finish_reason"] = st.finish_reason
        if st.prompt_tokens:
            sattrs["gen_ai.usage.input_tokens"] = st.prompt_tokens
        if st.output_tokens:
            sattrs["gen_ai.usage.output_tokens"] = st.output_tokens
        if audio_s is not None:
            sattrs["omnix.audio.seconds"] = audio_s
        child = self.tracer.start_span(
            f"stage {st.name}",
            context=ctx,
            kind=SpanKind.INTERNAL,
            start_time=st.routed_ts,
            attributes=sattrs,
        )
        if st.started_ts:
            child.add_event("stage_started", timestamp=st.started_ts)
        if st.first_chunk_ts and modality:
            child.add_event(
                FIRST_CHUNK_EVENT.get(modality, "first_chunk"),
                {"omnix.modality": modality},
                timestamp=st.first_chunk_ts,
            )
        st_end = st.finished_ts or end
        if status == "failed":
            message = ""
            if isinstance(cause, StageFailed) and cause.stage == st.name:
                message = cause.message
            child.add_event("stage_failed", {"omnix.message": message}, timestamp=st_end)
            child.set_status(Status(StatusCode.ERROR, message or "stage failed"))
        elif status == "lost":
            lost_attrs: dict[str, AttributeValue] = {"omnix.replica": st.replica}
            if isinstance(cause, WorkerLost) and cause.stage == st.name:
                lost_attrs["omnix.reason"] = cause.reason
            child.add_event("worker_lost", lost_attrs, timestamp=st_end)
            child.set_status(Status(StatusCode.ERROR, "worker lost"))
        child.end(end_time=st_end)


def _request_attributes(
    rs: RequestState,
    spec: RequestSpec,
    op: str,
    model: str,
    terminal: RequestEvent,
    modalities: Mapping[str, str],
    audio_samples: int,
    audio_s: float,
) -> dict[str, AttributeValue]:
    """The request span's attributes: GenAI names where the conventions
    have one (usage, finish reasons, error type), omnix's otherwise."""
    attrs: dict[str, AttributeValue] = {
        "gen_ai.operation.name": op,
        "gen_ai.request.model": model,
        "gen_ai.request.seed": spec.seed,
        "omnix.pipeline": rs.pipeline,
        "omnix.request_id": rs.request_id,
        "omnix.status": rs.status,
        "omnix.outputs": list(rs.outputs),
        "omnix.events": rs.events,
    }
    if rs.reason:
        attrs["omnix.reason"] = rs.reason
    if rs.stages and rs.stages[0].prompt_tokens:
        # The first stage routed reads the request's own input.
        attrs["gen_ai.usage.input_tokens"] = rs.stages[0].prompt_tokens
    text_stages = [st for st in rs.stages if modalities[st.name] == "text"]
    out_tokens = sum(st.output_tokens for st in text_stages)
    if out_tokens:
        attrs["gen_ai.usage.output_tokens"] = out_tokens
    if text_stages:
        reasons = [st.finish_reason for st in text_stages if st.finish_reason]
        if reasons:
            attrs["gen_ai.response.finish_reasons"] = reasons
    if audio_samples:
        attrs["omnix.audio.seconds"] = audio_s
    if isinstance(terminal, Failed):
        attrs["error.type"] = terminal.reason
    return attrs
