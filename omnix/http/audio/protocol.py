"""Speech's and transcriptions' bodies, as typed msgspec Structs.

Owns: ``SpeechRequest``, ``SpeechFields`` (what it takes on the served
pipeline, as the model card publishes it) and the ``speech.audio.*`` SSE
events; the batch's body and answer (``SpeechBatchRequest``,
``SpeechBatchItem``, ``SpeechBatchResponse``, ``SpeechBatchResult``,
vLLM-Omni's shapes);
``TranscriptionForm`` (the text fields of the multipart form) and the
transcription responses (``json``, ``verbose_json``, the
``transcript.text.*`` SSE events).

Does not own what a body means (``speech.py``, ``transcribe.py``) nor
filling the responses (``speech_render.py``, ``transcription_render.py``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from omnix.events.options import TranscriptionFormat
from omnix.http.common.fields import REQUEST, SamplingParamsList, Seed, Speed, Voice

SpeechFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
SpeechInput = Annotated[str, Meta(min_length=1, max_length=16384)]
Instructions = Annotated[str, Meta(max_length=4096)]
Language = Annotated[str, Meta(min_length=1, max_length=64)]
#: Qwen3-TTS's variants as vLLM-Omni's ``task_type`` names them.
TaskType = Literal["CustomVoice", "VoiceDesign", "Base"]


class SpeechRequest(msgspec.Struct, **REQUEST):
    """POST /v1/audio/speech.  Without ``stream_format`` the whole file is
    returned once generated; ``"audio"`` streams the encoded bytes as they
    are produced (chunked transfer); ``"sse"`` streams
    ``speech.audio.delta`` events.  ``stream: true`` (vLLM-Omni's) means
    ``stream_format: "sse"`` unless a ``stream_format`` is given.
    ``speed`` other than 1 and ``instructions`` are refused (400) by a
    pipeline none of whose speech stages can honour them.

    Qwen3-TTS (vLLM-Omni's fields): ``instructions`` is CustomVoice's
    instruction (how to say it) or VoiceDesign's description of the voice
    (required there); ``language`` ``"auto"`` or one of the checkpoint's;
    ``task_type``, when given, must be the served variant's.  ``ref_audio``
    (a ``data:`` URL, or an http(s) URL of an allowed media host, of audio
    at any rate) and ``ref_text`` (its transcript, optional) clone a voice:
    the Base variant's, refused elsewhere; on Base, ``voice`` may instead
    name a voice uploaded with ``POST /v1/audio/voices``."""

    input: SpeechInput
    model: str = ""
    voice: Voice = "default"
    response_format: SpeechFormat = "mp3"
    speed: Speed = 1.0
    stream_format: Literal["audio", "sse"] | None = None
    stream: bool | None = None
    instructions: Instructions | None = None
    seed: Seed | None = None
    sampling_params_list: SamplingParamsList | None = None
    language: Language | None = None
    task_type: TaskType | None = None
    ref_audio: str | None = None
    ref_text: str | None = None


#: How the speech route takes a field on the served pipeline.
Takes = Literal["refused", "optional", "required"]


class SpeechFields(msgspec.Struct, kw_only=True):
    """omnix: what ``POST /v1/audio/speech`` takes on the served pipeline
    besides ``input``, ``voice`` (``GET /v1/audio/voices`` lists the named
    ones) and the response's form, as the route checks a body: a field
    ``refused`` is a 400 when given, one ``required`` a 400 when missing.
    On a pipeline without a Qwen3-TTS talker every one is refused."""

    #: the served Qwen3-TTS variant (the ``task_type`` it takes); None: not Qwen3-TTS
    task_type: TaskType | None = None
    #: CustomVoice: how to say it (optional); VoiceDesign: the voice described (required)
    instructions: Takes = "refused"
    #: what ``language`` takes, ``"auto"`` first; empty when it is refused
    languages: list[str] = msgspec.field(default_factory=list)
    #: Base: the voice to clone, audio as a ``data:`` URL (or an http(s) URL
    #: of an allowed host); an uploaded voice named in ``voice`` serves instead
    ref_audio: Takes = "refused"
    #: the rate (Hz) the clip is resampled to (the speaker encoder's); 0 when refused
    ref_audio_rate: int = 0
    #: Base: ``ref_audio``'s transcript (given: the voice is cloned in context)
    ref_text: Takes = "refused"


class SpeechBatchItem(msgspec.Struct, **REQUEST):
    """One text of ``POST /v1/audio/speech/batch``: each field but
    ``input`` overrides the batch's when given."""

    input: SpeechInput
    voice: Voice | None = None
    instructions: Instructions | None = None
    response_format: SpeechFormat | None = None
    speed: Speed | None = None
    task_type: TaskType | None = None
    language: Language | None = None
    ref_audio: str | None = None
    ref_text: str | None = None
    seed: Seed | None = None
    sampling_params_list: SamplingParamsList | None = None


class SpeechBatchRequest(msgspec.Struct, **REQUEST):
    """POST /v1/audio/speech/batch (vLLM-Omni's): ``items``, each spoken as
    its own ``POST /v1/audio/speech`` of these fields with the item's
    overriding them (``response_format`` ``wav`` unless one says)."""

    items: Annotated[list[SpeechBatchItem], Meta(min_length=1)]
    model: str = ""
    voice: Voice = "default"
    instructions: Instructions | None = None
    response_format: SpeechFormat = "wav"
    speed: Speed = 1.0
    task_type: TaskType | None = None
    language: Language | None = None
    ref_audio: str | None = None
    ref_text: str | None = None
    seed: Seed | None = None
    sampling_params_list: SamplingParamsList | None = None


class SpeechAudioDelta(msgspec.Struct, tag="speech.audio.delta", tag_field="type"):
    audio: str


class SpeechUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class SpeechAudioDone(msgspec.Struct, tag="speech.audio.done", tag_field="type"):
    usage: SpeechUsage


class SpeechBatchResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One item's answer: its audio file as base64 (``success``), or why
    it failed once admitted (``error``); ``request_id``: its request."""

    index: int
    status: Literal["success", "error"]
    request_id: str
    audio_data: str | None = None
    media_type: str | None = None
    usage: SpeechUsage | None = None
    error: str | None = None


class SpeechBatchResponse(msgspec.Struct, kw_only=True):
    """The batch's answer: one result per item, in order."""

    id: str
    results: list[SpeechBatchResult]
    total: int
    succeeded: int
    failed: int


class TranscriptionForm(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The text fields of the form (``file`` is read apart: it is bytes).

    ``temperature`` is OpenAI's 0-1 range; omitted, the pipeline's own
    (0 on ``tiny-asr``: greedy).  ``language`` is an ISO-639-1 code.
    """

    model: str = ""
    language: str | None = None
    # Short, as Whisper's 224 tokens: the prompt shares max_model_len with
    # the clip (13 tokens a second) and the transcript.
    prompt: Annotated[str, Meta(max_length=1000)] | None = None
    response_format: TranscriptionFormat = "json"
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    stream: bool = False


class TranscriptionUsage(msgspec.Struct, kw_only=True):
    type: Literal["tokens"] = "tokens"
    input_tokens: int
    output_tokens: int
    total_tokens: int


class DurationUsage(msgspec.Struct, kw_only=True):
    type: Literal["duration"] = "duration"
    seconds: float


class Transcription(msgspec.Struct, kw_only=True):
    """``response_format="json"``: OpenAI's ``Transcription``."""

    text: str
    usage: TranscriptionUsage
    request_ids: list[str]


class TranscriptionSegment(msgspec.Struct, kw_only=True):
    """One segment of verbose_json.  omnix computes no log probabilities,
    compression ratio or speech probability: those fields are 0."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0


class TranscriptionVerbose(msgspec.Struct, kw_only=True):
    """``response_format="verbose_json"``: OpenAI's ``TranscriptionVerbose``
    with Whisper's ``task``; one segment covers the clip."""

    task: Literal["transcribe"] = "transcribe"
    language: str
    duration: float
    text: str
    segments: list[TranscriptionSegment]
    usage: DurationUsage
    request_ids: list[str]


class TranscriptTextDelta(msgspec.Struct, tag="transcript.text.delta", tag_field="type"):
    delta: str


class TranscriptTextDone(msgspec.Struct, tag="transcript.text.done", tag_field="type"):
    text: str
    usage: TranscriptionUsage
