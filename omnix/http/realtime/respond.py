"""A realtime response as a request: its spec, and its admission.

Owns ``response_plan``: one response of a session as the one request it
submits: the conversation (or the response's own ``input``) as the chat
messages the thinker reads, the outputs its modalities need (``["audio"]``:
text and audio, the text being the transcript), the output token limit and
the function tools (``tools.py``) on the text stage, the voice on the speech stages, a fresh seed (recorded),
and the ``RealtimeOptions`` its server events render from.  Admission is
``core.submit.admit``, as every HTTP route's.

Does not own the session's configuration (``config.py``) nor the events
the response renders to (``render.py``).
"""

from __future__ import annotations

import secrets

from omnix.events.options import API_REALTIME, RealtimeOptions
from omnix.events.types import ChatMessage, Modality, RequestSpec, StageParams
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
    outputs: tuple[Modality, ...] = ("text", "audio") if "audio" in cfg.modalities else ("text",)
    text_stage = served.output_stage("text") or served.source_stage(outputs)
    base = StageParams(max_tokens=cfg.max_output_tokens or None)
    params = text_params(served, None, text_stage, base)
    if cfg.tools.tools:
        put(params, text_stage, cfg.tools.params())
    if "audio" in outputs:
        for st in served.media_stages(outputs, "audio"):
            put(params, st, StageParams(voice=cfg.voice))
    opts = RealtimeOptions(
        render=REALTIME_RENDER,
        session=session,
        item=item,
        previous_item=previous_item,
        conversation=conversation if cfg.conversation else "",
        modalities=cfg.modalities,
        usage_stage=text_stage,
        text_stage=served.output_stage("text"),
        audio_stage=served.output_stage("audio") if "audio" in outputs else "",
        sample_rate=served.sample_rate(),
        voice=cfg.voice,
        max_output_tokens=cfg.max_output_tokens,
        metadata=cfg.metadata,
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
