"""How a client asked to receive its response, as typed values in the log.

Owns: the per-API option Structs a ``RequestSpec`` records in ``response``
(schema v6): ``ChatOptions``, ``CompletionOptions``, ``SpeechOptions``,
``ImageOptions``, ``TranscriptionOptions`` (and, schema v7, a realtime
session's response: ``RealtimeOptions``; schema v14, a full-duplex
session: ``DuplexOptions``), in the one tagged union
``ResponseOptions`` whose tags are the ``RequestSpec.api`` names; ``Group``
(a member of a batch or of ``n`` samples); ``RawPrompt`` (a completion
prompt the source stage takes as is, in ``RequestSpec.raw_prompt``); and
``from_legacy``, the reader of the form schema v5 and older recorded
instead: a ``dict[str, str]`` with flags as ``"1"`` and token ids as a
JSON string (``RequestSpec.__post_init__`` calls it, so a reader only ever
sees the typed form).

The rules of ``types.py`` hold here: these are part of the log, so a
Struct only grows by appending fields with defaults, and a tag is never
renamed.  Does not own what the options mean for the bytes of a response
(``omnix.http.render``) nor how the HTTP layer chooses them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Final, Literal, TypeVar, assert_never

import msgspec

#: ``RequestSpec.api`` of each HTTP route, and the tag of its options.
API_CHAT: Final = "chat.completions"
API_COMPLETIONS: Final = "completions"
API_SPEECH: Final = "audio.speech"
API_IMAGES: Final = "images.generations"
API_TRANSCRIPTION: Final = "audio.transcriptions"
#: ``POST /v1/images/edits`` records ``ImageOptions`` (``edit``) under this api.
API_IMAGE_EDITS: Final = "images.edits"
API_VIDEOS: Final = "videos"
API_REALTIME: Final = "realtime"
#: A full-duplex ``/v1/realtime?duplex=1`` session (schema v14).
API_REALTIME_DUPLEX: Final = "realtime.duplex"

AudioFormat = Literal["wav", "mp3", "flac", "opus", "aac", "pcm"]
"""An encoded audio response's format (chat's ``pcm16`` is ``pcm``)."""
AUDIO_FORMATS: Final[tuple[AudioFormat, ...]] = ("wav", "mp3", "flac", "opus", "aac", "pcm")
StreamFormat = Literal["", "audio", "sse", "websocket"]
"""How speech streams: ``""`` not at all (one file), raw bytes, SSE, or
(schema v7) sentence by sentence over ``/v1/audio/speech/stream``."""
ImageResponseFormat = Literal["b64_json", "url"]
TranscriptionFormat = Literal["json", "text", "verbose_json"]

#: The sample rate an audio response is encoded at when no blob says.
DEFAULT_SAMPLE_RATE: Final = 24000


class Group(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """This request is member ``index`` of ``size`` submitted by one call
    under the id ``id`` (its members are ``id-0``, ``id-1``...), whose
    response needs every member.  ``samples``: the members are ``n``
    samples of one prompt (usage counts the prompt once); ``streamed``:
    their choices stream as one SSE response, in log order."""

    id: str
    index: int
    size: int
    samples: bool = False
    streamed: bool = False


class ChatOptions(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=API_CHAT):
    """``POST /v1/chat/completions``.  ``render``: the renderer's version
    at submission (``omnix.http.render.RENDER_VERSION``); ``*_stage``: the
    stages whose chunks are the answer's text and audio ("" none) and whose
    ``StageFinished`` gives usage; ``resumable``: SSE events carry ``id:``
    (render 3 on)."""

    render: int = 1
    stream: bool = False
    include_usage: bool = False
    usage_stage: str = ""
    text_stage: str = ""
    audio_stage: str = ""
    audio_format: AudioFormat = "wav"
    sample_rate: int = DEFAULT_SAMPLE_RATE
    voice: str = ""
    resumable: bool = False
    logprobs: bool = False
    group: Group | None = None


class CompletionOptions(
    msgspec.Struct, frozen=True, array_like=True, gc=False, tag=API_COMPLETIONS
):
    """``POST /v1/completions``; ``echo``: the prompt starts the text."""

    render: int = 1
    stream: bool = False
    include_usage: bool = False
    usage_stage: str = ""
    text_stage: str = ""
    resumable: bool = False
    logprobs: bool = False
    echo: bool = False
    group: Group | None = None


class SpeechOptions(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=API_SPEECH):
    """``POST /v1/audio/speech``."""

    render: int = 1
    stream: bool = False
    stream_format: StreamFormat = ""
    usage_stage: str = ""
    audio_stage: str = ""
    audio_format: AudioFormat = "wav"
    sample_rate: int = DEFAULT_SAMPLE_RATE
    voice: str = ""


class ImageOptions(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=API_IMAGES):
    """``POST /v1/images/generations`` and ``POST /v1/images/edits``
    (``edit``, schema v7).  ``files_url``: the absolute URL of
    ``GET /v1/files/`` as the client reached the server (``url`` answers);
    ``output_format``: the file format the client named ("" none);
    ``size``: the images' ``WxH`` (schema v7; the streamed events say it)."""

    render: int = 1
    stream: bool = False
    usage_stage: str = ""
    image_stage: str = ""
    response_format: ImageResponseFormat = "b64_json"
    files_url: str = ""
    output_format: str = ""
    group: Group | None = None
    edit: bool = False
    size: str = ""


class TranscriptionOptions(
    msgspec.Struct, frozen=True, array_like=True, gc=False, tag=API_TRANSCRIPTION
):
    """``POST /v1/audio/transcriptions``.  ``language``: its English name,
    lowercase ("" unknown); ``temperature``: the text stage's, for
    ``verbose_json``."""

    render: int = 1
    stream: bool = False
    usage_stage: str = ""
    text_stage: str = ""
    response_format: TranscriptionFormat = "json"
    language: str = ""
    temperature: float = 0.0


class VideoOptions(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=API_VIDEOS):
    """``POST /v1/videos`` (schema v7): a video job, answered as OpenAI's
    ``Video`` object.  ``video_stage``: the stage whose chunk is the MP4;
    ``seconds``, ``size``, ``fps``, ``num_frames``: what the job makes, as
    the route mapped the request onto what the pipeline accepts;
    ``asked``: what the client asked for where it differs (``"seconds=4
    size=720x1280"``), "" when nothing was rounded."""

    render: int = 1
    stream: bool = False  # never: a job is polled
    usage_stage: str = ""
    video_stage: str = ""
    seconds: str = ""
    size: str = ""
    fps: int = 0
    num_frames: int = 0
    asked: str = ""


OutputModalities = tuple[Literal["text", "audio"], ...]


class RealtimeOptions(msgspec.Struct, frozen=True, array_like=True, gc=False, tag=API_REALTIME):
    """One response of a ``/v1/realtime`` session (schema v7).  The
    request's id is the response's (``resp_...``); ``session`` the session
    it belongs to; ``item`` the id of the assistant item it adds and
    ``previous_item`` the item before it in the conversation ("" none);
    ``conversation`` the conversation it joins ("" for an out-of-band
    response, ``conversation: "none"``); ``modalities`` the output
    modalities the client asked for (``["audio"]`` carries a transcript);
    ``max_output_tokens`` 0 for ``"inf"``; ``metadata`` echoed.  A
    session's input audio transcription is a request with these options
    too, its ``spec.api`` ``audio.transcriptions``: ``item`` is then the
    user item whose audio it transcribes, ``conversation`` ""."""

    render: int = 1
    stream: bool = True
    session: str = ""
    item: str = ""
    previous_item: str = ""
    conversation: str = ""
    modalities: OutputModalities = ("text",)
    usage_stage: str = ""
    text_stage: str = ""
    audio_stage: str = ""
    sample_rate: int = DEFAULT_SAMPLE_RATE
    voice: str = ""
    max_output_tokens: int = 0
    metadata: dict[str, str] = {}


DuplexFormat = Literal["pcm16", "pcm_f32le"]
"""A full-duplex session's wire audio: 16-bit or 32-bit float
little-endian mono PCM (at the model's rate)."""


class DuplexOptions(
    msgspec.Struct, frozen=True, array_like=True, gc=False, tag=API_REALTIME_DUPLEX
):
    """A full-duplex ``/v1/realtime?duplex=1`` session (schema v14): the
    request is the session (its id is the session's), its input the
    user's audio as it streams (``InputAppended`` frames), its chunks the
    model's frames, all one continuous response ``response`` whose
    assistant item is ``item``.  ``audio_stage`` (and ``usage_stage``):
    the stage whose chunks are the frames; ``input_format`` / ``output_format``: the PCM the
    client sends and is sent, at ``sample_rate``; ``voice`` and
    ``instructions``: the persona the session asked for ("" none)."""

    render: int = 1
    stream: bool = True
    response: str = ""
    item: str = ""
    usage_stage: str = ""
    audio_stage: str = ""
    sample_rate: int = DEFAULT_SAMPLE_RATE
    input_format: DuplexFormat = "pcm_f32le"
    output_format: DuplexFormat = "pcm16"
    voice: str = ""
    instructions: str = ""


#: How the client asked to receive the response, per API (tag: the API).
ResponseOptions = (
    ChatOptions
    | CompletionOptions
    | SpeechOptions
    | ImageOptions
    | TranscriptionOptions
    | VideoOptions
    | RealtimeOptions
    | DuplexOptions
)


def group_of(response: ResponseOptions | None) -> Group | None:
    """The batch the request is a member of, None when it is alone."""
    match response:
        case ChatOptions() | CompletionOptions() | ImageOptions():
            return response.group
        case (
            SpeechOptions()
            | TranscriptionOptions()
            | VideoOptions()
            | RealtimeOptions()
            | DuplexOptions()
            | None
        ):
            return None
        case _:
            assert_never(response)


class RawPrompt(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """The request's prompt goes to its source stage as is, whatever the
    stage's ``input_mode`` (no chat template): as ``token_ids`` when the
    client gave ids (``RequestSpec.prompt`` is then their text), else as
    the prompt's text."""

    token_ids: tuple[int, ...] = ()


# --------------------------------------------------------------------------
# The form of schema v5 and older: strings under these keys
# --------------------------------------------------------------------------

_T = TypeVar("_T")


def _flag(d: Mapping[str, str], key: str) -> bool:
    return d.get(key, "") == "1"


def _int(d: Mapping[str, str], key: str, default: int) -> int:
    try:
        return int(d.get(key, "") or default)
    except ValueError:
        return default


def _one_of(value: str, allowed: tuple[_T, ...], default: _T) -> _T:
    for a in allowed:
        if a == value:
            return a
    return default


def _audio_format(d: Mapping[str, str], default: AudioFormat) -> AudioFormat:
    name = d.get("audio_format", "") or default
    return _one_of("pcm" if name == "pcm16" else name, AUDIO_FORMATS, default)


def _group(d: Mapping[str, str]) -> Group | None:
    size = _int(d, "group_size", 1)
    if size <= 1:
        return None
    return Group(
        id=d.get("group", ""),
        index=_int(d, "group_index", 0),
        size=size,
        samples=_flag(d, "choices"),
        streamed=_flag(d, "group_stream"),
    )


def _common(d: Mapping[str, str]) -> tuple[int, bool, str]:
    """(render, stream, usage stage): every API recorded them."""
    render = d.get("render", "1")
    return int(render) if render.isdigit() else 1, _flag(d, "stream"), d.get("usage_stage", "")


def _chat(d: Mapping[str, str]) -> ChatOptions:
    render, stream, usage = _common(d)
    return ChatOptions(
        render=render,
        stream=stream,
        include_usage=_flag(d, "include_usage"),
        usage_stage=usage,
        text_stage=d.get("text_stage", ""),
        audio_stage=d.get("audio_stage", ""),
        audio_format=_audio_format(d, "wav"),
        sample_rate=_int(d, "sample_rate", DEFAULT_SAMPLE_RATE),
        voice=d.get("voice", ""),
        resumable=_flag(d, "sse_ids"),
        logprobs=_flag(d, "logprobs"),
        group=_group(d),
    )


def _completion(d: Mapping[str, str]) -> CompletionOptions:
    render, stream, usage = _common(d)
    return CompletionOptions(
        render=render,
        stream=stream,
        include_usage=_flag(d, "include_usage"),
        usage_stage=usage,
        text_stage=d.get("text_stage", ""),
        resumable=_flag(d, "sse_ids"),
        logprobs=_flag(d, "logprobs"),
        echo=_flag(d, "echo"),
        group=_group(d),
    )


def _speech(d: Mapping[str, str]) -> SpeechOptions:
    render, stream, usage = _common(d)
    stream_formats: tuple[StreamFormat, ...] = ("", "audio", "sse")
    return SpeechOptions(
        render=render,
        stream=stream,
        stream_format=_one_of(d.get("stream_format", ""), stream_formats, ""),
        usage_stage=usage,
        audio_stage=d.get("audio_stage", ""),
        audio_format=_audio_format(d, "wav"),
        sample_rate=_int(d, "sample_rate", DEFAULT_SAMPLE_RATE),
        voice=d.get("voice", ""),
    )


def _images(d: Mapping[str, str]) -> ImageOptions:
    render, stream, usage = _common(d)
    formats: tuple[ImageResponseFormat, ...] = ("b64_json", "url")
    return ImageOptions(
        render=render,
        stream=stream,
        usage_stage=usage,
        image_stage=d.get("image_stage", ""),
        response_format=_one_of(d.get("response_format", ""), formats, "b64_json"),
        files_url=d.get("files_url", ""),
        output_format=d.get("output_format", ""),
        group=_group(d),
    )


def _transcription(d: Mapping[str, str]) -> TranscriptionOptions:
    render, stream, usage = _common(d)
    formats: tuple[TranscriptionFormat, ...] = ("json", "text", "verbose_json")
    try:
        temperature = float(d.get("temperature", "") or 0)
    except ValueError:
        temperature = 0.0
    return TranscriptionOptions(
        render=render,
        stream=stream,
        usage_stage=usage,
        text_stage=d.get("text_stage", ""),
        response_format=_one_of(d.get("response_format", ""), formats, "json"),
        language=d.get("language", ""),
        temperature=temperature,
    )


_LEGACY: Final[dict[str, Callable[[Mapping[str, str]], ResponseOptions]]] = {
    API_CHAT: _chat,
    API_COMPLETIONS: _completion,
    API_SPEECH: _speech,
    API_IMAGES: _images,
    API_TRANSCRIPTION: _transcription,
}


def from_legacy(
    api: str, options: Mapping[str, str]
) -> tuple[ResponseOptions | None, RawPrompt | None]:
    """The typed form of a v5-or-older spec's ``options`` of ``api``: the
    response options (None for an API the HTTP layer does not render) and
    the raw prompt (``"raw_prompt": "1"``, with ``"prompt_token_ids"`` a
    JSON list).  Never raises: a value omnix never wrote reads as the
    field's default."""
    make = _LEGACY.get(api)
    response = make(options) if make is not None else None
    raw = None
    if _flag(options, "raw_prompt"):
        try:
            ids = json.loads(options.get("prompt_token_ids", "") or "[]")
        except ValueError:
            ids = []
        ok = isinstance(ids, list) and all(type(i) is int for i in ids)
        raw = RawPrompt(token_ids=tuple(ids) if ok else ())
    return response, raw


__all__ = [
    "API_CHAT",
    "API_COMPLETIONS",
    "API_IMAGES",
    "API_IMAGE_EDITS",
    "API_REALTIME",
    "API_REALTIME_DUPLEX",
    "API_SPEECH",
    "API_TRANSCRIPTION",
    "API_VIDEOS",
    "AUDIO_FORMATS",
    "DEFAULT_SAMPLE_RATE",
    "AudioFormat",
    "ChatOptions",
    "CompletionOptions",
    "DuplexFormat",
    "DuplexOptions",
    "Group",
    "ImageOptions",
    "ImageResponseFormat",
    "OutputModalities",
    "RawPrompt",
    "RealtimeOptions",
    "ResponseOptions",
    "SpeechOptions",
    "StreamFormat",
    "TranscriptionFormat",
    "TranscriptionOptions",
    "VideoOptions",
    "from_legacy",
    "group_of",
]
