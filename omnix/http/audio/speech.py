"""A speech body -> the request it submits.

Owns: the mapping of a ``SpeechRequest`` onto one ``RequestSpec``: how it
streams (``stream: true`` is the SSE stream unless a ``stream_format``
says otherwise), the voice, instructions and language put on the speech
stages, ``speed`` and ``instructions`` refused unless a speech stage
honours them (the Qwen3-TTS checks: ``speech_tts.py``), the clip a Base
checkpoint clones from (``ref_audio`` or an uploaded voice, decoded by
``cloning.py`` before planning) as the request's message (its audio and
speaker vector blobs the plan carries to admission), and the ``SpeechOptions`` the response
renders from.

Does not own admission (``core.submit``) nor the response's bytes
(``speech_render.py``).
"""

from __future__ import annotations

from omnix.events.options import API_SPEECH, SpeechOptions
from omnix.events.types import Modality, RequestSpec, StageParams
from omnix.http.audio.cloning import Reference
from omnix.http.audio.protocol import SpeechRequest
from omnix.http.audio.speech_tts import check_tts, reference_message
from omnix.http.common.plan import Plan, PlanContext
from omnix.http.common.rendering import RENDER_VERSION
from omnix.http.common.sampling import (
    bad,
    check_diffusion,
    check_engines,
    check_speech,
    put,
    stage_params,
)


def speech_plan(
    body: SpeechRequest,
    served: PlanContext,
    *,
    reference: Reference | None = None,
    traceparent: str = "",
    request_id: str = "",
) -> Plan:
    """``reference``: the clip ``body`` clones from (``Cloning.reference``);
    ``request_id``: the request's id (a batch item's), else a fresh one."""
    served.check_model(body.model)
    if body.stream is False and body.stream_format is not None:
        raise bad(
            "stream",
            f"stream is false but stream_format is {body.stream_format!r}: a stream_format asks "
            "for a streamed response; omit stream, or omit stream_format for the whole file.",
        )
    # vLLM-Omni's ``stream: true`` alone is an SSE stream.
    stream_format = body.stream_format or ("sse" if body.stream else None)
    outputs: tuple[Modality, ...] = ("audio",)
    params = stage_params(served, body.sampling_params_list)
    speech_stages = served.media_stages(outputs, "audio")
    if body.speed != 1.0:
        check_speech(served, "speed", speech_stages)
    check_tts(served, body, speech_stages, reference)
    if body.instructions:
        check_speech(served, "instructions", speech_stages)
    served.check_voice(body.voice, "voice")
    cloned = None if reference is None else reference_message(reference)
    for st in speech_stages:
        put(
            params,
            st,
            StageParams(
                voice=body.voice,
                speed=None if body.speed == 1.0 else body.speed,
                instructions=body.instructions or None,
                language=body.language,
            ),
        )
    check_engines(served, params)
    check_diffusion(served, params)
    usage = served.source_stage(outputs) if "audio" in served.pipeline.outputs else ""
    opts = SpeechOptions(
        render=RENDER_VERSION,
        stream=bool(stream_format),
        stream_format=stream_format or "",
        usage_stage=usage,
        audio_stage=served.output_stage("audio"),
        audio_format=body.response_format,
        sample_rate=served.sample_rate(),
        voice=body.voice,
    )
    rid = request_id or served.new_request_id()
    spec = RequestSpec(
        prompt=body.input,
        messages=() if cloned is None else (cloned[0],),
        outputs=outputs,
        stage_params=params,
        seed=served.seed(body.seed),
        api=API_SPEECH,
        model=served.model_for(body.model),
        traceparent=traceparent,
        response=opts,
    )
    blobs = () if cloned is None else cloned[1]
    return Plan(specs=((rid, spec),), stream=bool(stream_format), blobs=blobs)
