"""``POST /v1/audio/transcriptions``: OpenAI's multipart transcription form.

Owns: reading the form (``TranscriptionForm`` plus the uploaded ``file``),
every check of it that needs no decoding (which fields exist, their
values, that the served pipeline takes audio and gives text), the upload's
conversion into the part a chat message with one audio clip holds, and the
plan: one user message, the clip then an instruction ("Transcribe the
audio into text.", with the language and prompt when given), planned by
``chat.plan.chat_plan`` as a chat would be, then recorded with
``api = "audio.transcriptions"`` and the ``TranscriptionOptions`` its
response renders from (``response_format``, ``language``, ``temperature``;
``stream``).

Every refusal is an ``ApiError`` raised before anything is admitted: 400
for a bad form (not multipart, no or an empty ``file``, an unknown or
repeated field, a bad value, a format or option omnix does not produce:
``srt``, ``vtt``, ``diarized_json``, ``timestamp_granularities[]``...),
or 400 with an ``unsupported_*`` code when the served pipeline cannot
transcribe.

Does not own the handler, decoding the clip or its limits (``router.py``
decodes through ``omnix.http.media``, naming the part ``file`` in its
errors), submission and the live response (``omnix.http.core``), nor any
byte of the response (``transcription_render.py``).
"""

from __future__ import annotations

import base64
import posixpath
from typing import Final

import msgspec
from aiohttp import web

from omnix.events.options import API_TRANSCRIPTION, ChatOptions, TranscriptionOptions
from omnix.events.types import MediaPart
from omnix.http.audio.protocol import TranscriptionForm
from omnix.http.chat.plan import chat_plan
from omnix.http.chat.protocol import ChatCompletionRequest
from omnix.http.common import form as common_form
from omnix.http.common.fields import (
    AudioUrl,
    AudioUrlPart,
    InputAudio,
    InputAudioPart,
    MediaContentPart,
    Message,
    TextPart,
)
from omnix.http.common.form import Upload
from omnix.http.common.plan import DecodedBlob, Plan, PlanContext
from omnix.http.core.errors import ApiError
from omnix.http.media.common import AUDIO_MEDIA_TYPES

#: The form field that carries the clip (the decoder names it in errors).
FILE: Final = "file"


#: OpenAI fields this route knows and does not take, with what to do.
UNSUPPORTED_FIELDS: Final[dict[str, str]] = {
    "timestamp_granularities": "omnix gives no word or segment timestamps (verbose_json "
    "has one segment covering the clip); omit it.",
    "include": "omnix returns no log probabilities; omit it.",
    "chunking_strategy": "omnix transcribes the clip as one block; omit it.",
    "known_speaker_names": "omnix does not diarize; omit it.",
    "known_speaker_references": "omnix does not diarize; omit it.",
    "keywords": "omit it; give words the audio contains in prompt instead.",
    "languages": "give one ISO-639-1 code in language instead.",
}
#: response_format values of OpenAI's that omnix does not produce.
UNSUPPORTED_FORMATS: Final[dict[str, str]] = {
    "srt": "omnix has no segment timestamps to write subtitles with",
    "vtt": "omnix has no segment timestamps to write subtitles with",
    "diarized_json": "omnix does not diarize",
}
_TEXT_FIELDS: Final = frozenset(TranscriptionForm.__struct_fields__)

# File name extension -> ``input_audio.format`` (a Content-Type goes into
# a data URL, read as chat's are).  The decoder trusts the bytes' own magic
# number over either.
_EXTENSIONS: Final[dict[str, str]] = {
    "wav": "wav",
    "wave": "wav",
    "mp3": "mp3",
    "mpeg": "mp3",
    "mpga": "mp3",
    "flac": "flac",
    "ogg": "ogg",
    "oga": "ogg",
    "opus": "opus",
    "aac": "aac",
    "m4a": "m4a",
    "mp4": "mp4",
    "webm": "webm",
}

# ISO-639-1 codes and English names: ``language`` must be one of them, and
# its name goes into the instruction and verbose_json's ``language``.
_LANGUAGE_TABLE = """
aa Afar|ab Abkhazian|ae Avestan|af Afrikaans|ak Akan|am Amharic|an Aragonese|ar Arabic|
as Assamese|av Avaric|ay Aymara|az Azerbaijani|ba Bashkir|be Belarusian|bg Bulgarian|
bi Bislama|bm Bambara|bn Bengali|bo Tibetan|br Breton|bs Bosnian|ca Catalan|ce Chechen|
ch Chamorro|co Corsican|cr Cree|cs Czech|cu Church Slavic|cv Chuvash|cy Welsh|da Danish|
de German|dv Divehi|dz Dzongkha|ee Ewe|el Greek|en English|eo Esperanto|es Spanish|
et Estonian|eu Basque|fa Persian|ff Fulah|fi Finnish|fj Fijian|fo Faroese|fr French|
fy Western Frisian|ga Irish|gd Scottish Gaelic|gl Galician|gn Guarani|gu Gujarati|gv Manx|
ha Hausa|he Hebrew|hi Hindi|ho Hiri Motu|hr Croatian|ht Haitian|hu Hungarian|hy Armenian|
hz Herero|ia Interlingua|id Indonesian|ie Interlingue|ig Igbo|ii Sichuan Yi|ik Inupiaq|
io Ido|is Icelandic|it Italian|iu Inuktitut|ja Japanese|jv Javanese|ka Georgian|
kg Kongo|ki Kikuyu|kj Kuanyama|kk Kazakh|kl Kalaallisut|km Khmer|kn Kannada|ko Korean|
kr Kanuri|ks Kashmiri|ku Kurdish|kv Komi|kw Cornish|ky Kyrgyz|la Latin|lb Luxembourgish|
lg Ganda|li Limburgish|ln Lingala|lo Lao|lt Lithuanian|lu Luba-Katanga|lv Latvian|
mg Malagasy|mh Marshallese|mi Maori|mk Macedonian|ml Malayalam|mn Mongolian|mr Marathi|
ms Malay|mt Maltese|my Burmese|na Nauru|nb Norwegian Bokmal|nd North Ndebele|ne Nepali|
ng Ndonga|nl Dutch|nn Norwegian Nynorsk|no Norwegian|nr South Ndebele|nv Navajo|ny Chichewa|
oc Occitan|oj Ojibwa|om Oromo|or Oriya|os Ossetian|pa Punjabi|pi Pali|pl Polish|ps Pashto|
pt Portuguese|qu Quechua|rm Romansh|rn Rundi|ro Romanian|ru Russian|rw Kinyarwanda|
sa Sanskrit|sc Sardinian|sd Sindhi|se Northern Sami|sg Sango|si Sinhala|sk Slovak|
sl Slovenian|sm Samoan|sn Shona|so Somali|sq Albanian|sr Serbian|ss Swati|st Southern Sotho|
su Sundanese|sv Swedish|sw Swahili|ta Tamil|te Telugu|tg Tajik|th Thai|ti Tigrinya|
tk Turkmen|tl Tagalog|tn Tswana|to Tonga|tr Turkish|ts Tsonga|tt Tatar|tw Twi|ty Tahitian|
ug Uyghur|uk Ukrainian|ur Urdu|uz Uzbek|ve Venda|vi Vietnamese|vo Volapuk|wa Walloon|
wo Wolof|xh Xhosa|yi Yiddish|yo Yoruba|za Zhuang|zh Chinese|zu Zulu
"""
LANGUAGES: Final[dict[str, str]] = dict(
    entry.strip().split(" ", 1) for entry in _LANGUAGE_TABLE.split("|") if entry.strip()
)

# Where the clip stands in the chat body ``chat_plan`` is given.
_AUDIO_AT: Final = "messages[0].content[0]"
# ``chat_plan`` takes the decoded clip from ``media`` by its path; the
# body's part only marks where the clip stands among the text parts.
_MARK: Final = InputAudioPart(input_audio=InputAudio(data="", format="wav"))


def _bad(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


_FORM_HINT = (
    "send multipart/form-data with the clip in a file field "
    "(curl -F file=@clip.wav -F model=... ; the openai client's "
    "audio.transcriptions.create(file=...) does this)"
)
_SPEC: Final = common_form.FormSpec(
    route="POST /v1/audio/transcriptions",
    hint=_FORM_HINT,
    texts=_TEXT_FIELDS,
    files=frozenset({FILE}),
    unsupported=UNSUPPORTED_FIELDS,
)


# --------------------------------------------------------------------------
# The form
# --------------------------------------------------------------------------


async def read_form(request: web.Request) -> tuple[TranscriptionForm, Upload]:
    """The form's fields and its ``file``.  Raises ``ApiError`` 400 naming
    the field at fault; 413 (aiohttp's, past ``client_max_size``) while
    reading."""
    form = await common_form.read_form(request, _SPEC)
    uploads = form.files.get(FILE)
    if not uploads:
        raise _bad(FILE, f"The form has no file field: {_FORM_HINT}.")
    upload = uploads[0]
    if not upload.data:
        raise _bad(FILE, f"The uploaded file {upload.filename!r} is empty: send an audio clip.")
    return checked_form(form.texts), upload


def checked_form(texts: dict[str, str]) -> TranscriptionForm:
    """The form's text fields checked and typed (400 naming the field at
    fault); a realtime session's transcription settings are checked here
    too."""
    fmt = texts.get("response_format")
    if fmt in UNSUPPORTED_FORMATS:
        raise _bad(
            "response_format",
            f"response_format {fmt!r} is not supported: {UNSUPPORTED_FORMATS[fmt]}. Use json, "
            "text or verbose_json.",
            "unsupported_value",
        )
    lang = texts.get("language")
    if lang is not None and lang.strip().lower() not in LANGUAGES:
        raise _bad(
            "language",
            f"language {lang!r} is not an ISO-639-1 code: give the audio's language as two "
            "letters (en, fr, zh...), or omit it.",
        )
    form = common_form.form_struct(texts, TranscriptionForm)
    if form.language is not None:
        form = msgspec.structs.replace(form, language=form.language.strip().lower())
    if form.stream and form.response_format != "json":
        raise _bad(
            "stream",
            f"stream=true sends transcript.text.delta and transcript.text.done events; "
            f"response_format {form.response_format!r} has no streamed form. Omit "
            "response_format (or send json) to stream, or send stream=false.",
            "unsupported_value",
        )
    return form


def audio_part(upload: Upload) -> MediaContentPart:
    """The upload as the chat content part the media decoder reads: an
    ``input_audio`` part when its file name says the format, else a data
    URL of its audio Content-Type, or of unknown type (the decoder then
    tells the format from the bytes)."""
    ext = posixpath.splitext(upload.filename.lower())[1].lstrip(".")
    ctype = upload.content_type.partition(";")[0].strip().lower()
    data = base64.b64encode(upload.data).decode("ascii")
    if fmt := _EXTENSIONS.get(ext):
        return InputAudioPart(input_audio=InputAudio(data=data, format=fmt))
    if ctype not in AUDIO_MEDIA_TYPES:
        ctype = "application/octet-stream"
    return AudioUrlPart(audio_url=AudioUrl(url=f"data:{ctype};base64,{data}"))


# --------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------


def check_pipeline(served: PlanContext) -> None:
    """400 unless the served pipeline takes audio and produces text."""
    p = served.pipeline
    media = p.input_media
    if media is None or not media.audio:
        raise ApiError(
            400,
            f"pipeline {p.name!r} does not take audio input, so it cannot transcribe. Serve "
            "one that does (omnix serve --pipeline tiny-asr, or tiny-omni).",
            param=FILE,
            code="unsupported_input",
        )
    if "text" not in p.outputs:
        raise ApiError(
            400,
            f"pipeline {p.name!r} produces no text ({', '.join(p.outputs) or 'nothing'}), so it "
            "cannot transcribe. Serve one that does (omnix serve --pipeline tiny-asr).",
            param="model",
            code="unsupported_modality",
        )


def instruction(form: TranscriptionForm) -> str:
    """What the model is asked, after the clip."""
    lang = f"{LANGUAGES[form.language]} " if form.language else ""
    text = f"Transcribe the {lang}audio into text."
    if form.prompt:
        text += f" The text before it, or words it may contain: {form.prompt}"
    return text


def transcription_plan(
    form: TranscriptionForm,
    served: PlanContext,
    audio: MediaPart,
    blobs: tuple[DecodedBlob, ...],
    *,
    traceparent: str = "",
) -> Plan:
    """One request: a user message of the decoded clip (``audio``, whose
    array is ``blobs``) and the instruction, planned as a chat is."""
    body = ChatCompletionRequest(
        messages=[Message(role="user", content=[_MARK, TextPart(text=instruction(form))])],
        model=form.model,
        temperature=form.temperature,
        stream=form.stream,
    )
    plan = chat_plan(body, served, traceparent=traceparent, media={_AUDIO_AT: audio}, blobs=blobs)
    ((rid, spec),) = plan.specs
    chat = spec.response
    assert isinstance(chat, ChatOptions)
    given = spec.stage_params.get(chat.text_stage)
    temperature = given.temperature if given is not None else None
    if temperature is None:
        temperature = served.pipeline.stage(chat.text_stage).sampling.temperature
    opts = TranscriptionOptions(
        render=chat.render,
        stream=chat.stream,
        usage_stage=chat.usage_stage,
        text_stage=chat.text_stage,
        response_format=form.response_format,
        language=LANGUAGES[form.language].lower() if form.language else "",
        # vLLM's default when neither the client nor the pipeline says.
        temperature=1.0 if temperature is None else float(temperature),
    )
    spec = msgspec.structs.replace(spec, api=API_TRANSCRIPTION, response=opts)
    return msgspec.structs.replace(plan, specs=((rid, spec),))


__all__ = [
    "LANGUAGES",
    "Upload",
    "audio_part",
    "check_pipeline",
    "checked_form",
    "instruction",
    "read_form",
    "transcription_plan",
]
