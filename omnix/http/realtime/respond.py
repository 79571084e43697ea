"""A realtime response as a request: its spec, and its admission.

Owns ``response_plan``: one response of a session as the one request it
submits: the conversation (or the response's own ``input``) as the chat
messages the thinker reads, the outputs its modalities need (``["audio"]``:
text and audio, the text being the transcript), the output token limit and
the function tools (``tools.py``) on the text stage, the voice on the speech stages, a fresh seed (recorded),
and the ``RealtimeOptions`` its server events render from.  Admission is
``core.submit.admit``, as every HTTP route's.

On a pipeline that only speaks (a Qwen3-TTS folder, ``tiny-tts``: audio
out, no text), a response reads its conversation's last item aloud: that
user or assistant item's text is the speech route's ``input`` (its plan
and checks, ``speech_plan``, reused whole), the session's voice the
``voice`` and its instructions the ``instructions`` (CustomVoice's how to
say it, VoiceDesign's voice described); the transcript is that text.

Does not own the session's configuration (``config.py``) nor the events
the response renders to (``render.py``).
"""

from __future__ import annotations

import secrets

import msgspec

from omnix.events.options import API_REALTIME, RealtimeOptions
from omnix.events.types import ChatMessage, Modality, RequestSpec, StageParams
from omnix.http.audio.protocol import SpeechRequest
from omnix.http.audio.speech import speech_plan
from omnix.http.common.plan import DecodedBlob, Plan, PlanContext
from omnix.http.common.sampling import put, text_params
from omnix.http.core.errors import ApiError
from omnix.http.realtime.config import ResponseConfig

#: The render version of realtime responses (``RealtimeOptions.render``);
#: 2: a call of a response that did not complete is not said done
#: (``render.py``).
REALTIME_RENDER = 2


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def response_plan(
    served: PlanContext,
    cfg: ResponseConfig,
    messages: tuple[ChatMessage, ...],
    blobs: tuple[DecodedBlob, ...],
    *,
    session: str,
    conversation: str,
    item: str,
    previous_item: str,
) -> Plan:
    """The one request a response submits (see the module's docstring)."""
    if not any(m.role != "system" for m in messages):
        raise ApiError(
            400,
            "there is nothing to respond to: the conversation holds no user or assistant "
            "item. Add one (conversation.item.create) or commit input audio first.",
            code="conversation_empty",
        )
    opts = RealtimeOptions(
        render=REALTIME_RENDER,
        session=session,
        item=item,
        previous_item=previous_item,
        conversation=conversation if cfg.conversation else "",
        modalities=cfg.modalities,
        voice=cfg.voice,
        max_output_tokens=cfg.max_output_tokens,
        metadata=cfg.metadata,
    )
    if "text" not in served.pipeline.outputs:
        return _read_aloud(served, cfg, messages, opts)
    outputs: tuple[Modality, ...] = ("text", "audio") if "audio" in cfg.modalities else ("text",)
    text_stage = served.output_stage("text") or served.source_stage(outputs)
    base = StageParams(max_tokens=cfg.max_output_tokens or None)
    params = text_params(served, None, text_stage, base)
    if cfg.tools.tools:
        put(params, text_stage, cfg.tools.params())
    if "audio" in outputs:
        for st in served.media_stages(outputs, "audio"):
            put(params, st, StageParams(voice=cfg.voice))
    opts = msgspec.structs.replace(
        opts,
        usage_stage=text_stage,
        text_stage=served.output_stage("text"),
        audio_stage=served.output_stage("audio") if "audio" in outputs else "",
        sample_rate=served.sample_rate(),
    )
    spec = RequestSpec(
        messages=messages,
        outputs=outputs,
        stage_params=params,
        seed=served.seed(None),
        api=API_REALTIME,
        model=served.model,
        response=opts,
    )
    return Plan(specs=((new_id("resp"), spec),), stream=True, blobs=blobs)


def _read_aloud(
    served: PlanContext,
    cfg: ResponseConfig,
    messages: tuple[ChatMessage, ...],
    opts: RealtimeOptions,
) -> Plan:
    """A response of a pipeline that only speaks: its last item read aloud
    (see the module's docstring)."""
    if "audio" not in cfg.modalities:
        raise ApiError(
            400,
            f"pipeline {served.model!r} only speaks (audio out, no text): ask for "
            'output_modalities ["audio"].',
            param="output_modalities",
            code="unsupported_modality",
        )
    card = served.tts_card()
    if card is not None and card.variant == "base":
        raise ApiError(
            400,
            f"pipeline {served.model!r} is Qwen3-TTS Base: it speaks in a cloned voice, and a "
            "realtime session carries no clip to clone; use POST /v1/audio/speech (ref_audio, "
            "or a voice uploaded with POST /v1/audio/voices).",
            param="voice",
            code="unsupported_value",
        )
    last = next((m for m in reversed(messages) if m.role in ("user", "assistant")), None)
    if last is None or not last.content.strip():
        raise ApiError(
            400,
            f"pipeline {served.model!r} reads text aloud: the conversation's last item has no "
            "text to read. Add a user or assistant item with input_text or text content.",
            code="conversation_empty",
        )
    body = SpeechRequest(
        input=last.content,
        voice=cfg.voice,
        instructions=cfg.instructions or None,
        response_format="pcm",
    )
    plan = speech_plan(body, served)
    ((_, spec),) = plan.specs
    params = dict(spec.stage_params)
    source = served.source_stage(("audio",))
    put(params, source, StageParams(max_tokens=cfg.max_output_tokens or None))
    opts = msgspec.structs.replace(
        opts,
        usage_stage=source,
        audio_stage=served.output_stage("audio"),
        sample_rate=served.sample_rate(),
    )
    spec = msgspec.structs.replace(
        spec, stage_params=params, api=API_REALTIME, model=served.model, response=opts
    )
    return Plan(specs=((new_id("resp"), spec),), stream=True, blobs=plan.blobs)
