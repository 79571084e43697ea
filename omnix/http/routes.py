"""The HTTP API's handlers: read a body, submit, stream the log back.

Owns: one aiohttp handler per route (``Routes``); the rules every
generation route applies before reading its body (``_generation``: a JSON
route takes ``Content-Type: application/json`` only, 415 otherwise; a
valid ``X-Request-Id`` names the request); the submission of a planned
request through ``Omni.submit`` (after validating every member, checking
the batch size and that no id is in use, so a bad request appends
nothing; a group is admitted whole or refused whole); and the live loop of
a response: tail the
request's events and write what ``render.StreamRenderer`` makes of each.
A client that goes away mid-response cancels its request
(``Omni.cancel(rid, "disconnect")``): aiohttp cancels the handler when the
connection drops (``handler_cancellation=True``) or a write fails.  A
streamed response's request gets ``resume_grace_s`` first: if no reader
of its stream (``GET /v1/requests/{id}/stream``, ``resume.py``) is
attached when that time is up, it is cancelled.

Does not own routing between stages (the orchestrator), the mapping of
bodies to specs (``adapt.py``), any byte of a response body
(``render.py``) or the server's lifecycle (``app.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from typing import Any, Literal, TypeVar

import msgspec
from aiohttp import web
from multidict import CIMultiDict

from omnix import __version__
from omnix.api import Omni, ProfilingOff, ShuttingDown, new_request_id, new_seed
from omnix.events.blobs import BlobMissing, array_ref
from omnix.events.disklog import DiskLog
from omnix.events.log import LogClosed
from omnix.events.types import (
    ChatMessage,
    MediaKind,
    MediaPart,
    Rejected,
    RejectReason,
    RequestEvent,
)
from omnix.http import adapt, transcribe
from omnix.http.errors import ApiError, Handler, from_decode_error, from_request_error
from omnix.http.media import MediaDecoder
from omnix.http.openapi import OpenApi
from omnix.http.options import HttpOptions
from omnix.http.render import (
    API_COMPLETIONS,
    API_IMAGES,
    RETRY_AFTER,
    GroupStreamRenderer,
    Head,
    Opt,
    Rendered,
    StreamRenderer,
    event_object_sse,
    event_sse,
    render_response,
    state_json,
)
from omnix.http.resume import ResumePoint, resume_point
from omnix.http.schemas import (
    UNSUPPORTED_CHAT_FIELDS,
    CancelResult,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    Health,
    ImageRequest,
    MediaContentPart,
    Message,
    ModelCard,
    ModelList,
    ProfileRequest,
    Profiles,
    Readiness,
    SpeechRequest,
    TextPart,
    TokenizeRequest,
    TokenizeResponse,
    Version,
    WorkerProfile,
)
from omnix.http.tokens import PromptTokens
from omnix.pipelines.plan import RequestError
from omnix.telemetry import Telemetry, metrics_handler
from omnix.trace import export_trace
from omnix.transport.work import OPT_PROMPT_TOKEN_IDS, OPT_RAW_PROMPT

log = logging.getLogger("omnix.http")

T = TypeVar("T")

#: A streamed response writes at least this often (bytes) within a burst.
FLUSH_BYTES = 64 * 1024
_enc = msgspec.json.Encoder()


def _whole_floats_to_int(obj: Any) -> Any:
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    if isinstance(obj, dict):
        return {k: _whole_floats_to_int(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_whole_floats_to_int(v) for v in obj]
    return obj


class _BodyDecoder:
    """A request body's decoder that reads a whole float (``2.0``) where an
    integer is expected as that integer: JSON Schema (so the published
    document) counts it as one, as pydantic-based servers (vLLM) do, while
    msgspec refuses it.  Only a body msgspec refused pays the second pass."""

    def __init__(self, typ: type) -> None:
        self.typ = typ
        self._decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(typ)

    def decode(self, raw: bytes) -> Any:
        try:
            return self._decoder.decode(raw)
        except msgspec.ValidationError as exc:
            if "got `float`" not in str(exc):
                raise
        return msgspec.convert(_whole_floats_to_int(msgspec.json.decode(raw)), self.typ)


# Any: ``_body`` reads each as the decoder of its own body type.
_DECODERS: dict[type, Any] = {
    t: _BodyDecoder(t)
    for t in (
        ChatCompletionRequest,
        CompletionRequest,
        SpeechRequest,
        ImageRequest,
        ProfileRequest,
        TokenizeRequest,
        DetokenizeRequest,
    )
}


#: A client's X-Request-Id: it becomes a request id (and a URL path
#: segment of /v1/requests/{id}), batch members getting a "-i" suffix.
_CLIENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$")
#: A log position, as ``/v1/requests/{id}/events`` writes its ``id:``,
#: and an SSE event id of a response (``render.event_ids``).
_POSITION = re.compile(r"^[0-9]{1,18}$")
#: A blob's digest as ``GET /v1/files/{digest}`` takes it (BlobRef.digest:
#: blake2b-128, lowercase hex); nothing else reaches the blob store.
_DIGEST = re.compile(r"^[0-9a-f]{32}$")
#: A Host header usable in an absolute URL: a name or IPv4 address, or a
#: bracketed IPv6 address, and an optional port.
_HOST = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?$")


def _image_type(data: bytes) -> str | None:
    """The media type of an image file omnix serves (PNG, JPEG, WebP), by
    its magic bytes; None for any other blob (decoded media, audio...)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _files_url(request: web.Request) -> str:
    """The absolute URL of ``GET /v1/files/`` as the client reached this
    server (its Host header), "" when the Host is not usable."""
    host = request.host
    if not host or not _HOST.match(host):
        return ""
    return f"{request.scheme}://{host}/v1/files/"


_EVENT_ID = re.compile(r"^[0-9]{1,18}([.][0-9]{1,4})?$")


def _last_event_id(request: web.Request, form: re.Pattern[str], what: str) -> str | None:
    """The ``Last-Event-ID`` header, else the ``last_event_id`` query
    parameter; None when neither is given; 400 when one given is not of
    ``form`` (an empty one included)."""
    for name, value in (
        ("Last-Event-ID", request.headers.get("Last-Event-ID")),
        ("last_event_id", request.query.get("last_event_id")),
    ):
        if value is not None and not form.match(value):
            raise ApiError(
                400,
                f"{name} {value!r} is not an event id ({what}): send the id: of the last "
                "event received, or none to start from the beginning.",
                param=name,
                code="invalid_value",
            )
    return request.headers.get("Last-Event-ID") or request.query.get("last_event_id")


def _json_content(request: web.Request) -> None:
    """A JSON route's body must say it is JSON: a browser sends a
    ``text/plain`` POST from any web page without a CORS preflight, and it
    must not start a generation."""
    ctype = request.content_type  # lowercased; application/octet-stream when absent
    charset = (request.charset or "utf-8").lower()
    if ctype != "application/json" or charset not in ("utf-8", "utf8"):
        got = request.headers.get("Content-Type")
        raise ApiError(
            415,
            f"{request.method} {request.path} takes a JSON body: send it with the header "
            f"Content-Type: application/json (got {got!r})."
            if got
            else f"{request.method} {request.path} takes a JSON body: send it with the header "
            "Content-Type: application/json (the request had no Content-Type).",
            param="Content-Type",
            code="unsupported_media_type",
        )


def _client_id(request: web.Request) -> str:
    """The request's valid ``X-Request-Id``, "" when none; 400 when invalid."""
    value = request.headers.get("X-Request-Id")
    if value is None:
        return ""
    if not _CLIENT_ID.match(value):
        raise ApiError(
            400,
            f"X-Request-Id {value[:200]!r} is not a usable request id: give 1 to 128 characters "
            "from A-Z a-z 0-9 . _ : - starting with a letter or digit, or omit the header.",
            param="X-Request-Id",
            code="invalid_request_id",
        )
    return value


def _generation(handler: Handler, *, json_body: bool = True) -> Handler:
    """``handler`` of a route that submits requests: its body must be JSON
    (``json_body``; multipart routes pass False), and the client's
    ``X-Request-Id`` names what it submits (``adapt.CLIENT_REQUEST_ID``)."""

    @functools.wraps(handler)
    async def handle(request: web.Request) -> web.StreamResponse:
        if json_body:
            _json_content(request)
        rid = _client_id(request)
        # Reset after: requests of one keep-alive connection may share a task.
        token = adapt.CLIENT_REQUEST_ID.set(rid)
        try:
            return await handler(request)
        except ApiError as exc:
            if rid:  # the id is echoed on refusals too
                exc.headers.setdefault("X-Request-Id", rid)
            raise
        finally:
            adapt.CLIENT_REQUEST_ID.reset(token)

    return handle


#: How a decoded media array is tagged in the blob store.
_MEDIA_TYPES: dict[MediaKind, str] = {"audio": "audio/pcm-f32", "image": "image/rgb8"}


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    resp = web.Response(status=status, body=_enc.encode(obj), content_type="application/json")
    if headers:
        resp.headers.update(headers)
    return resp


class _Stream(web.StreamResponse):
    """A streamed response whose headers leave with its first body bytes
    (one send, not two), as ``web.Response``'s do."""

    _send_headers_immediately = False


def _headers(head: Head) -> CIMultiDict[str]:
    return CIMultiDict(head.headers)


class Routes:
    """The handlers, bound to one ``Omni``."""

    def __init__(
        self, omni: Omni, options: HttpOptions | None = None, *, telemetry: Telemetry | None = None
    ) -> None:
        self.omni = omni
        options = options or HttpOptions()
        #: The most requests one call may submit (a batch); more is 400.
        self.max_batch = options.max_batch
        self.openapi = OpenApi(
            omni.pipeline,
            max_batch=options.max_batch,
            auth=bool(options.api_key),
            metrics=telemetry is not None,
        )
        #: Seconds a streamed request outlives its dropped client, for a
        #: reconnect to ``/stream`` (0: cancel at once).
        self.resume_grace_s = options.resume_grace_s
        #: Streaming handlers attached to each running request.
        self._readers: dict[str, int] = {}
        self._grace: dict[str, asyncio.TimerHandle] = {}
        self.telemetry = telemetry
        if telemetry is not None and omni.retention is not None:
            telemetry.follow_retention(omni.retention)
        self._metrics_handler = None if telemetry is None else metrics_handler(telemetry)
        self.served = adapt.Served(omni.pipeline, new_request_id=new_request_id, new_seed=new_seed)
        self.tokens = PromptTokens(omni.pipeline)
        self._tokenizer_load: asyncio.Task[object] | None = None
        self.media = MediaDecoder(
            omni.pipeline.input_media,
            allowed_domains=options.allowed_media_domains,
            pipeline=omni.pipeline.name,
        )
        self.started_at = int(time.time())
        #: "starting" until the runtime is ready, "serving", then "stopping".
        self.phase = "starting"

    def add_to(self, app: web.Application) -> None:
        app.on_startup.append(self._load_tokenizer)
        r = app.router
        r.add_post("/v1/chat/completions", _generation(self.chat))
        r.add_post("/v1/completions", _generation(self.completions))
        r.add_post("/v1/audio/speech", _generation(self.speech))
        r.add_post("/v1/images/generations", _generation(self.images))
        r.add_post(
            "/v1/audio/transcriptions",
            _generation(self.transcriptions, json_body=False),  # multipart/form-data
        )
        r.add_get("/v1/files/{digest}", self.file)
        r.add_get("/v1/models", self.models)
        r.add_get("/version", self.version)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/detokenize", self.detokenize)
        r.add_post("/start_profile", functools.partial(self.profile, "start"))
        r.add_post("/stop_profile", functools.partial(self.profile, "stop"))
        r.add_get("/health", self.health)
        r.add_get("/ready", self.ready)
        r.add_get("/metrics", self.metrics)
        r.add_get("/v1/requests/{id}", self.request_state)
        r.add_get("/v1/requests/{id}/events", self.request_events)
        r.add_get("/v1/requests/{id}/stream", self.request_stream)
        r.add_post("/v1/requests/{id}/cancel", self.request_cancel)
        r.add_get("/v1/requests/{id}/trace", self.request_trace)
        r.add_get("/openapi.json", self.openapi.handle)

    # -- bodies ---------------------------------------------------------------
    async def _body(
        self, request: web.Request, typ: type[T], unsupported: dict[str, str] | None = None
    ) -> T:
        raw = await request.read()  # over client_max_size: aiohttp raises 413
        if not raw.strip():
            raise ApiError(
                400, "The request body is empty: send a JSON object.", code="invalid_json"
            )
        # _DECODERS maps each body type to its own decoder.
        decoder: msgspec.json.Decoder[T] = _DECODERS[typ]
        try:
            return decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise from_decode_error(exc, unsupported) from None

    # -- OpenAI routes ----------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, ChatCompletionRequest, UNSUPPORTED_CHAT_FIELDS)
        parts = adapt.media_parts(body)
        media: adapt.Media = {}
        blobs: tuple[adapt.DecodedBlob, ...] = ()
        if parts:
            media, blobs = await self._decode_media(parts)
        plan = adapt.chat_plan(
            body,
            self.served,
            traceparent=adapt.traceparent_of(request.headers.get("traceparent")),
            media=media,
            blobs=blobs,
        )
        return await self._run(request, plan)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, CompletionRequest)
        adapt.completion_stage(self.served)  # a pipeline that cannot: 400 before anything
        ids = not isinstance(body.prompt, str) and any(not isinstance(p, str) for p in body.prompt)
        plan = adapt.completion_plan(
            body,
            self.served,
            traceparent=adapt.traceparent_of(request.headers.get("traceparent")),
            tokenizer=await self.tokens.tokenizer() if ids else None,
        )
        return await self._run(request, plan)

    async def transcriptions(self, request: web.Request) -> web.StreamResponse:
        form, upload = await transcribe.read_form(request)
        transcribe.check_pipeline(self.served)
        self.served.check_model(form.model)
        part = await asyncio.to_thread(transcribe.audio_part, upload)
        media, blobs = await self._decode_media([(transcribe.FILE, part)])
        plan = transcribe.transcription_plan(
            form,
            self.served,
            media[transcribe.FILE],
            blobs,
            traceparent=adapt.traceparent_of(request.headers.get("traceparent")),
        )
        return await self._run(request, plan)

    async def _decode_media(
        self, parts: list[tuple[str, MediaContentPart]]
    ) -> tuple[adapt.Media, tuple[adapt.DecodedBlob, ...]]:
        """Decode and check every media part (off the event loop), and
        reference each array by its content digest; stored on admission."""
        decoded = await self.media.decode(parts)
        refs = await asyncio.to_thread(
            lambda: [array_ref(d.array, _MEDIA_TYPES[d.kind]) for d in decoded]
        )
        media = {
            d.param: MediaPart(kind=d.kind, blob=ref, rate=d.rate)
            for d, ref in zip(decoded, refs, strict=True)
        }
        blobs = tuple(
            adapt.DecodedBlob(ref=ref, array=d.array) for d, ref in zip(decoded, refs, strict=True)
        )
        return media, blobs

    async def speech(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, SpeechRequest)
        plan = adapt.speech_plan(
            body, self.served, traceparent=adapt.traceparent_of(request.headers.get("traceparent"))
        )
        return await self._run(request, plan)

    async def images(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, ImageRequest)
        plan = adapt.image_plan(
            body,
            self.served,
            traceparent=adapt.traceparent_of(request.headers.get("traceparent")),
            files_url=_files_url(request),
        )
        return await self._run(request, plan)

    async def file(self, request: web.Request) -> web.Response:
        """``GET /v1/files/{digest}``: a generated image file (the URL of a
        ``response_format: "url"`` image), read from the blob store by its
        content digest.  Only a well-formed digest reaches the store (no
        client path touches the filesystem), and only image files (PNG,
        JPEG, WebP) are served: other blobs (decoded inputs, audio) are 404,
        as is a digest not (or no longer: retention deleted it) stored."""
        digest = request.match_info["digest"]
        if not _DIGEST.match(digest):
            raise ApiError(
                400,
                f"{digest[:80]!r} is not a file id: file ids are 32 lowercase hex digits, as "
                "the url of an image response gives them.",
                param="digest",
                code="invalid_value",
            )
        try:
            data = await asyncio.to_thread(self.omni.blobs.get, digest)
        except BlobMissing:
            data = b""
        ctype = _image_type(data)
        if ctype is None:
            raise ApiError(
                404,
                f"No file {digest} on this server: it was never generated here, or its "
                "request's retention has ended and released it.",
                param="digest",
                code="file_not_found",
                type="not_found_error",
            )
        return web.Response(
            body=data,
            headers={
                "Content-Type": ctype,
                "ETag": f'"{digest}"',
                "Cache-Control": "private, max-age=3600, immutable",
            },
        )

    # -- submission and the live response -----------------------------------------
    def _not_accepting(self) -> ApiError:
        if self.phase == "starting":
            return ApiError(
                503,
                "The server is still loading its pipeline; retry shortly (GET /ready says when).",
                code="not_ready",
                headers={"Retry-After": RETRY_AFTER["not_ready"]},
            )
        return ApiError(
            503,
            "The server is shutting down and admits no new requests; retry on another server.",
            code="shutting_down",
            headers={"Retry-After": RETRY_AFTER["shutting_down"]},
        )

    def _submit(self, plan: adapt.Plan) -> list[Rejected] | None:
        """Admit every member of ``plan``, or none: on a refusal return the
        recorded ``Rejected`` event(s) (one per member of a group refused
        whole)."""
        omni = self.omni
        if not omni.accepting:
            raise self._not_accepting()
        self._check_group(plan)
        # Validate everything first: a bad member must not leave its
        # siblings admitted (nothing at all is appended for a bad request).
        for _, spec in plan.specs:
            try:
                omni.validate(spec)
            except RequestError as exc:
                raise from_request_error(exc) from None
        refused = self._refuse_whole(plan)
        if refused:
            return refused
        for blob in plan.blobs:
            omni.blobs.put_array(blob.array, blob.ref.media_type)
        admitted: list[str] = []
        for rid, spec in plan.specs:
            try:
                ev = omni.submit(spec, rid)
            except ShuttingDown:
                for a in admitted:
                    omni.cancel(a, "shutdown")
                raise self._not_accepting() from None
            except RequestError as exc:  # pragma: no cover - validated above
                raise from_request_error(exc) from None
            if isinstance(ev, Rejected):
                # Only if ``room`` misjudged: the group must not half run.
                for a in admitted:
                    omni.cancel(a, "client")
                return [ev]
            admitted.append(rid)
        return None

    def _check_group(self, plan: adapt.Plan) -> None:
        """A call submits at most ``max_batch`` requests, under ids not in use."""
        n = len(plan.specs)
        if n > self.max_batch:
            api = plan.specs[0][1].api
            raise ApiError(
                400,
                f"This call would submit {n} requests; this server takes at most "
                f"{self.max_batch} in one call (omnix serve --max-batch). Split the batch.",
                param={API_IMAGES: "n", API_COMPLETIONS: "prompt"}.get(api, "messages"),
                code="batch_too_large",
            )
        for rid, _ in plan.specs:
            if self.omni.state(rid) is not None:
                raise ApiError(
                    409,
                    f"Request id {rid!r} is already in use on this server (see "
                    f"GET /v1/requests/{rid}); nothing was submitted. Send a new X-Request-Id, "
                    "or omit it to get a fresh id.",
                    param="X-Request-Id",
                    code="duplicate_request_id",
                )

    def _refuse_whole(self, plan: adapt.Plan) -> list[Rejected]:
        """A group admission cannot take whole right now, refused whole: one
        ``Rejected`` per member (so metrics and traces count each), nothing
        admitted.  Empty when it fits (a single request: admission decides)."""
        n = len(plan.specs)
        if n == 1:
            return []
        omni = self.omni
        outputs = tuple(plan.specs[0][1].outputs)
        room = omni.room(outputs)
        if room >= n:
            return []
        ready = omni.ready()
        idle = [s for s in omni.graph.needed_stages(outputs) if ready.get(s, 0) == 0]
        if idle:
            reason: RejectReason = "not_ready"
            message = f"stage {idle[0]!r} has no ready replica; none of the {n} requests of this call was admitted"
        else:
            reason = "overloaded"
            message = (
                f"the {n} requests of this call are admitted together or not at all, and the "
                f"pipeline has room for {room} now; none was admitted (retry later, or split the batch)"
            )
        return [omni.refuse(spec, rid, reason, message) for rid, spec in plan.specs]

    def _disconnected(self, rids: tuple[str, ...]) -> None:
        for rid in rids:
            if self.omni.cancel(rid, "disconnect"):
                log.info("request %s: client disconnected; cancelling", rid)

    def _attach(self, rid: str) -> None:
        self._readers[rid] = self._readers.get(rid, 0) + 1
        handle = self._grace.pop(rid, None)
        if handle is not None:
            handle.cancel()

    def _detach(self, rid: str, dropped: bool) -> None:
        """A streaming handler of ``rid`` ended; ``dropped``: its client
        went away before the end of the response."""
        n = self._readers.get(rid, 0) - 1
        if n > 0:
            self._readers[rid] = n
            return
        self._readers.pop(rid, None)
        if not dropped:
            return
        rs = self.omni.state(rid)
        if rs is None or rs.terminal:
            return
        if self.resume_grace_s <= 0:
            self._disconnected((rid,))
            return
        log.info(
            "request %s: client disconnected; it keeps running %.0f s for a resume",
            rid,
            self.resume_grace_s,
        )
        loop = asyncio.get_running_loop()
        self._grace[rid] = loop.call_later(self.resume_grace_s, self._grace_over, rid)

    def _grace_over(self, rid: str) -> None:
        self._grace.pop(rid, None)
        if self._readers.get(rid, 0) == 0 and self.omni.accepting:
            self._disconnected((rid,))

    async def _load_tokenizer(self, app: web.Application) -> None:
        """Load the prompt tokenizer while the workers load (seconds of
        imports), not in the first request."""
        self._tokenizer_load = asyncio.create_task(self.tokens.tokenizer(), name="omnix-tokenizer")

    def close(self) -> None:
        """Forget pending grace timers and stop the media decoders (the
        server is closing)."""
        for handle in self._grace.values():
            handle.cancel()
        self._grace.clear()
        self.media.close()
        if self._tokenizer_load is not None:
            self._tokenizer_load.cancel()

    async def _run(self, request: web.Request, plan: adapt.Plan) -> web.StreamResponse:
        # The prompt fits the first stage's context, before anything is admitted.
        checked: set[tuple[object, str]] = set()
        for _, spec in plan.specs:
            prompt = (
                spec.prompt,
                spec.options.get(OPT_PROMPT_TOKEN_IDS),
                spec.options.get(OPT_RAW_PROMPT),
            )
            key = (spec.messages or prompt, repr(spec.stage_params.get(self.tokens.stage)))
            if key not in checked:
                checked.add(key)
                await self.tokens.check(spec)
        rejected = self._submit(plan)
        if rejected is not None:
            return self._whole_response(render_response(rejected, self.omni.blobs))
        rids = plan.request_ids
        if plan.stream and len(rids) > 1:
            return await self._stream_group(request, rids)
        if plan.stream:
            return await self._stream(request, rids[0], None)
        try:
            return await self._collect(rids, plan)
        except (asyncio.CancelledError, ConnectionResetError):
            self._disconnected(rids)
            raise

    @staticmethod
    def _whole_response(r: Rendered) -> web.Response:
        return web.Response(status=r.head.status, headers=_headers(r.head), body=r.body)

    async def _collect(self, rids: tuple[str, ...], plan: adapt.Plan) -> web.StreamResponse:
        events = []
        for rid in rids:
            async for ev in self.omni.events(rid):
                events.append(ev)
        states = [self.omni.state(rid) for rid in rids]
        if not all(rs is not None and rs.terminal for rs in states):
            raise self._not_accepting()  # the log closed under us: shutdown
        heavy = any(
            spec.options.get(Opt.AUDIO_STAGE) or spec.options.get(Opt.IMAGE_STAGE)
            for _, spec in plan.specs
        )
        if heavy:  # encoding audio or images: keep the event loop free
            rendered = await asyncio.to_thread(render_response, events, self.omni.blobs)
        else:
            rendered = render_response(events, self.omni.blobs)
        return self._whole_response(rendered)

    async def _durable(self, pos: int) -> None:
        """Wait until the log position ``pos`` is on disk (a ``--log-dir``
        log): a client is never sent bytes of an event that a crash could
        take back, so the ids it holds stay valid across a restart."""
        disk = self.omni.log
        if isinstance(disk, DiskLog) and disk.durable_pos <= pos:
            try:
                await disk.flush()
            except LogClosed:
                pass  # closing wrote out and fsynced everything

    def _caught_up(self, rid: str, pos: int) -> bool:
        """No event of ``rid`` after ``pos`` is in the log yet: the tail is
        about to wait, so what is buffered should leave now."""
        rs = self.omni.state(rid)
        return rs is None or rs.last_pos <= pos

    async def _stream(
        self, request: web.Request, rid: str, point: ResumePoint | None
    ) -> web.StreamResponse:
        """The streamed response of ``rid``, live to its end; from
        ``point`` on when resuming (whose renderer has seen the events the
        client already has).  A dropped client detaches this reader."""
        self._attach(rid)
        dropped = True
        try:
            resp = await self._stream_body(request, rid, point)
            dropped = False
            return resp
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except BaseException:
            dropped = False
            raise
        finally:
            self._detach(rid, dropped)

    async def _stream_body(
        self, request: web.Request, rid: str, point: ResumePoint | None
    ) -> web.StreamResponse:
        renderer = point.renderer if point is not None else StreamRenderer(self.omni.blobs)
        resp: web.StreamResponse | None = None
        # Pieces of a burst of events (the tail yields whatever is already
        # in the log without waiting) leave in one write: a send per SSE
        # event costs more than the rest of the stream under load.
        buf = bytearray(point.rest if point is not None else b"")
        start = point.next_pos if point is not None else 0
        if point is not None and point.renderer.head is not None:
            resp = await self._open(request, point.renderer.head, buf)
            if not isinstance(resp, _Stream):
                return resp
            if buf and not renderer.done and self._caught_up(rid, start - 1):
                await self._durable(start - 1)
                await resp.write(bytes(buf))
                buf.clear()
        if renderer.done:
            await self._durable(start - 1)
            return await self._finish(request, resp, buf, not renderer.aborted)
        last = start - 1
        async for ev in self.omni.events(rid, start):
            last = ev.pos
            for piece in renderer.feed(ev):
                buf += piece
            if resp is None and renderer.head is not None:
                resp = await self._open(request, renderer.head, buf)
                if not isinstance(resp, _Stream):
                    return resp
            if renderer.done:
                break
            if (
                resp is not None
                and buf
                and (len(buf) >= FLUSH_BYTES or self._caught_up(rid, ev.pos))
            ):
                await self._durable(ev.pos)
                await resp.write(bytes(buf))
                buf.clear()
        await self._durable(last)
        return await self._finish(request, resp, buf, renderer.done and not renderer.aborted)

    async def _stream_group(
        self, request: web.Request, rids: tuple[str, ...]
    ) -> web.StreamResponse:
        """The one SSE response of an n > 1 chat group: every member's
        events, in log order (``render.GroupStreamRenderer``).  Not
        resumable.  A dropped client, or a member that failed, cancels the
        members still running."""
        renderer = GroupStreamRenderer(self.omni.blobs)
        members = set(rids)
        rs = self.omni.state(rids[0])
        start = max(rs.admitted_pos, 0) if rs is not None else 0
        resp: web.StreamResponse | None = None
        buf = bytearray()
        last = start - 1
        try:
            async for ev in self.omni.log.tail(start):
                if not isinstance(ev, RequestEvent) or ev.request_id not in members:
                    continue
                last = ev.pos
                for piece in renderer.feed(ev):
                    buf += piece
                if resp is None and renderer.head is not None:
                    resp = await self._open(request, renderer.head, buf)
                if renderer.done:
                    break
                if resp is not None and buf and all(self._caught_up(r, ev.pos) for r in rids):
                    await self._durable(ev.pos)
                    await resp.write(bytes(buf))
                    buf.clear()
            await self._durable(last)
            # Not done: the log closed under us.
            resp = await self._finish(request, resp, buf, renderer.done)
        except (asyncio.CancelledError, ConnectionResetError):
            self._disconnected(rids)
            raise
        finally:
            self._disconnected(tuple(r for r in rids if not self._ended(r)))
        return resp

    def _ended(self, rid: str) -> bool:
        rs = self.omni.state(rid)
        return rs is None or rs.terminal

    @staticmethod
    async def _open(request: web.Request, head: Head, buf: bytearray) -> web.StreamResponse:
        """The response for ``head``: a prepared stream, or (a head that
        is not streamed) the whole response, ``buf`` being its body."""
        if not head.streamed:
            return web.Response(status=head.status, headers=_headers(head), body=bytes(buf))
        resp = _Stream(status=head.status, headers=_headers(head))
        await resp.prepare(request)
        return resp

    async def _finish(
        self,
        request: web.Request,
        resp: web.StreamResponse | None,
        buf: bytearray,
        complete: bool,
    ) -> web.StreamResponse:
        """Write the rest of a stream and end it; a stream that is not
        ``complete`` is cut instead."""
        if resp is None:
            raise self._not_accepting()
        if not complete:
            # A raw audio stream whose request failed, or the log closed:
            # cut the connection so the client cannot take it as complete.
            if buf:
                await resp.write(bytes(buf))
            if request.transport is not None:
                request.transport.abort()
            return resp
        await resp.write_eof(bytes(buf))
        return resp

    # -- server routes -------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        p = self.omni.pipeline
        card = ModelCard(
            id=self.served.model,
            created=self.started_at,
            modalities=list(p.outputs),
            stages=list(self.omni.graph.stage_names),
        )
        return _json(ModelList(data=[card]))

    async def health(self, request: web.Request) -> web.Response:
        return _json(Health())

    async def version(self, request: web.Request) -> web.Response:
        """vLLM's ``GET /version``: ``{"version": ...}``, omnix's."""
        return _json(Version(version=__version__))

    async def _tokenizer(self) -> Any:
        tok = await self.tokens.tokenizer()
        if tok is None:
            raise ApiError(
                404,
                f"pipeline {self.omni.pipeline.name!r} has no tokenizer to offer: its first stage "
                f"({self.tokens.stage!r}) is not a vLLM stage whose model folder has one.",
                code="tokenizer_unavailable",
            )
        return tok

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /tokenize``: the ids the first stage's tokenizer
        gives a prompt, or chat messages as its chat template renders them."""
        body = await self._body(request, TokenizeRequest)
        self.served.check_model(body.model or "")
        if (body.prompt is None) == (body.messages is None):
            raise ApiError(
                400,
                "Give a prompt or messages (one of them).",
                param="prompt",
                code="invalid_value",
            )
        tok = await self._tokenizer()
        if body.messages is not None:
            messages = tuple(
                _text_message(f"messages[{i}]", m) for i, m in enumerate(body.messages)
            )
            ids = await asyncio.to_thread(self.tokens.prompt_ids, tok, messages)
        else:
            special = True if body.add_special_tokens is None else body.add_special_tokens
            ids = await asyncio.to_thread(tok.encode, body.prompt, add_special_tokens=special)
        strs = tok.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return _json(
            TokenizeResponse(
                count=len(ids), max_model_len=self.tokens.max_model_len, tokens=ids, token_strs=strs
            )
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /detokenize``."""
        body = await self._body(request, DetokenizeRequest)
        self.served.check_model(body.model or "")
        tok = await self._tokenizer()
        if body.tokens and max(body.tokens) >= len(tok):
            raise ApiError(
                400,
                f"token id {max(body.tokens)} is outside the vocabulary (0..{len(tok) - 1}).",
                param="tokens",
                code="invalid_value",
            )
        text = await asyncio.to_thread(tok.decode, body.tokens)
        return _json(DetokenizeResponse(prompt=text))

    async def profile(self, action: Literal["start", "stop"], request: web.Request) -> web.Response:
        """vLLM-Omni's ``POST /start_profile`` / ``/stop_profile``: the
        profiler of the workers of ``stages`` (every stage by default);
        404 unless the server was started with ``--profile-dir``."""
        # An empty body (curl -X POST) profiles every stage.
        body = (
            await self._body(request, ProfileRequest)
            if (await request.read()).strip()
            else ProfileRequest()
        )
        try:
            reports = await self.omni.profile(action, body.stages)
        except ProfilingOff as exc:
            raise ApiError(404, str(exc), code="profiling_off") from None
        except ValueError as exc:
            raise ApiError(400, str(exc), param="stages", code="invalid_value") from None
        workers = [
            WorkerProfile(stage=r.stage, replica=r.replica, ok=r.ok, detail=r.detail)
            for r in reports
        ]
        return _json(Profiles(workers=workers), 200 if all(w.ok for w in workers) else 500)

    def is_ready(self) -> bool:
        ready = self.omni.ready()
        return self.omni.accepting and all(n > 0 for n in ready.values())

    async def ready(self, request: web.Request) -> web.Response:
        ok = self.is_ready()
        body = Readiness(ready=ok, accepting=self.omni.accepting, stages=self.omni.ready())
        return _json(
            body, 200 if ok else 503, None if ok else {"Retry-After": RETRY_AFTER["not_ready"]}
        )

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        if self._metrics_handler is None:
            raise ApiError(
                501,
                "Metrics are off in this server: it was started without telemetry.",
                code="metrics_unavailable",
            )
        return await self._metrics_handler(request)

    # -- omnix's request routes ---------------------------------------------------
    def _known(self, request: web.Request) -> str:
        rid = request.match_info["id"]
        if self.omni.state(rid) is None:
            if self.omni.request_status(rid) == "released":
                raise ApiError(
                    410,
                    f"Request {rid!r} ended before this server's retention window and was "
                    "released: its state, events and trace are no longer kept. To keep traces "
                    "longer, start the server with a longer --retain (or a larger "
                    "--retain-requests / --retain-bytes), or with --log-dir DIR --archive to "
                    "keep released requests on disk for `omnix trace export`.",
                    param="id",
                    code="request_released",
                    type="not_found_error",
                    headers={"X-Request-Id": rid},
                )
            raise ApiError(
                404,
                f"No request {rid!r} on this server. Request ids come back in the X-Request-Id "
                "header and the request_ids field of responses.",
                param="id",
                code="request_not_found",
            )
        return rid

    async def request_state(self, request: web.Request) -> web.Response:
        rid = self._known(request)
        rs = self.omni.state(rid)
        assert rs is not None
        return web.Response(
            body=state_json(rs), content_type="application/json", headers={"X-Request-Id": rid}
        )

    async def request_events(self, request: web.Request) -> web.StreamResponse:
        """SSE tail of one request's events, from the start or after the
        ``Last-Event-ID`` (a log position) a reconnecting client sends; ends
        after the terminal event.  ``?format=object`` for named fields."""
        rid = self._known(request)
        last = _last_event_id(request, _POSITION, "a log position: digits")
        start = 0 if last is None else int(last) + 1
        fmt = request.query.get("format", "array")
        if fmt not in ("array", "object"):
            raise ApiError(
                400, "format must be 'array' or 'object'.", param="format", code="invalid_value"
            )
        frame = event_object_sse if fmt == "object" else event_sse
        resp = _Stream(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Request-Id": rid,
            }
        )
        await resp.prepare(request)
        rs = self.omni.state(rid)
        buf = bytearray()
        if not (rs is not None and rs.terminal and start > rs.terminal_pos):
            async for ev in self.omni.events(rid, start):
                buf += frame(ev)
                if len(buf) >= FLUSH_BYTES or self._caught_up(rid, ev.pos):
                    await self._durable(ev.pos)
                    await resp.write(bytes(buf))
                    buf.clear()
        await resp.write_eof(bytes(buf))
        return resp

    async def request_stream(self, request: web.Request) -> web.StreamResponse:
        """The streamed response of a request, again: from its start, or
        after the ``Last-Event-ID`` (header or ``?last_event_id=``) of the
        last SSE event the client received; live to the request's end."""
        rid = self._known(request)
        last = _last_event_id(request, _EVENT_ID, "POS or POS.N")
        point = await resume_point(self.omni, rid, last)
        return await self._stream(request, rid, point)

    async def request_cancel(self, request: web.Request) -> web.Response:
        rid = self._known(request)
        asked = self.omni.cancel(rid, "client")
        rs = self.omni.state(rid)
        assert rs is not None
        return _json(
            CancelResult(request_id=rid, cancel_requested=asked, status=rs.status),
            headers={"X-Request-Id": rid},
        )

    async def request_trace(self, request: web.Request) -> web.Response:
        rid = self._known(request)
        rs = self.omni.state(rid)
        if rs is not None and not rs.terminal:
            raise ApiError(
                409,
                f"request {rid} is still {rs.status}: download its trace once it has ended.",
                code="request_running",
            )
        omni = self.omni
        # On the loop, not a thread: the log is appended to by this loop.
        data = export_trace(omni.log, omni.blobs, omni.pipeline, [rid])
        return web.Response(
            body=data,
            content_type="application/octet-stream",
            headers={
                "Content-Disposition": f'attachment; filename="{rid}.omnixtrace"',
                "X-Request-Id": rid,
            },
        )


def _text_message(where: str, m: Message) -> ChatMessage:
    """A /tokenize message: its text parts (media have no tokens until the
    model's processor expands them)."""
    c = m.content
    if c is None or isinstance(c, str):
        return ChatMessage(role=m.role, content=c or "")
    if not all(isinstance(p, TextPart) for p in c):
        raise ApiError(
            400,
            f"{where}: /tokenize counts text only; send the message's text parts.",
            param=where,
            code="unsupported_input",
        )
    return ChatMessage(role=m.role, content="\n".join(p.text for p in c if isinstance(p, TextPart)))
