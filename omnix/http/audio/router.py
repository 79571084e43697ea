"""``POST /v1/audio/speech`` and ``POST /v1/audio/transcriptions``: handlers,
table rows, descriptions.

Owns: the speech handler and its OpenAPI operation (published for a
pipeline that makes audio; ``speed`` and ``instructions`` as no engine
honours them), and the transcription handler (read the multipart form,
decode the clip off the event loop, plan as a chat, respond live), a
route the document leaves out: a multipart form.

Does not own the plans (``speech.py``, ``transcribe.py``) nor the bytes
(``speech_render.py``, ``transcription_render.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from omnix.http.audio import transcribe
from omnix.http.audio.protocol import SpeechAudioDelta, SpeechAudioDone, SpeechRequest
from omnix.http.audio.speech import speech_plan
from omnix.http.common import doc
from omnix.http.core.body import read_body, traceparent
from omnix.http.core.live import respond
from omnix.http.core.route import DocContext, Route, Schemas, Undescribed
from omnix.http.core.server import Server
from omnix.http.media.parts import decode_parts
from omnix.pipelines.config import Qwen3TTSTalkerArgs


async def speech(server: Server, request: web.Request) -> web.StreamResponse:
    body = await read_body(request, SpeechRequest)
    server.served.check_model(body.model)
    reference = await server.cloning.reference(body)
    plan = speech_plan(body, server.served, reference=reference, traceparent=traceparent(request))
    return await respond(server, request, plan)


async def transcriptions(server: Server, request: web.Request) -> web.StreamResponse:
    form, upload = await transcribe.read_form(request)
    transcribe.check_pipeline(server.served)
    server.served.check_model(form.model)
    part = await asyncio.to_thread(transcribe.audio_part, upload)
    media, blobs = await decode_parts(server.media, [(transcribe.FILE, part)])
    plan = transcribe.transcription_plan(
        form, server.served, media[transcribe.FILE], blobs, traceparent=traceparent(request)
    )
    return await respond(server, request, plan)


def _speech_operation(ctx: DocContext) -> dict[str, Any] | None:
    if "audio" not in ctx.pipeline.outputs:
        return None
    return doc.post(
        "Text to speech (OpenAI-compatible)",
        SpeechRequest,
        {
            "description": "The audio file; stream_format=audio streams its bytes as generated, "
            "stream_format=sse streams speech.audio.delta / speech.audio.done events",
            "content": {
                "audio/mpeg": {},
                "audio/wav": {},
                "audio/flac": {},
                "audio/ogg": {},
                "audio/aac": {},
                "audio/pcm": {},
                "text/event-stream": doc.sse(
                    {"oneOf": [doc.ref(SpeechAudioDelta), doc.ref(SpeechAudioDone)]}
                ),
            },
        },
    )


def narrow_speech(props: dict[str, Any], ctx: DocContext, *, optional: bool = False) -> None:
    """A speech body's fields (``props``) as the pipeline takes them;
    ``optional``: a batch item's, null meaning the batch's."""
    if "model" in props:
        props["model"] = doc.model_enum(ctx.pipeline)
    props["sampling_params_list"] = doc.sampling_params_list(ctx.pipeline)
    # No engine honours a speaking rate (sampling.SPEECH_ENGINE_PARAMS).
    props["speed"] = doc.nullable({"const": 1.0}) if optional else {"const": 1.0, "default": 1.0}
    if not any(isinstance(st.engine, Qwen3TTSTalkerArgs) for st in ctx.pipeline.stages):
        # Instructions, a language, a Qwen3-TTS variant's task and a voice to clone are
        # Qwen3-TTS's alone (speech_tts.check_tts refuses them elsewhere).
        props["instructions"] = doc.nullable({"const": ""})
        for field in ("language", "task_type", "ref_audio", "ref_text"):
            props[field] = {"type": "null", "default": None}


def _shape_speech(schemas: Schemas, ctx: DocContext) -> None:
    speech_ = schemas["SpeechRequest"]
    narrow_speech(speech_["properties"], ctx)
    # stream: false contradicts a stream_format.
    speech_["not"] = {
        "properties": {"stream": {"const": False}, "stream_format": {"enum": ["audio", "sse"]}},
        "required": ["stream", "stream_format"],
    }


SPEECH = Route(
    "POST",
    "/v1/audio/speech",
    speech,
    _speech_operation,
    submits="json",
    types=(SpeechRequest, SpeechAudioDelta, SpeechAudioDone),
    shape=_shape_speech,
)
TRANSCRIPTIONS = Route(
    "POST",
    "/v1/audio/transcriptions",
    transcriptions,
    Undescribed("a multipart form, which the document's JSON schemas do not describe"),
    submits="form",
)
