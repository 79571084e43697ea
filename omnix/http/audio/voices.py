"""``/v1/audio/voices``: the voices the served model speaks with, and uploaded ones.

Owns the routes, in vLLM-Omni's shapes so its clients work unchanged:
``GET`` (``VoiceList``: the talker checkpoint's speakers in its order,
``default`` the first, then on Qwen3-TTS Base the uploaded voices' names;
``uploaded_voices`` describes those); ``POST``, a multipart form
(``audio_sample``: the file; ``name``; ``consent``: the id of the
speaker's recorded consent; ``ref_text``: what the clip says, optional),
which keeps the clip, decoded, and its speaker vector (made once, here)
as a voice ``voice: NAME`` then clones (``cloning.py``); ``DELETE
/v1/audio/voices/{name}``.  Uploads and
deletions are Base's: elsewhere 405 (the document lists them only on
Base; ``POST`` is not even registered there).  Each bad field is a 400 naming it
(a missing name or consent, a name that is not one, a file that is not
audio, too big or too long), a name taken a 409, an unknown one a 404.

A pipeline with no talker that names speakers (a stand-in, or no speech
at all) lists none, and then takes any ``voice`` and ignores it.

Does not own the files (``voice_store.py``) nor decoding (``cloning.py``).
"""

from __future__ import annotations

import time
from typing import Any, Final, Literal

import msgspec
from aiohttp import web

from omnix.http.audio.cloning import MAX_SECONDS, MAX_VOICES, NAME, check_name
from omnix.http.audio.voice_store import StoredVoice
from omnix.http.common import doc
from omnix.http.common.form import FormSpec, read_form
from omnix.http.core.errors import ApiError, ErrorBody
from omnix.http.core.respond import json_response
from omnix.http.core.route import DocContext, Route
from omnix.http.core.server import Server
from omnix.http.media.common import ACCEPTED_AUDIO
from omnix.http.media.sound import sniff_audio
from omnix.models.paths import resolve_model
from omnix.pipelines.config import Qwen3TTSTalkerArgs
from omnix.pipelines.tts_card import read_tts_card


class VoiceList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    #: the speakers, then the uploaded voices, as ``voice`` takes them (any case)
    voices: list[str]
    #: the speaker ``"default"`` names, or "" when there are none
    default: str
    #: the voices uploaded with ``POST /v1/audio/voices``, oldest first
    uploaded_voices: list[StoredVoice] = []


class VoiceUploaded(msgspec.Struct, kw_only=True):
    success: bool = True
    voice: StoredVoice


class VoiceDeleted(msgspec.Struct, kw_only=True):
    success: bool = True
    message: str


_FORM: Final = FormSpec(
    route="POST /v1/audio/voices",
    hint="send a multipart form with audio_sample (the file), name, consent and optionally "
    "ref_text, as curl -F audio_sample=@voice.wav -F name=alice -F consent=ID sends it",
    texts=frozenset({"name", "consent", "ref_text"}),
    files=frozenset({"audio_sample"}),
    unsupported={
        "speaker_embedding": "omnix clones from audio: upload audio_sample instead.",
        "speaker_description": "omnix keeps no description of a voice; omit it.",
    },
)
_MAX_CONSENT: Final = 256
_MAX_REF_TEXT: Final = 4096


async def list_voices(server: Server, request: web.Request) -> web.Response:
    voices = list(server.served.voices())
    default = voices[0] if voices else ""
    uploaded = server.cloning.store.voices() if server.cloning.card() is not None else []
    body = VoiceList(
        voices=voices + [v.name for v in uploaded], default=default, uploaded_voices=uploaded
    )
    return json_response(body)


def _clones(server: Server, what: str, allow: str) -> int:
    """The rate the served checkpoint clones from; 405 when it clones none
    (its document lists no such method: ``allow``, the ones it has)."""
    card = server.cloning.card()
    if card is None:
        raise ApiError(
            405,
            f"{what}: pipeline {server.served.model!r} does not clone voices, so it takes no "
            "uploaded ones (only a Qwen3-TTS Base checkpoint does: omnix serve a Base folder). "
            "GET /v1/audio/voices lists the voices it speaks with.",
            code="method_not_allowed",
            headers={"Allow": allow},
        )
    return card.clone_rate


def _required(texts: dict[str, str], field: str, what: str) -> str:
    value = texts.get(field, "")
    if not value.strip():
        raise ApiError(400, f"{field} is required: {what}.", param=field, code="missing_field")
    return value


async def upload_voice(server: Server, request: web.Request) -> web.Response:
    rate = _clones(server, "POST /v1/audio/voices", "GET")
    form = await read_form(request, _FORM)
    uploads = form.files.get("audio_sample", [])
    if not uploads:
        raise ApiError(
            400,
            f"audio_sample is required: upload the voice's clip ({ACCEPTED_AUDIO}, at most "
            f"{MAX_SECONDS:g} s) as a file field.",
            param="audio_sample",
            code="missing_field",
        )
    name = _required(form.texts, "name", "the name speech requests give as voice")
    check_name(name)
    consent = _required(
        form.texts, "consent", "the id of the speaker's recorded consent to cloning their voice"
    )
    if len(consent) > _MAX_CONSENT:
        raise ApiError(
            400, f"consent is at most {_MAX_CONSENT} characters.", param="consent",
            code="invalid_value",
        )  # fmt: skip
    ref_text = form.texts.get("ref_text", "").strip() or None
    if ref_text is not None and len(ref_text) > _MAX_REF_TEXT:
        raise ApiError(
            400, f"ref_text is at most {_MAX_REF_TEXT} characters.", param="ref_text",
            code="invalid_value",
        )  # fmt: skip
    store = server.cloning.store
    if store.get(name) is not None:
        raise _taken(name)
    if len(store.voices()) >= MAX_VOICES:
        raise ApiError(
            400,
            f"This server keeps at most {MAX_VOICES} uploaded voices: delete one "
            "(DELETE /v1/audio/voices/{name}) first.",
            param="name",
            code="too_many_voices",
        )
    upload = uploads[0]
    samples = await server.cloning.decode_upload("audio_sample", upload, rate)
    # Made once here, kept with the voice: each request cloning it carries it.
    speaker = await server.cloning.speaker_vector(samples, rate)
    voice = StoredVoice(
        name=name,
        consent=consent,
        created_at=int(time.time()),
        mime_type=_media_type(upload.content_type, upload.data),
        file_size=len(upload.data),
        sample_rate=rate,
        seconds=round(samples.size / rate, 3),
        ref_text=ref_text,
    )
    if not await store.add(voice, samples, speaker):
        raise _taken(name)  # another upload of the name won meanwhile
    return json_response(VoiceUploaded(voice=voice))


def _taken(name: str) -> ApiError:
    return ApiError(
        409,
        f"A voice named {name!r} is already uploaded here (names compare without case): "
        "delete it first (DELETE /v1/audio/voices/{name}) or pick another name.",
        param="name",
        code="voice_exists",
    )


#: The demuxer ``sniff_audio`` names -> the media type listed.
_SNIFFED: Final = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "ogg": "audio/ogg",
    "mp3": "audio/mpeg",
    "mp4": "audio/mp4",
    "matroska": "audio/webm",
    "aac": "audio/aac",
}


def _media_type(declared: str, data: bytes) -> str:
    declared = declared.partition(";")[0].strip().lower()
    if declared.startswith("audio/"):
        return declared
    return _SNIFFED.get(sniff_audio(data, weak=True), "application/octet-stream")


async def delete_voice(server: Server, request: web.Request) -> web.Response:
    name = request.match_info["name"]
    _clones(server, f"DELETE /v1/audio/voices/{name[:64]}", "")
    voice = await server.cloning.store.delete(name)
    if voice is None:
        raise ApiError(
            404,
            f"No voice named {name[:80]!r} is uploaded here; GET /v1/audio/voices lists them.",
            param="name",
            code="voice_not_found",
        )
    return json_response(VoiceDeleted(message=f"Voice {voice.name!r} deleted"))


def _operation(ctx: DocContext) -> dict[str, Any]:
    return doc.get(
        "The voices the served model speaks with",
        doc.json_body(VoiceList, "The talker's speakers ('default' is the first), then "
                      "the uploaded voices"),
    )  # fmt: skip


def _clones_doc(ctx: DocContext) -> bool:
    for st in ctx.pipeline.stages:
        if isinstance(st.engine, Qwen3TTSTalkerArgs):
            card = read_tts_card(resolve_model(st.engine.model))
            return card is not None and card.variant == "base"
    return False


def _delete_operation(ctx: DocContext) -> dict[str, Any] | None:
    if not _clones_doc(ctx):
        return None
    name = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
    return doc.get(
        "Delete an uploaded voice",
        doc.json_body(VoiceDeleted, "Deleted"),
        params=[name],
        errors={"404": doc.json_body(ErrorBody, "No voice of that name is uploaded")},
    )


VOICES = Route("GET", "/v1/audio/voices", list_voices, _operation, types=(VoiceList, StoredVoice))


def _upload_operation(ctx: DocContext) -> dict[str, Any] | None:
    if not _clones_doc(ctx):
        return None
    text = {"type": "string", "minLength": 1}
    form = {
        "type": "object",
        "required": ["audio_sample", "name", "consent"],
        "properties": {
            "audio_sample": {"type": "string", "format": "binary"},
            "name": {"type": "string", "pattern": NAME.pattern},
            "consent": {**text, "maxLength": _MAX_CONSENT},
            "ref_text": {**text, "maxLength": _MAX_REF_TEXT},
        },
        "additionalProperties": False,
    }
    return {
        "summary": "Upload a voice to clone (Qwen3-TTS Base)",
        "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": form}}},
        "responses": {
            "200": doc.json_body(VoiceUploaded, "Kept: voice NAME now clones from it"),
            "400": doc.json_body(ErrorBody, "A field missing or bad, the audio not audio, "
                                 "too big or too long"),
            "409": doc.json_body(ErrorBody, "The name is taken"),
            "413": doc.ERRORS["413"],
        },
    }  # fmt: skip


# Served only on Base: elsewhere POST is not a method of the path (405).
UPLOAD = Route(
    "POST",
    "/v1/audio/voices",
    upload_voice,
    _upload_operation,
    types=(VoiceUploaded,),
    described_only=True,
)
DELETE = Route(
    "DELETE", "/v1/audio/voices/{name}", delete_voice, _delete_operation, types=(VoiceDeleted,)
)
