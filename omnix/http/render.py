"""Response rendering as a pure function of the log.

Owns: turning a request's events (and the blobs they reference) into the
exact bytes the HTTP API sends for it: status and headers (``Head``),
OpenAI chat completions and ``chat.completion.chunk`` SSE streams, speech
files, raw audio streams and ``speech.audio.*`` SSE streams, image
responses, transcriptions (json, text, verbose_json and ``transcript.text.*``
SSE streams), and the error bodies of refused, failed and cancelled requests.
Also the SSE framing of ``/v1/requests/{id}/events`` and the JSON object
form of events and states.

Does not own reading the log, waiting, or sockets (``routes.py`` feeds
events in as the log tail yields them), nor what a client asked for: that
was recorded in ``RequestSpec.options`` at submission (``adapt.py``), so
nothing here reads a clock, a random source or the server's config.

The entry points, used by the live handlers *and* by replay:

    render_response(events, blobs) -> Rendered      # head + whole body
    render_stream(events, blobs) -> Iterator[bytes] # the body, piece by piece
    StreamRenderer(blobs).feed(ev) -> list[bytes]   # incremental (live)

``events`` are one request's events in log order (other events are
ignored), or for a batched request (``messages`` as a list of
conversations, images with ``n`` > 1) the events of all its members.
``b"".join(render_stream(...)) == render_response(...).body`` always, and
both equal what a client that stayed connected received.

SSE events carry ``id:``, the log position of the event that rendered them
(``event_ids``), so that rendering the events up to an id again leaves a
renderer that goes on with the rest of the same bytes (``resume.py``).

Determinism: ids derive from the request id, ``created`` from the Admitted
event's ``ts_ns``, the model from ``spec.model``, usage from StageFinished
counts, audio from chunk blobs through bitexact encoders.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

import msgspec
import numpy as np
from msgspec import UNSET

from omnix.events.blobs import BlobStore
from omnix.events.reducer import RequestState
from omnix.events.types import (
    Admitted,
    Cancelled,
    Chunk,
    Event,
    Failed,
    Finished,
    Rejected,
    RequestEvent,
    RequestSpec,
    StageFinished,
    TerminalEvent,
    TokenLogprob,
    event_tag,
)
from omnix.http.audio import (
    MEDIA_TYPES,
    AudioFormat,
    StreamEncoder,
    as_mono_float,
    encode_audio,
    normalize_format,
)
from omnix.http.errors import error_body, error_type
from omnix.http.schemas import (
    AssistantMessage,
    AudioOut,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChoiceLogprobs,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    Delta,
    ImageData,
    ImagesResponse,
    SpeechAudioDelta,
    SpeechAudioDone,
    SpeechUsage,
    TokenLogprobOut,
    TopLogprob,
    Usage,
)

#: Bumped whenever the bytes rendered for the same events change; recorded
#: in each request's options so a trace says which renderer produced it,
#: and requests recorded by an older version render as they did then.
#: "2": SSE events carry ``id:`` (``event_ids``).  "3": chat streams carry
#: ``id:`` only when the client asked for a resumable stream
#: (``Opt.SSE_IDS``): vLLM's benchmark client and other line-naive SSE
#: parsers take every event for ``data: <json>``, as OpenAI's are.
RENDER_VERSION = "3"

#: ``RequestSpec.api`` values of the HTTP routes.
API_CHAT = "chat.completions"
API_SPEECH = "audio.speech"
API_IMAGES = "images.generations"
API_TRANSCRIPTION = "audio.transcriptions"
API_COMPLETIONS = "completions"

#: Seconds a client should wait before retrying a refused request.
RETRY_AFTER = {"overloaded": "1", "not_ready": "5", "shutting_down": "30"}

#: How long the audio of a chat response is said to be valid (informational:
#: omnix keeps audio in its blob store, not behind an audio id).
AUDIO_EXPIRES_S = 24 * 3600

SSE_DONE = b"data: [DONE]\n\n"
_SSE_HEADERS = (("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"))


class Opt:
    """Keys of ``RequestSpec.options`` written by ``adapt.py`` (all strings)."""

    RENDER = "render"  # RENDER_VERSION at submission
    STREAM = "stream"  # "1": streamed response (SSE or raw audio)
    INCLUDE_USAGE = "include_usage"  # "1": chat stream ends with a usage chunk
    TEXT_STAGE = "text_stage"  # the stage whose text chunks are the answer
    AUDIO_STAGE = "audio_stage"
    IMAGE_STAGE = "image_stage"
    USAGE_STAGE = "usage_stage"  # the stage whose StageFinished gives usage
    AUDIO_FORMAT = "audio_format"  # wav | mp3 | flac | opus | aac | pcm
    SAMPLE_RATE = "sample_rate"
    VOICE = "voice"
    STREAM_FORMAT = "stream_format"  # speech: "" | audio | sse
    RESPONSE_FORMAT = "response_format"  # images: b64_json | url; transcriptions: json...
    FILES_URL = "files_url"  # images, url: absolute URL of GET /v1/files/ (from the Host)
    OUTPUT_FORMAT = "output_format"  # images: png | jpeg | webp, when the client named one
    LANGUAGE = "language"  # transcriptions: the language's English name, lowercase ("" unknown)
    TEMPERATURE = "temperature"  # transcriptions: the text stage's, for verbose_json
    GROUP = "group"  # batched requests: the group id ...
    GROUP_INDEX = "group_index"  # ... this member's choice index ...
    GROUP_SIZE = "group_size"  # ... and the number of members
    SSE_IDS = "sse_ids"  # chat, render >= 3: "1": SSE events carry id: (resumable)
    LOGPROBS = "logprobs"  # chat: "1": choices carry logprobs (Chunk.logprobs)
    CHOICES = "choices"  # chat: "1": the group is n choices of one prompt (usage: prompt once)
    GROUP_STREAM = "group_stream"  # chat: "1": the group's choices stream as one SSE response
    ECHO = "echo"  # completions: "1": the prompt (``spec.prompt``) starts the text
    # completions also record transport's OPT_RAW_PROMPT ("1") and, for a
    # token-id prompt, OPT_PROMPT_TOKEN_IDS: read by the dispatcher, not here


class Head(msgspec.Struct, frozen=True):
    """Status and headers of a response (aiohttp adds Date, Server, framing).

    ``streamed`` heads are sent before the body is known (chunked transfer);
    the others go with a complete body.  Whether the connection is cut
    instead of the body ending cleanly is not the head's to say: that is
    ``Rendered.aborted`` / ``StreamRenderer.aborted`` (a raw audio stream
    whose request failed must not look complete to its client).
    """

    status: int
    headers: tuple[tuple[str, str], ...]
    streamed: bool = False

    def header(self, name: str) -> str | None:
        low = name.lower()
        for k, v in self.headers:
            if k.lower() == low:
                return v
        return None


class Rendered(msgspec.Struct, frozen=True):
    head: Head
    body: bytes
    #: True when the connection was cut after ``body`` (a failed raw stream).
    aborted: bool = False


_enc = msgspec.json.Encoder()


def _sse(obj: Any) -> bytes:
    return b"data: " + _enc.encode(obj) + b"\n\n"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _flag(spec: RequestSpec, key: str) -> bool:
    return spec.options.get(key, "") == "1"


def _created(ev: RequestEvent) -> int:
    return ev.ts_ns // 1_000_000_000


# --------------------------------------------------------------------------
# Errors of admitted-then-ended and refused requests
# --------------------------------------------------------------------------


def terminal_error(ev: TerminalEvent) -> tuple[int, bytes, tuple[tuple[str, str], ...]] | None:
    """(status, error body, extra headers) for a request that did not
    finish; None for ``Finished``."""
    rid = ev.request_id
    if isinstance(ev, Rejected):
        status = 429 if ev.reason == "overloaded" else 503
        msg = (
            f"request {rid} was not admitted ({ev.reason}): {ev.message or ev.reason}. "
            "Retry after the number of seconds in the Retry-After header."
        )
        return (
            status,
            error_body(msg, error_type(status), None, ev.reason),
            (("Retry-After", RETRY_AFTER.get(ev.reason, "1")),),
        )
    if isinstance(ev, Failed):
        status = {"stage_timeout": 504, "no_replica": 503, "shutdown": 503}.get(ev.reason, 500)
        where = f" on stage {ev.stage!r}" if ev.stage else ""
        detail = f": {ev.message}" if ev.message else ""
        msg = f"request {rid} failed{where} ({ev.reason}){detail}"
        return status, error_body(msg, error_type(status), None, ev.reason), ()
    if isinstance(ev, Cancelled):
        status, code, why = {
            "deadline": (504, "deadline_exceeded", "its deadline passed"),
            "shutdown": (503, "shutdown", "the server is shutting down; retry on another server"),
            "client": (409, "cancelled", f"POST /v1/requests/{rid}/cancel asked for it"),
            "disconnect": (499, "client_disconnected", "its client disconnected"),
        }[ev.reason]
        msg = f"request {rid} was cancelled: {why}"
        return status, error_body(msg, error_type(status), None, code), ()
    return None


# --------------------------------------------------------------------------
# One request's outputs, folded from its events
# --------------------------------------------------------------------------


class Summary:
    """What rendering needs from one request's events (a small pure fold)."""

    def __init__(self, blobs: BlobStore, collect_media: bool = True) -> None:
        self.blobs = blobs
        # A streamed response encodes media as it goes and keeps none.
        self.collect_media = collect_media
        self.request_id = ""
        self.spec: RequestSpec | None = None
        self.created = 0
        self.text: list[str] = []
        self.token_ids: list[int] = []  # of the text chunks
        self.logprobs: list[TokenLogprob] = []  # of the text chunks
        self.audio: list[np.ndarray] = []
        self.audio_rate = 0  # from a blob's media type, when it says
        self.images: list[bytes] = []
        self.image_digests: list[str] = []  # response_format url: the files' blobs
        self.finished: dict[str, StageFinished] = {}
        self.terminal: TerminalEvent | None = None

    @property
    def options(self) -> dict[str, str]:
        return self.spec.options if self.spec is not None else {}

    def feed(self, ev: Event) -> None:
        # ``type(ev) is X`` inline: one exact-type test per branch, which
        # the checker narrows (events are final classes).
        if type(ev) is Chunk:
            opts = self.options
            if ev.modality == "text" and ev.stage == opts.get(Opt.TEXT_STAGE):
                self.text.append(ev.text)
                self.token_ids.extend(ev.token_ids)
                self.logprobs.extend(ev.logprobs)
            elif not self.collect_media:
                pass
            elif ev.modality == "audio" and ev.stage == opts.get(Opt.AUDIO_STAGE):
                arr = self.chunk_audio(ev)
                if arr is not None:
                    self.audio.append(arr)
            elif ev.modality == "image" and ev.stage == opts.get(Opt.IMAGE_STAGE):
                if opts.get(Opt.RESPONSE_FORMAT) == "url":
                    # answered by reference: the file is the chunk's blob
                    if ev.blob is not None:
                        self.image_digests.append(ev.blob.digest)
                    return
                img = self.chunk_image(ev)
                if img is not None:
                    self.images.append(img)
        elif type(ev) is StageFinished:
            self.finished[ev.stage] = ev
        elif type(ev) is Admitted or type(ev) is Rejected:
            self.request_id = ev.request_id
            self.spec = ev.spec
            self.created = _created(ev)
            if type(ev) is Rejected:
                self.terminal = ev
        elif type(ev) is Finished or type(ev) is Cancelled or type(ev) is Failed:
            self.terminal = ev

    def chunk_audio(self, ev: Chunk) -> np.ndarray | None:
        ref = ev.blob
        if ref is None:
            return None
        if ref.dtype == "bytes":  # raw 16-bit PCM bytes
            raw = np.frombuffer(self.blobs.get(ref), dtype="<i2")
            arr = raw.astype(np.float32) / 32768.0
        else:
            arr = as_mono_float(self.blobs.get_array(ref))
        if not self.audio_rate and "rate=" in ref.media_type:
            try:
                self.audio_rate = int(ref.media_type.split("rate=", 1)[1].split(";", 1)[0])
            except ValueError:
                pass
        return arr

    def chunk_image(self, ev: Chunk) -> bytes | None:
        ref = ev.blob
        if ref is None:
            return None
        if ref.dtype == "bytes":
            return self.blobs.get(ref)  # already encoded (image/png)
        from PIL import Image

        arr = np.asarray(self.blobs.get_array(ref))
        if arr.dtype != np.uint8:
            arr = (np.clip(arr, 0.0, 1.0) * 255.0).round().astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="PNG")
        return buf.getvalue()

    @property
    def sample_rate(self) -> int:
        return self.audio_rate or int(self.options.get(Opt.SAMPLE_RATE, "24000") or 24000)

    @property
    def audio_format(self) -> AudioFormat:
        return normalize_format(self.options.get(Opt.AUDIO_FORMAT, "wav") or "wav")

    def usage(self) -> tuple[int, int]:
        """(prompt tokens, output tokens) of the usage stage."""
        st = self.finished.get(self.options.get(Opt.USAGE_STAGE, ""))
        return (st.prompt_tokens, st.output_tokens) if st is not None else (0, 0)

    def finish_reason(self) -> str:
        opts = self.options
        for key in (Opt.TEXT_STAGE, Opt.AUDIO_STAGE, Opt.IMAGE_STAGE):
            st = self.finished.get(opts.get(key, ""))
            if st is not None:
                return st.finish_reason
        return "stop"

    def all_audio(self) -> np.ndarray:
        return np.concatenate(self.audio) if self.audio else np.zeros(0, dtype=np.float32)


def _token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def choice_logprobs(lps: Iterable[TokenLogprob]) -> ChoiceLogprobs:
    """OpenAI's ``choices[].logprobs`` for recorded per-token logprobs."""
    return ChoiceLogprobs(
        content=[
            TokenLogprobOut(
                token=lp.token,
                logprob=lp.logprob,
                bytes=_token_bytes(lp.token),
                top_logprobs=[
                    TopLogprob(token=t, logprob=v, bytes=_token_bytes(t)) for t, v in lp.top
                ],
            )
            for lp in lps
        ]
    )


def completion_logprobs(lps: Iterable[TokenLogprob], offset: int = 0) -> CompletionLogprobs:
    """OpenAI's legacy ``choices[].logprobs`` as vLLM's /v1/completions
    writes it: per token its text and logprob, ``{token: logprob}`` of the
    token itself then its recorded alternatives (most likely first; a text
    twice is one key, the later value, as vLLM's dict), and the offset of
    the token in the choice's text (``offset`` for the first: the text
    before this piece)."""
    out = CompletionLogprobs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])
    for lp in lps:
        out.text_offset.append(offset)
        offset += len(lp.token)
        out.tokens.append(lp.token)
        out.token_logprobs.append(lp.logprob)
        top = {lp.token: lp.logprob}
        for t, v in lp.top:
            top[t] = v
        out.top_logprobs.append(top)
    return out


def _json_head(status: int, rids: Sequence[str], extra: tuple[tuple[str, str], ...] = ()) -> Head:
    return Head(
        status, (("Content-Type", "application/json"), ("X-Request-Id", ",".join(rids)), *extra)
    )


# --------------------------------------------------------------------------
# Whole (non-streamed) bodies, possibly of a batch
# --------------------------------------------------------------------------


def _chat_body(members: list[Summary]) -> bytes:
    first = members[0]
    spec = first.spec
    assert spec is not None
    choices = []
    prompt = completion = 0
    for i, s in enumerate(members):
        text = "".join(s.text)
        audio: Any = UNSET
        if s.options.get(Opt.AUDIO_STAGE):
            data = encode_audio(s.all_audio(), s.sample_rate, s.audio_format)
            audio = AudioOut(
                id=f"audio-{s.request_id}",
                data=_b64(data),
                expires_at=s.created + AUDIO_EXPIRES_S,
                transcript=text,
            )
        has_text = bool(s.options.get(Opt.TEXT_STAGE))
        msg = AssistantMessage(content=text if has_text else None, audio=audio)
        lps = choice_logprobs(s.logprobs) if _flag(spec, Opt.LOGPROBS) else None
        choices.append(
            ChatChoice(index=i, message=msg, finish_reason=s.finish_reason(), logprobs=lps)
        )
        p, c = s.usage()
        # n choices of one prompt count the prompt once (as OpenAI does).
        prompt = p if _flag(spec, Opt.CHOICES) else prompt + p
        completion += c
    group = first.options.get(Opt.GROUP) or first.request_id
    body = ChatCompletion(
        id=f"chatcmpl-{group}",
        created=first.created,
        model=spec.model,
        choices=choices,
        usage=Usage(
            prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
        ),
        request_ids=[s.request_id for s in members],
    )
    return _enc.encode(body)


def _completion_body(members: list[Summary]) -> bytes:
    first = members[0]
    spec = first.spec
    assert spec is not None
    choices = []
    prompt = completion = 0
    for i, s in enumerate(members):
        echo = s.spec.prompt if s.spec is not None and _flag(spec, Opt.ECHO) else ""
        lps = completion_logprobs(s.logprobs) if _flag(spec, Opt.LOGPROBS) else None
        choices.append(
            CompletionChoice(
                index=i,
                text=echo + "".join(s.text),
                logprobs=lps,
                finish_reason=s.finish_reason(),
            )
        )
        p, c = s.usage()
        prompt = p if _flag(spec, Opt.CHOICES) else prompt + p
        completion += c
    body = Completion(
        id=f"cmpl-{first.options.get(Opt.GROUP) or first.request_id}",
        created=first.created,
        model=spec.model,
        choices=choices,
        usage=Usage(
            prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
        ),
        request_ids=[s.request_id for s in members],
    )
    return _enc.encode(body)


def _images_body(members: list[Summary]) -> bytes:
    opts = members[0].options
    if opts.get(Opt.RESPONSE_FORMAT) == "url":
        # The files are the chunks' blobs, served by GET /v1/files/{digest};
        # the base URL was recorded at admission (from the request's Host).
        base = opts.get(Opt.FILES_URL, "")
        data = [ImageData(url=base + d) for s in members for d in s.image_digests]
    else:
        data = [ImageData(b64_json=_b64(img)) for s in members for img in s.images]
    body = ImagesResponse(
        created=members[0].created,
        data=data,
        request_ids=[s.request_id for s in members],
        output_format=opts.get(Opt.OUTPUT_FORMAT) or UNSET,
    )
    return _enc.encode(body)


def _whole(members: list[Summary]) -> Rendered:
    """A complete response for finished (or refused/failed) members."""
    rids = [s.request_id for s in members]
    for s in members:
        if s.terminal is None:
            raise ValueError(
                f"request {s.request_id} has no terminal event: cannot render its response yet"
            )
        err = terminal_error(s.terminal)
        if err is not None:
            status, body, extra = err
            return Rendered(_json_head(status, rids, extra), body)
    spec = members[0].spec
    assert spec is not None
    if spec.api == API_CHAT:
        return Rendered(_json_head(200, rids), _chat_body(members))
    if spec.api == API_COMPLETIONS:
        return Rendered(_json_head(200, rids), _completion_body(members))
    if spec.api == API_IMAGES:
        return Rendered(_json_head(200, rids), _images_body(members))
    if spec.api == API_TRANSCRIPTION:
        return _transcription_whole(members[0])
    if spec.api == API_SPEECH:
        s = members[0]
        fmt = s.audio_format
        data = encode_audio(s.all_audio(), s.sample_rate, fmt)
        head = Head(200, (("Content-Type", MEDIA_TYPES[fmt]), ("X-Request-Id", s.request_id)))
        return Rendered(head, data)
    raise ValueError(f"request {rids[0]}: no renderer for api {spec.api!r}")


# --------------------------------------------------------------------------
# Streams (one request)
# --------------------------------------------------------------------------


class _StreamTail:
    """What a chat and a completions stream share: their id, model, group
    index and flags, and how they end: after the finish chunk, the
    ``include_usage`` chunk (no choices, the totals) and ``[DONE]`` (a
    member of an n > 1 group leaves both to the group); a failed or
    cancelled request's error event and ``[DONE]``."""

    #: the stream's chunk object (``chat.completion.chunk``, ``text_completion``)
    _object: type[ChatCompletionChunk] | type[Completion]
    _id_prefix: str

    def __init__(self, s: Summary, member: bool) -> None:
        self.s = s
        spec = s.spec
        assert spec is not None
        #: one choice of an n > 1 group's stream: its index, and no usage
        #: chunk or ``[DONE]`` of its own
        self.member = member
        self.index = int(spec.options.get(Opt.GROUP_INDEX, "0") or 0) if member else 0
        group = spec.options.get(Opt.GROUP) if member else None
        self.id = f"{self._id_prefix}-{group or s.request_id}"
        self.model = spec.model
        self.usage = _flag(spec, Opt.INCLUDE_USAGE)
        self.logprobs = _flag(spec, Opt.LOGPROBS)
        self.text_stage = spec.options.get(Opt.TEXT_STAGE, "")

    def _closing(self, out: list[bytes]) -> list[bytes]:
        if self.member:
            return out
        if self.usage:
            out.append(self.usage_chunk(*self.s.usage(), self.s.created))
        out.append(SSE_DONE)
        return out

    @staticmethod
    def _ended(ev: Event) -> list[bytes]:
        if type(ev) is Failed or type(ev) is Cancelled:
            err = terminal_error(ev)
            assert err is not None
            return [b"data: " + err[1] + b"\n\n", SSE_DONE]
        return []

    def usage_chunk(self, p: int, c: int, created: int) -> bytes:
        """The last chunk of an ``include_usage`` stream: no choices, the totals."""
        usage = Usage(prompt_tokens=p, completion_tokens=c, total_tokens=p + c)
        return _sse(
            self._object(id=self.id, created=created, model=self.model, choices=[], usage=usage)
        )


class _ChatStream(_StreamTail):
    """``chat.completion.chunk`` SSE: a role chunk at admission, content and
    audio deltas as chunks arrive, a finish chunk, an optional usage chunk,
    ``[DONE]``.  A request that fails or is cancelled mid-stream ends with
    an ``{"error": ...}`` event and ``[DONE]``."""

    _object = ChatCompletionChunk
    _id_prefix = "chatcmpl"

    def __init__(self, s: Summary, member: bool = False) -> None:
        super().__init__(s, member)
        spec = s.spec
        assert spec is not None
        self.audio_stage = spec.options.get(Opt.AUDIO_STAGE, "")
        self.audio_id = f"audio-{s.request_id}"
        self.encoder: StreamEncoder | None = None
        if self.audio_stage:
            self.encoder = StreamEncoder(s.audio_format, s.sample_rate)

    def _chunk(
        self, delta: Delta, finish: str | None = None, logprobs: ChoiceLogprobs | None = None
    ) -> bytes:
        return _sse(
            ChatCompletionChunk(
                id=self.id,
                created=self.s.created,
                model=self.model,
                choices=[
                    ChunkChoice(
                        index=self.index, delta=delta, finish_reason=finish, logprobs=logprobs
                    )
                ],
                usage=None if self.usage else UNSET,
            )
        )

    def feed(self, ev: Event) -> list[bytes]:
        if type(ev) is Chunk:
            if ev.stage == self.text_stage and ev.modality == "text":
                if self.logprobs and ev.logprobs:
                    return [self._chunk(Delta(content=ev.text), None, choice_logprobs(ev.logprobs))]
                if not ev.text:
                    return []
                return [self._chunk(Delta(content=ev.text))]
            if ev.stage == self.audio_stage and ev.modality == "audio" and self.encoder is not None:
                arr = self.s.chunk_audio(ev)
                data = self.encoder.write(arr) if arr is not None else b""
                return (
                    [self._chunk(Delta(audio=AudioOut(id=self.audio_id, data=_b64(data))))]
                    if data
                    else []
                )
            return []
        if type(ev) is Admitted:
            return [self._chunk(Delta(role="assistant", content=""))]
        if type(ev) is Finished:
            out = []
            if self.encoder is not None:
                tail = self.encoder.finish()
                audio = AudioOut(
                    id=self.audio_id,
                    data=_b64(tail),
                    expires_at=self.s.created + AUDIO_EXPIRES_S,
                    transcript="".join(self.s.text),
                )
                out.append(self._chunk(Delta(audio=audio)))
            out.append(self._chunk(Delta(), self.s.finish_reason()))
            return self._closing(out)
        return self._ended(ev)


class _CompletionStream(_StreamTail):
    """``text_completion`` SSE (vLLM's /v1/completions): a chunk per text
    chunk (the echoed prompt before the first), a finish chunk, an
    optional usage chunk, ``[DONE]``; errors as on chat (``_StreamTail``)."""

    _object = Completion
    _id_prefix = "cmpl"

    def __init__(self, s: Summary, member: bool = False) -> None:
        super().__init__(s, member)
        spec = s.spec
        assert spec is not None
        #: the prompt, until it went out before the first text
        self.echo = spec.prompt if _flag(spec, Opt.ECHO) else ""
        #: length of the text sent so far (logprobs' text_offset)
        self.sent = 0

    def _chunk(
        self, text: str, finish: str | None = None, logprobs: CompletionLogprobs | None = None
    ) -> bytes:
        return _sse(
            Completion(
                id=self.id,
                created=self.s.created,
                model=self.model,
                choices=[
                    CompletionChoice(
                        index=self.index, text=text, logprobs=logprobs, finish_reason=finish
                    )
                ],
                usage=None if self.usage else UNSET,
            )
        )

    def _text(self, text: str) -> str:
        text, self.echo = self.echo + text, ""
        return text

    def feed(self, ev: Event) -> list[bytes]:
        if type(ev) is Chunk:
            if ev.stage != self.text_stage or ev.modality != "text":
                return []
            if self.logprobs and ev.logprobs:
                lps = completion_logprobs(ev.logprobs, self.sent)
                self.sent += sum(len(lp.token) for lp in ev.logprobs)
                return [self._chunk(self._text(ev.text), None, lps)]
            if not ev.text:
                return []
            return [self._chunk(self._text(ev.text))]
        if type(ev) is Finished:
            out = [self._chunk(self._text(""), self.s.finish_reason())]
            return self._closing(out)
        return self._ended(ev)


class _ChatGroupStream:
    """The one SSE response of an n > 1 chat group (``Opt.GROUP_STREAM``):
    its members' events, fed in log order, render as one
    ``chat.completion.chunk`` stream whose choices carry the members'
    indexes (each member's role, content and finish chunks where its
    events stand in the log); once every member finished, the usage chunk
    (the prompt counted once, completions summed) and ``[DONE]``.  A
    member that fails or is cancelled ends the stream with its error."""

    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs
        self.members: dict[str, tuple[Summary, _ChatStream | _CompletionStream]] = {}
        self.size = 0
        self.ended = 0
        self.head: Head | None = None
        self.done = False
        self.first: Summary | None = None

    def feed(self, ev: Event) -> list[bytes]:
        if self.done or not isinstance(ev, RequestEvent):
            return []
        rid = ev.request_id
        if type(ev) is Admitted:
            s = Summary(self.blobs, collect_media=False)
            s.feed(ev)
            stream: _ChatStream | _CompletionStream = (
                _CompletionStream(s, member=True)
                if ev.spec.api == API_COMPLETIONS
                else _ChatStream(s, member=True)
            )
            self.members[rid] = (s, stream)
            if self.first is None:
                self.first = s
                self.size = int(ev.spec.options.get(Opt.GROUP_SIZE, "1") or 1)
                group = ev.spec.options.get(Opt.GROUP, rid)
                self.head = Head(200, (*_SSE_HEADERS, ("X-Request-Id", group)), streamed=True)
            return stream.feed(ev)
        member = self.members.get(rid)
        if member is None:
            return []
        s, stream = member
        s.feed(ev)
        out = stream.feed(ev)
        if type(ev) is Failed or type(ev) is Cancelled:
            self.done = True
            return out
        if type(ev) is Finished:
            self.ended += 1
            if self.ended == self.size:
                self.done = True
                if stream.usage and self.first is not None:
                    p = self.first.usage()[0]
                    c = sum(m[0].usage()[1] for m in self.members.values())
                    out.append(stream.usage_chunk(p, c, self.first.created))
                out.append(SSE_DONE)
        return out


class GroupStreamRenderer:
    """``StreamRenderer``'s counterpart for an n > 1 chat stream: ``feed``
    the events of every member, in log order."""

    def __init__(self, blobs: BlobStore) -> None:
        self._g = _ChatGroupStream(blobs)

    @property
    def head(self) -> Head | None:
        return self._g.head

    @property
    def done(self) -> bool:
        return self._g.done

    def feed(self, ev: Event) -> list[bytes]:
        return self._g.feed(ev)


def _group_streamed(by_rid: dict[str, list[Event]]) -> bool:
    first = next(iter(by_rid.values()))[0]
    return isinstance(first, Admitted) and _flag(first.spec, Opt.GROUP_STREAM)


def _in_log_order(by_rid: dict[str, list[Event]]) -> list[Event]:
    return sorted((ev for evs in by_rid.values() for ev in evs), key=lambda ev: ev.pos)


class _SpeechStream:
    """``stream_format="audio"``: the encoded bytes as they are produced;
    ``"sse"``: ``speech.audio.delta`` events with base64 bytes of the same
    encoded stream, then ``speech.audio.done`` with usage."""

    def __init__(self, s: Summary) -> None:
        self.s = s
        spec = s.spec
        assert spec is not None
        self.sse = spec.options.get(Opt.STREAM_FORMAT) == "sse"
        self.audio_stage = spec.options.get(Opt.AUDIO_STAGE, "")
        self.encoder = StreamEncoder(s.audio_format, s.sample_rate)
        self.aborted = False

    def _out(self, data: bytes) -> list[bytes]:
        if not data:
            return []
        return [_sse(SpeechAudioDelta(audio=_b64(data)))] if self.sse else [data]

    def feed(self, ev: Event) -> list[bytes]:
        if type(ev) is Chunk:
            if ev.stage == self.audio_stage and ev.modality == "audio":
                arr = self.s.chunk_audio(ev)
                return self._out(self.encoder.write(arr)) if arr is not None else []
            return []
        if type(ev) is Finished:
            out = self._out(self.encoder.finish())
            if self.sse:
                p, c = self.s.usage()
                out.append(
                    _sse(
                        SpeechAudioDone(
                            usage=SpeechUsage(input_tokens=p, output_tokens=c, total_tokens=p + c)
                        )
                    )
                )
            return out
        if type(ev) is Failed or type(ev) is Cancelled:
            if self.sse:
                err = terminal_error(ev)
                assert err is not None
                return [b'data: {"type":"error",' + err[1][1:] + b"\n\n"]
            self.aborted = True  # a truncated file must not look complete
            return []
        return []


# --------------------------------------------------------------------------
# Transcriptions
# --------------------------------------------------------------------------


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


def _transcription_usage(s: Summary) -> TranscriptionUsage:
    p, c = s.usage()
    return TranscriptionUsage(input_tokens=p, output_tokens=c, total_tokens=p + c)


def _clip_seconds(spec: RequestSpec) -> float:
    """The transcribed clip's length, from the decoded samples the spec
    references (their count over their rate)."""
    for m in spec.messages:
        for part in m.media:
            if part.kind == "audio" and part.rate and part.blob.shape:
                return part.blob.shape[0] / part.rate
    return 0.0


def _transcription_whole(s: Summary) -> Rendered:
    spec = s.spec
    assert spec is not None
    text = "".join(s.text)
    rid = s.request_id
    fmt = spec.options.get(Opt.RESPONSE_FORMAT, "json")
    if fmt == "text":
        head = Head(200, (("Content-Type", "text/plain; charset=utf-8"), ("X-Request-Id", rid)))
        return Rendered(head, text.encode())
    if fmt == "verbose_json":
        seconds = _clip_seconds(spec)
        segment = TranscriptionSegment(
            id=0,
            seek=0,
            start=0.0,
            end=seconds,
            text=text,
            tokens=s.token_ids,
            temperature=float(spec.options.get(Opt.TEMPERATURE, "0") or 0),
        )
        body: Any = TranscriptionVerbose(
            language=spec.options.get(Opt.LANGUAGE, "") or "unknown",
            duration=seconds,
            text=text,
            segments=[segment],
            usage=DurationUsage(seconds=seconds),
            request_ids=[rid],
        )
    else:
        body = Transcription(text=text, usage=_transcription_usage(s), request_ids=[rid])
    return Rendered(_json_head(200, [rid]), _enc.encode(body))


class _TranscriptionStream:
    """``stream=true`` transcriptions: a ``transcript.text.delta`` event per
    text chunk, then ``transcript.text.done`` with the whole text and usage
    (OpenAI's streamed transcription; no ``[DONE]``).  A request that fails
    or is cancelled mid-stream ends with ``{"type": "error", "error": ...}``."""

    def __init__(self, s: Summary) -> None:
        self.s = s
        spec = s.spec
        assert spec is not None
        self.text_stage = spec.options.get(Opt.TEXT_STAGE, "")

    def feed(self, ev: Event) -> list[bytes]:
        if type(ev) is Chunk:
            if ev.stage == self.text_stage and ev.modality == "text" and ev.text:
                return [_sse(TranscriptTextDelta(delta=ev.text))]
            return []
        if type(ev) is Finished:
            done = TranscriptTextDone(text="".join(self.s.text), usage=_transcription_usage(self.s))
            return [_sse(done)]
        if type(ev) is Failed or type(ev) is Cancelled:
            err = terminal_error(ev)
            assert err is not None
            return [b'data: {"type":"error",' + err[1][1:] + b"\n\n"]
        return []


def event_ids(pos: int, n: int) -> list[str]:
    """The ``id:`` of the ``n`` SSE events rendered from the log event at
    ``pos``: the position itself for the first, ``pos.1``, ``pos.2``... for
    the others (only a terminal event renders several), so that every SSE
    event a client may have last received names one point to resume after.
    ``data: [DONE]`` carries none: resuming after the event before it sends
    it again."""
    return [str(pos) if k == 0 else f"{pos}.{k}" for k in range(n)]


def parse_event_id(value: str) -> tuple[int, int] | None:
    """``"57"`` -> (57, 0), ``"57.2"`` -> (57, 2); None when not an id."""
    head, dot, sub = value.strip().partition(".")
    if not head.isdigit() or (dot and not sub.isdigit()):
        return None
    return int(head), int(sub) if dot else 0


def _with_id(event_id: str, piece: bytes) -> bytes:
    return b"id: " + event_id.encode("ascii") + b"\n" + piece


class StreamRenderer:
    """Incremental rendering of one request: ``feed`` each of its events in
    log order; it returns the body bytes to send now.  ``head`` is set once
    known: at admission for a streamed response, at the terminal event for
    a whole one (whose body is then the one piece returned).  ``done`` after
    the terminal event; ``aborted`` when the connection must be cut.

    SSE responses (chat, speech ``sse``) rendered by version 2 or later
    carry ``id:`` on each event (``event_ids``); ``feed_ids`` returns each
    piece with its id (None for ``[DONE]``, raw audio and whole bodies)."""

    def __init__(self, blobs: BlobStore) -> None:
        self.summary = Summary(blobs)
        self.head: Head | None = None
        self.done = False
        self.aborted = False
        #: The response is SSE with ``id:`` fields (known at admission).
        self.ids = False
        self._stream: (
            _ChatStream | _CompletionStream | _SpeechStream | _TranscriptionStream | None
        ) = None

    def feed(self, ev: Event) -> list[bytes]:
        return [piece for _, piece in self.feed_ids(ev)]

    def feed_ids(self, ev: Event) -> list[tuple[str | None, bytes]]:
        pieces = self._feed(ev)
        if not self.ids or not pieces:
            return [(None, p) for p in pieces]
        framed = [p for p in pieces if p != SSE_DONE]
        ids = iter(event_ids(ev.pos, len(framed)))
        out: list[tuple[str | None, bytes]] = []
        for p in pieces:
            if p == SSE_DONE:
                out.append((None, p))
            else:
                i = next(ids)
                out.append((i, _with_id(i, p)))
        return out

    def _feed(self, ev: Event) -> list[bytes]:
        if self.done or not isinstance(ev, RequestEvent):
            return []
        s = self.summary
        if type(ev) is Admitted and _flag(ev.spec, Opt.STREAM):
            s.collect_media = False
            s.feed(ev)
            self._open_stream(ev)
        else:
            s.feed(ev)
        out = self._stream.feed(ev) if self._stream is not None else []
        if s.terminal is not None:
            self.done = True
            if self._stream is None:
                whole = _whole([s])
                self.head = whole.head
                out = [whole.body]
            elif isinstance(self._stream, _SpeechStream):
                self.aborted = self._stream.aborted
        return out

    def _open_stream(self, ev: Admitted) -> None:
        s = self.summary
        rid = ev.request_id
        version = ev.spec.options.get(Opt.RENDER, "1")
        if version == "1":
            self.ids = False
        elif (ev.spec.api == API_CHAT and version != "2") or ev.spec.api == API_COMPLETIONS:
            self.ids = _flag(ev.spec, Opt.SSE_IDS)
        else:
            self.ids = ev.spec.api in (API_CHAT, API_TRANSCRIPTION) or (
                ev.spec.options.get(Opt.STREAM_FORMAT) == "sse"
            )
        if ev.spec.api == API_CHAT:
            self._stream = _ChatStream(s)
            self.head = Head(200, (*_SSE_HEADERS, ("X-Request-Id", rid)), streamed=True)
        elif ev.spec.api == API_COMPLETIONS:
            self._stream = _CompletionStream(s)
            self.head = Head(200, (*_SSE_HEADERS, ("X-Request-Id", rid)), streamed=True)
        elif ev.spec.api == API_SPEECH:
            stream = self._stream = _SpeechStream(s)
            ctype = "text/event-stream" if stream.sse else MEDIA_TYPES[s.audio_format]
            extra = (("Cache-Control", "no-cache"),) if stream.sse else ()
            self.head = Head(
                200, (("Content-Type", ctype), *extra, ("X-Request-Id", rid)), streamed=True
            )
        elif ev.spec.api == API_TRANSCRIPTION:
            self._stream = _TranscriptionStream(s)
            self.head = Head(200, (*_SSE_HEADERS, ("X-Request-Id", rid)), streamed=True)
        else:
            raise ValueError(f"request {rid}: api {ev.spec.api!r} has no streamed form")


# --------------------------------------------------------------------------
# Public pure functions
# --------------------------------------------------------------------------


def _split(events: Iterable[Event]) -> dict[str, list[Event]]:
    by_rid: dict[str, list[Event]] = {}
    for ev in events:
        if isinstance(ev, RequestEvent):
            by_rid.setdefault(ev.request_id, []).append(ev)
    if not by_rid:
        raise ValueError("no request events to render")
    return by_rid


def _group_refused(by_rid: dict[str, list[Event]]) -> bool:
    return any(isinstance(evs[0], Rejected) for evs in by_rid.values())


def _batched(by_rid: dict[str, list[Event]]) -> bool:
    """One member of a batch (whose response needs all of them)."""
    first = next(iter(by_rid.values()))[0]
    if not isinstance(first, (Admitted, Rejected)):
        return False
    return int(first.spec.options.get(Opt.GROUP_SIZE, "1") or 1) > 1


def _group_order(by_rid: dict[str, list[Event]], blobs: BlobStore) -> list[Summary]:
    members = []
    groups = set()
    for rid, evs in by_rid.items():
        s = Summary(blobs)
        for ev in evs:
            s.feed(ev)
        if s.spec is None:
            raise ValueError(f"request {rid}: its Admitted/Rejected event is missing")
        groups.add(s.options.get(Opt.GROUP) or s.request_id)
        members.append(s)
    if len(groups) > 1:
        raise ValueError(
            f"events of {len(groups)} unrelated requests given; render one response at a time"
        )
    members.sort(key=lambda s: int(s.options.get(Opt.GROUP_INDEX, "0") or 0))
    # A member refused at admission ended the batch there: its siblings
    # already admitted were cancelled, later ones never submitted, and the
    # client was sent the refusal alone.
    for s in members:
        if isinstance(s.terminal, Rejected):
            return [s]
    size = int(members[0].options.get(Opt.GROUP_SIZE, "1") or 1)
    if len(members) != size:
        raise ValueError(f"batched response needs all {size} members' events, got {len(members)}")
    return members


def render_response(events: Iterable[Event], blobs: BlobStore) -> Rendered:
    """The complete response (status, headers, body) the HTTP API sent for
    the request(s) these events belong to.  The events must reach each
    request's terminal event."""
    by_rid = _split(events)
    if _group_streamed(by_rid):
        g = _ChatGroupStream(blobs)
        body = b"".join(piece for ev in _in_log_order(by_rid) for piece in g.feed(ev))
        if _group_refused(by_rid):
            return _whole(_group_order(by_rid, blobs))
        if not g.done or g.head is None:
            raise ValueError("the group's stream has not ended: cannot render its response yet")
        return Rendered(g.head, body)
    if len(by_rid) > 1 or _batched(by_rid):
        return _whole(_group_order(by_rid, blobs))
    ((rid, evs),) = by_rid.items()
    r = StreamRenderer(blobs)
    body = b"".join(piece for ev in evs for piece in r.feed(ev))
    if not r.done or r.head is None:
        raise ValueError(f"request {rid} has no terminal event: cannot render its response yet")
    return Rendered(r.head, body, r.aborted)


def render_stream(events: Iterable[Event], blobs: BlobStore) -> Iterator[bytes]:
    """The body as the pieces the server wrote, in order (for a streamed
    response, one piece per SSE event or encoded audio piece; a whole
    response is one piece).  Stops early if the events stop early."""
    by_rid = _split(events)
    if _group_streamed(by_rid) and not _group_refused(by_rid):
        g = _ChatGroupStream(blobs)
        for ev in _in_log_order(by_rid):
            yield from g.feed(ev)
        return
    if len(by_rid) > 1 or _batched(by_rid):
        yield _whole(_group_order(by_rid, blobs)).body
        return
    (evs,) = by_rid.values()
    r = StreamRenderer(blobs)
    for ev in evs:
        yield from r.feed(ev)


# --------------------------------------------------------------------------
# Events and states as JSON
# --------------------------------------------------------------------------


def event_sse(ev: Event) -> bytes:
    """One event of ``/v1/requests/{id}/events``: ``id`` is its log
    position (what Last-Event-ID resumes after), ``event`` its type tag,
    ``data`` the event as msgspec JSON (a tagged array; decode it with
    ``msgspec.json.decode(data, type=omnix.events.types.Event)``)."""
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (ev.pos, event_tag(ev).encode(), _enc.encode(ev))


def event_object_sse(ev: Event) -> bytes:
    """Like ``event_sse`` with ``data`` as a JSON object (``?format=object``)."""
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (
        ev.pos,
        event_tag(ev).encode(),
        _enc.encode(as_object(ev)),
    )


def as_object(value: Any) -> Any:
    """A Struct (array-like or not) as nested dicts with field names, tagged
    structs with their ``type``; other values as msgspec would encode them."""
    if isinstance(value, msgspec.Struct):
        cfg = value.__struct_config__
        out: dict[str, Any] = {}
        if cfg.tag is not None:
            out[cfg.tag_field or "type"] = cfg.tag
        for name in value.__struct_fields__:
            out[name] = as_object(getattr(value, name))
        return out
    if isinstance(value, (list, tuple)):
        return [as_object(v) for v in value]
    if isinstance(value, dict):
        return {k: as_object(v) for k, v in value.items()}
    return value


def state_json(rs: RequestState) -> bytes:
    """GET /v1/requests/{id}: the folded state as a JSON object."""
    return _enc.encode(as_object(rs))
