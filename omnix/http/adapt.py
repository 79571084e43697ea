"""OpenAI request bodies -> omnix ``RequestSpec``s.

Owns: the mapping from each route's decoded body to the request(s) it
submits: which stage the standard sampling parameters apply to, per-stage
``sampling_params_list`` (a list aligned with the pipeline's stages, or a
map by stage name), seeds (chosen here when the client gives none, so the
log records them), batching (a list of conversations, images with
``n`` > 1: one request per member, ids ``GROUP-i``), and the response
options ``render.py`` needs, written into ``RequestSpec.options`` so a
response can be re-rendered from the log alone.

Request ids: ``Served.new_request_id`` gives the id the client named in
``X-Request-Id`` (``CLIENT_REQUEST_ID``, set by ``routes.py`` for the
HTTP request being handled) or a fresh one; a batch's members are
``ID-0``, ``ID-1``...

Raises ``ApiError`` for what the HTTP layer can judge (unknown model,
unsupported parameters, inconsistent fields: all 400); the pipeline's own
``validate_request`` (through ``Omni.validate``) judges the rest before
anything is appended.  Does not submit or render.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextvars import ContextVar

import msgspec
import numpy as np

from omnix.events.types import BlobRef, ChatMessage, MediaPart, Modality, RequestSpec, StageParams
from omnix.http.errors import ApiError
from omnix.http.render import API_CHAT, API_IMAGES, API_SPEECH, RENDER_VERSION, Opt
from omnix.http.schemas import (
    ChatCompletionRequest,
    ImageRequest,
    MediaContentPart,
    Message,
    SamplingParamsList,
    SpeechRequest,
    TextPart,
)
from omnix.pipelines.config import CodecArgs, PipelineConfig
from omnix.pipelines.plan import PipelineGraph, merge_params

DEFAULT_SAMPLE_RATE = 24000
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")

#: The request id the client named (``X-Request-Id``) for the HTTP request
#: being handled, "" when none.  A context variable, not a parameter, so
#: that every route's plan honours it: aiohttp runs each HTTP request in
#: its own task, which has its own context.
CLIENT_REQUEST_ID: ContextVar[str] = ContextVar("omnix_client_request_id", default="")


class DecodedBlob(msgspec.Struct, frozen=True):
    """A decoded media array and the reference its ``MediaPart`` holds."""

    ref: BlobRef
    array: np.ndarray


class Plan(msgspec.Struct, frozen=True):
    """The requests one HTTP call submits, in choice order, and the decoded
    media their specs reference (stored once the plan is validated, so a
    refused request leaves nothing in the blob store)."""

    specs: tuple[tuple[str, RequestSpec], ...]
    stream: bool = False
    blobs: tuple[DecodedBlob, ...] = ()

    @property
    def request_ids(self) -> tuple[str, ...]:
        return tuple(rid for rid, _ in self.specs)


class Served:
    """What the adapters need to know about the served pipeline."""

    def __init__(
        self,
        pipeline: PipelineConfig,
        *,
        new_request_id: Callable[[], str],
        new_seed: Callable[[], int],
    ) -> None:
        self.pipeline = pipeline
        self.graph = PipelineGraph(pipeline)
        self.model = pipeline.name
        self._fresh_id = new_request_id
        self.new_seed = new_seed

    def new_request_id(self) -> str:
        """The client's ``X-Request-Id`` (``CLIENT_REQUEST_ID``), else a fresh id."""
        return CLIENT_REQUEST_ID.get() or self._fresh_id()

    def check_model(self, model: str) -> None:
        if model and model != self.model:
            raise ApiError(
                404,
                f"The model {model!r} does not exist on this server: it serves {self.model!r} "
                "(see GET /v1/models). Pass that name, or omit model.",
                param="model",
                code="model_not_found",
            )

    def output_stage(self, modality: Modality) -> str:
        return self.pipeline.outputs.get(modality, "")

    def source_stage(self, outputs: tuple[str, ...]) -> str:
        needed = self.graph.needed_stages(outputs)
        sources = self.graph.sources(needed)
        return sources[0] if sources else (needed[0] if needed else "")

    def media_stages(self, outputs: tuple[str, ...], modality: str) -> tuple[str, ...]:
        """Stages needed for ``modality`` but not for text: where voice and
        speed apply (talker and decoder of an omni pipeline)."""
        if modality not in self.pipeline.outputs:
            return ()
        media = self.graph.needed_stages((modality,))
        text = (
            set(self.graph.needed_stages(("text",))) if "text" in self.pipeline.outputs else set()
        )
        return tuple(n for n in media if n not in text) or media

    def sample_rate(self) -> int:
        stage = self.output_stage("audio")
        if stage:
            args = self.pipeline.stage(stage).engine
            if isinstance(args, CodecArgs):
                return args.sample_rate
        return DEFAULT_SAMPLE_RATE

    def stage_params(self, given: SamplingParamsList | None) -> dict[str, StageParams]:
        """``sampling_params_list`` as a map by stage name."""
        if given is None:
            return {}
        if isinstance(given, dict):
            return dict(given)  # unknown names: validate_request says which exist
        names = self.graph.stage_names
        if len(given) != len(names):
            raise ApiError(
                400,
                f"sampling_params_list has {len(given)} entries but pipeline {self.model!r} has "
                f"{len(names)} stages ({', '.join(names)}): give one entry (or null) per stage, "
                "in this order, or a map from stage name to parameters.",
                param="sampling_params_list",
                code="invalid_value",
            )
        return {n: p for n, p in zip(names, given, strict=True) if p is not None}


def traceparent_of(header: str | None) -> str:
    """A W3C traceparent header if well-formed, else nothing."""
    if header and _TRACEPARENT.match(header.strip().lower()):
        return header.strip().lower()
    return ""


def _unsupported(param: str, why: str) -> ApiError:
    return ApiError(
        400, f"{param} is not supported: {why}", param=param, code="unsupported_parameter"
    )


def _bad(param: str, why: str) -> ApiError:
    return ApiError(400, why, param=param, code="invalid_value")


def _put(params: dict[str, StageParams], stage: str, base: StageParams) -> None:
    """``base`` under the explicit per-stage overrides for ``stage``
    (``sampling_params_list`` is the more specific, so it wins)."""
    if base == StageParams():
        return
    params[stage] = merge_params(base, params.get(stage))


def _group_ids(served: Served, n: int) -> tuple[str, list[str]]:
    gid = served.new_request_id()
    return gid, [gid] if n == 1 else [f"{gid}-{i}" for i in range(n)]


def _group_options(opts: dict[str, str], gid: str, i: int, n: int) -> dict[str, str]:
    if n == 1:
        return opts
    return {**opts, Opt.GROUP: gid, Opt.GROUP_INDEX: str(i), Opt.GROUP_SIZE: str(n)}


# --------------------------------------------------------------------------
# Chat completions
# --------------------------------------------------------------------------


#: Decoded media parts of a chat body, by the JSON path of their part
#: (``messages[0].content[1]``); ``MediaPart.at`` is filled in by ``_messages``.
Media = dict[str, MediaPart]


def _conversations(body: ChatCompletionRequest) -> list[tuple[str, list[Message]]]:
    """The body's conversations with the JSON path of each: one
    (``messages``) or a batch (``messages[i]``)."""
    if any(isinstance(m, list) for m in body.messages):
        return [(f"messages[{i}]", c) for i, c in enumerate(body.messages) if isinstance(c, list)]
    return [("messages", [m for m in body.messages if not isinstance(m, list)])]


def media_parts(body: ChatCompletionRequest) -> list[tuple[str, MediaContentPart]]:
    """Every audio, image and video part of a chat body, in order, with its
    JSON path: what the HTTP layer decodes before planning."""
    out: list[tuple[str, MediaContentPart]] = []
    for where, conv in _conversations(body):
        for i, m in enumerate(conv):
            if isinstance(m.content, list):
                for j, part in enumerate(m.content):
                    if not isinstance(part, TextPart):
                        out.append((f"{where}[{i}].content[{j}]", part))
    return out


def _messages(conv: list[Message], where: str, media: Media) -> tuple[ChatMessage, ...]:
    if not conv:
        raise _bad(where, f"{where} is empty: give at least one message.")
    out = []
    for i, m in enumerate(conv):
        c = m.content
        parts: list[MediaPart] = []
        if c is None:
            text = ""
        elif isinstance(c, str):
            text = c
        else:
            texts: list[str] = []
            at = 0  # length of "\n".join(texts) so far
            for j, part in enumerate(c):
                if isinstance(part, TextPart):
                    at += len(part.text) + (1 if texts else 0)
                    texts.append(part.text)
                    continue
                param = f"{where}[{i}].content[{j}]"
                decoded = media.get(param)
                if decoded is None:  # the HTTP layer decodes every part first
                    raise ApiError(500, f"{param} was not decoded", param=param)
                if m.role != "user":
                    raise _bad(param, f"{param}: only user messages may carry audio or images.")
                parts.append(msgspec.structs.replace(decoded, at=at))
            text = "\n".join(texts)
        out.append(ChatMessage(role=m.role, content=text, media=tuple(parts)))
    return tuple(out)


#: Roles whose message must have content (OpenAI refuses ``content: null``
#: on them; an assistant message may be null, having made tool calls).
_CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool"})


def _check_contents(convs: list[list[Message]], batched: bool) -> None:
    for k, conv in enumerate(convs):
        where = f"messages[{k}]" if batched else "messages"
        for i, m in enumerate(conv):
            if m.content is None and m.role in _CONTENT_REQUIRED:
                raise _bad(
                    f"{where}[{i}].content",
                    f"{where}[{i}].content is null: a {m.role} message needs content, "
                    "a string or a list of content parts.",
                )


def _check_chat_unsupported(body: ChatCompletionRequest) -> None:
    if body.n != 1:
        raise ApiError(
            400,
            f"n={body.n} is not supported: omnix returns one choice per conversation. "
            "Send n=1, or batch several conversations in messages (a list of lists).",
            param="n",
            code="unsupported_value",
        )
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(body, name) not in (None, 0.0):
            raise _unsupported(name, "omnix stages do not apply penalties; omit it or send 0.")
    if body.logprobs or body.top_logprobs:
        raise _unsupported("logprobs", "omnix does not return log probabilities; omit it.")
    if body.logit_bias:
        raise _unsupported("logit_bias", "omit it.")


def chat_plan(
    body: ChatCompletionRequest,
    served: Served,
    *,
    traceparent: str = "",
    media: Media | None = None,
    blobs: tuple[DecodedBlob, ...] = (),
) -> Plan:
    """``media``: the body's decoded media parts (``media_parts``), keyed
    by their JSON path; ``blobs``: their arrays, to store on admission."""
    media = media or {}
    served.check_model(body.model)
    _check_chat_unsupported(body)
    if body.stream_options is not None and not body.stream:
        raise _bad("stream_options", "stream_options is only allowed when stream is true.")

    # One conversation, or a batch of them.
    if not body.messages:
        raise _bad("messages", "messages is empty: give at least one message.")
    batch = [m for m in body.messages if isinstance(m, list)]
    single = [m for m in body.messages if not isinstance(m, list)]
    if batch and single:
        raise _bad(
            "messages",
            "messages mixes messages and lists of messages: send one conversation "
            "(a list of messages) or a batch (a list of conversations).",
        )
    batched = bool(batch)
    _check_contents(batch if batched else [single], batched)
    convs = (
        [_messages(c, f"messages[{i}]", media) for i, c in enumerate(batch)]
        if batched
        else [_messages(single, "messages", media)]
    )
    if batched and body.stream:
        raise ApiError(
            400,
            "a batch of conversations cannot be streamed: send stream=false, or one "
            "conversation per request to stream.",
            param="stream",
            code="unsupported_value",
        )

    modalities = tuple(body.modalities) if body.modalities is not None else ("text",)
    if not modalities:
        raise _bad("modalities", 'modalities is empty: give ["text"] or ["text", "audio"].')
    if len(set(modalities)) != len(modalities):
        raise _bad("modalities", "each modality may be listed once.")
    wants_audio = "audio" in modalities
    if body.audio is not None and not wants_audio:
        raise _bad(
            "audio", 'audio output parameters were given but modalities does not include "audio".'
        )

    if body.max_tokens is not None and body.max_completion_tokens is not None:
        if body.max_tokens != body.max_completion_tokens:
            raise _bad(
                "max_completion_tokens",
                "max_tokens and max_completion_tokens disagree: send one of them.",
            )
    stop = body.stop
    base = StageParams(
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        stop=(stop,) if isinstance(stop, str) else (tuple(stop) if stop is not None else None),
    )
    outputs: tuple[Modality, ...] = modalities
    text_stage = served.output_stage("text") or served.source_stage(outputs)
    params = served.stage_params(body.sampling_params_list)
    _put(params, text_stage, base)

    opts = {
        Opt.RENDER: RENDER_VERSION,
        Opt.STREAM: "1" if body.stream else "0",
        Opt.INCLUDE_USAGE: "1"
        if body.stream_options and body.stream_options.include_usage
        else "0",
        Opt.USAGE_STAGE: text_stage,
    }
    if "text" in outputs:
        opts[Opt.TEXT_STAGE] = served.output_stage("text")
    if wants_audio:
        audio = body.audio
        fmt = audio.format if audio is not None else ("pcm16" if body.stream else "wav")
        voice = audio.voice if audio is not None else "default"
        opts[Opt.AUDIO_STAGE] = served.output_stage("audio")
        opts[Opt.AUDIO_FORMAT] = "pcm" if fmt == "pcm16" else fmt
        opts[Opt.VOICE] = voice
        opts[Opt.SAMPLE_RATE] = str(served.sample_rate())
        for st in served.media_stages(outputs, "audio"):
            _put(params, st, StageParams(voice=voice))

    seed = body.seed if body.seed is not None else served.new_seed()
    gid, rids = _group_ids(served, len(convs))
    specs = tuple(
        (
            rid,
            RequestSpec(
                messages=conv,
                outputs=outputs,
                stage_params=params,
                seed=(seed + i) % 2**63,
                api=API_CHAT,
                model=served.model,
                traceparent=traceparent,
                options=_group_options(opts, gid, i, len(convs)),
            ),
        )
        for i, (rid, conv) in enumerate(zip(rids, convs, strict=True))
    )
    return Plan(specs=specs, stream=body.stream, blobs=blobs)


# --------------------------------------------------------------------------
# Speech
# --------------------------------------------------------------------------


def speech_plan(body: SpeechRequest, served: Served, *, traceparent: str = "") -> Plan:
    served.check_model(body.model)
    outputs: tuple[Modality, ...] = ("audio",)
    params = served.stage_params(body.sampling_params_list)
    for st in served.media_stages(outputs, "audio"):
        _put(
            params,
            st,
            StageParams(voice=body.voice, speed=None if body.speed == 1.0 else body.speed),
        )
    usage = served.source_stage(outputs) if "audio" in served.pipeline.outputs else ""
    opts = {
        Opt.RENDER: RENDER_VERSION,
        Opt.STREAM: "1" if body.stream_format else "0",
        Opt.STREAM_FORMAT: body.stream_format or "",
        Opt.AUDIO_STAGE: served.output_stage("audio"),
        Opt.AUDIO_FORMAT: body.response_format,
        Opt.VOICE: body.voice,
        Opt.SAMPLE_RATE: str(served.sample_rate()),
        Opt.USAGE_STAGE: usage,
    }
    rid = served.new_request_id()
    spec = RequestSpec(
        prompt=body.input,
        outputs=outputs,
        stage_params=params,
        seed=body.seed if body.seed is not None else served.new_seed(),
        api=API_SPEECH,
        model=served.model,
        traceparent=traceparent,
        options=opts,
    )
    return Plan(specs=((rid, spec),), stream=bool(body.stream_format))


# --------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------


def _size(size: str) -> tuple[int, int]:
    w, h = (int(v) for v in size.split("x"))
    for v in (w, h):
        if not (8 <= v <= 4096 and v % 8 == 0):
            raise _bad(
                "size",
                f"size {size!r}: width and height must be multiples of 8 between 8 and 4096 "
                "(e.g. 64x64).",
            )
    return w, h


def image_plan(body: ImageRequest, served: Served, *, traceparent: str = "") -> Plan:
    served.check_model(body.model)
    if body.response_format == "url":
        raise ApiError(
            400,
            'response_format "url" is not supported: omnix does not host generated files. '
            'Use "b64_json".',
            param="response_format",
            code="unsupported_value",
        )
    if (
        body.steps is not None
        and body.num_inference_steps is not None
        and body.steps != body.num_inference_steps
    ):
        raise _bad("steps", "steps and num_inference_steps disagree: send one of them.")
    width = height = None
    if body.size is not None:
        width, height = _size(body.size)
    outputs: tuple[Modality, ...] = ("image",)
    stage = served.output_stage("image") or served.source_stage(outputs)
    params = served.stage_params(body.sampling_params_list)
    _put(
        params,
        stage,
        StageParams(
            num_inference_steps=body.steps or body.num_inference_steps,
            guidance_scale=body.guidance_scale,
            width=width,
            height=height,
        ),
    )
    opts = {
        Opt.RENDER: RENDER_VERSION,
        Opt.STREAM: "0",
        Opt.IMAGE_STAGE: served.output_stage("image"),
        Opt.RESPONSE_FORMAT: body.response_format,
        Opt.USAGE_STAGE: stage,
    }
    seed = body.seed if body.seed is not None else served.new_seed()
    gid, rids = _group_ids(served, body.n)
    specs = tuple(
        (
            rid,
            RequestSpec(
                prompt=body.prompt,
                outputs=outputs,
                stage_params=params,
                seed=(seed + i) % 2**63,
                api=API_IMAGES,
                model=served.model,
                traceparent=traceparent,
                options=_group_options(opts, gid, i, body.n),
            ),
        )
        for i, rid in enumerate(rids)
    )
    return Plan(specs=specs)
