"""One request's outputs, folded from its events, as rendering needs them.

Owns ``RequestSummary``: a small pure fold of one request's events (its spec and
typed response options, ``created``, the answer's text, token ids and
logprobs, audio and images from the chunks' blobs, the stages' ends, the
terminal event), and which stages' chunks are the answer (from the
response options: ``text_stage``, ``audio_stage``, ``image_stage``).

Does not own any API's bytes (each room's ``render.py``) nor reading the
log.
"""

from __future__ import annotations

import io
from typing import assert_never

import numpy as np

from omnix.events.blobs import BlobStore
from omnix.events.options import (
    DEFAULT_SAMPLE_RATE,
    AudioFormat,
    ChatOptions,
    CompletionOptions,
    DuplexOptions,
    ImageOptions,
    RealtimeOptions,
    ResponseOptions,
    SpeechOptions,
    TranscriptionOptions,
    VideoOptions,
)
from omnix.events.types import (
    Admitted,
    BlobRef,
    Cancelled,
    CancelRequested,
    Chunk,
    DeadlineExpired,
    Event,
    Failed,
    Finished,
    InputAppended,
    Progress,
    Rejected,
    Released,
    RequestSpec,
    Routed,
    Scaled,
    SessionChanged,
    StageFailed,
    StageFinished,
    StageStarted,
    TerminalEvent,
    TokenLogprob,
    ToolCallDelta,
    WorkerJoined,
    WorkerLost,
)
from omnix.http.common.audio import as_mono_float


class RequestSummary:
    """What rendering needs from one request's events (a small pure fold)."""

    def __init__(self, blobs: BlobStore, collect_media: bool = True) -> None:
        self.blobs = blobs
        # A streamed response encodes media as it goes and keeps none.
        self.collect_media = collect_media
        self.request_id = ""
        self.spec: RequestSpec | None = None
        self.response: ResponseOptions | None = None
        self.created = 0
        self.text_stage = ""
        self.audio_stage = ""
        self.image_stage = ""
        self.image_urls = False  # images answered by reference (their blobs' digests)
        self.text: list[str] = []
        self.token_ids: list[int] = []  # of the text chunks
        self.logprobs: list[TokenLogprob] = []  # of the text chunks
        self.reasoning: list[str] = []  # of the text chunks (a reasoning parser's)
        self.tool_calls: list[ToolCallDelta] = []  # of the text chunks (a tool-call parser's)
        self.audio: list[np.ndarray] = []
        self.audio_rate = 0  # from a blob's media type, when it says
        self.images: list[bytes] = []
        self.image_digests: list[str] = []  # response_format url: the files' blobs
        self.video_stage = ""
        self.video: BlobRef | None = None  # the encoded video file's blob
        #: the media stage's last progress: (step, total), (0, 0) before any
        self.progress: tuple[int, int] = (0, 0)
        self.finished: dict[str, StageFinished] = {}
        self.terminal: TerminalEvent | None = None

    def feed(self, ev: Event) -> None:
        # Chunks are most of a request's events: one exact-type test first
        # (a ``match`` class pattern is an isinstance check, ~150 ns against
        # a Struct class; see omnix/events/types.py).
        if type(ev) is Chunk:
            self.chunk(ev)
            return
        match ev:
            case StageFinished():
                self.finished[ev.stage] = ev
            case Admitted():
                self.admitted(ev)
            case Rejected():
                self.admitted(ev)
                self.terminal = ev
            case Finished() | Cancelled() | Failed():
                self.terminal = ev
            case Progress():
                self.progressed(ev)
            case (
                Chunk()
                | Routed()
                | StageStarted()
                | StageFailed()
                | CancelRequested()
                | DeadlineExpired()
                | WorkerJoined()
                | WorkerLost()
                | Released()
                | SessionChanged()
                | Scaled()
                | InputAppended()
            ):
                pass
            case _:
                assert_never(ev)

    def admitted(self, ev: Admitted | Rejected) -> None:
        self.request_id = ev.request_id
        self.spec = ev.spec
        self.created = ev.ts_ns // 1_000_000_000
        opts = self.response = ev.spec.response
        match opts:
            case ChatOptions() | RealtimeOptions():
                self.text_stage, self.audio_stage = opts.text_stage, opts.audio_stage
            case CompletionOptions() | TranscriptionOptions():
                self.text_stage = opts.text_stage
            case SpeechOptions() | DuplexOptions():
                self.audio_stage = opts.audio_stage
            case ImageOptions():
                self.image_stage = opts.image_stage
                self.image_urls = opts.response_format == "url"
            case VideoOptions():
                self.video_stage = opts.video_stage
            case None:
                pass
            case _:
                assert_never(opts)

    def progressed(self, ev: Progress) -> None:
        """A step of the stage whose output is the answer's image or video."""
        if ev.stage in (self.image_stage, self.video_stage):
            self.progress = (ev.step, ev.total)

    def chunk(self, ev: Chunk) -> None:
        if ev.modality == "text" and ev.stage == self.text_stage:
            self.text.append(ev.text)
            self.token_ids.extend(ev.token_ids)
            self.logprobs.extend(ev.logprobs)
            if ev.reasoning:
                self.reasoning.append(ev.reasoning)
            if ev.tool_calls:
                self.tool_calls.extend(ev.tool_calls)
        elif ev.modality == "video" and ev.stage == self.video_stage:
            self.video = ev.blob  # kept by reference: the file is served as is
        elif not self.collect_media:
            pass
        elif ev.modality == "audio" and ev.stage == self.audio_stage:
            arr = self.chunk_audio(ev)
            if arr is not None:
                self.audio.append(arr)
        elif ev.modality == "image" and ev.stage == self.image_stage:
            if self.image_urls:
                # answered by reference: the file is the chunk's blob
                if ev.blob is not None:
                    self.image_digests.append(ev.blob.digest)
                return
            img = self.chunk_image(ev)
            if img is not None:
                self.images.append(img)

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
        if self.audio_rate:
            return self.audio_rate
        opts = self.response
        if isinstance(opts, (ChatOptions, SpeechOptions, RealtimeOptions)):
            return opts.sample_rate
        return DEFAULT_SAMPLE_RATE

    @property
    def audio_format(self) -> AudioFormat:
        opts = self.response
        return opts.audio_format if isinstance(opts, (ChatOptions, SpeechOptions)) else "wav"

    def usage(self) -> tuple[int, int]:
        """(prompt tokens, output tokens) of the usage stage."""
        stage = self.response.usage_stage if self.response is not None else ""
        st = self.finished.get(stage)
        return (st.prompt_tokens, st.output_tokens) if st is not None else (0, 0)

    def finish_reason(self) -> str:
        """The first of the output stages' finish reasons; ``tool_calls``
        when the answer stopped having called tools (as vLLM says it)."""
        if self.tool_calls:
            st = self.finished.get(self.text_stage)
            if st is not None and st.finish_reason == "stop":
                return "tool_calls"
        for stage in (self.text_stage, self.audio_stage, self.image_stage):
            st = self.finished.get(stage)
            if st is not None:
                return st.finish_reason
        return "stop"

    def all_audio(self) -> np.ndarray:
        return np.concatenate(self.audio) if self.audio else np.zeros(0, dtype=np.float32)
