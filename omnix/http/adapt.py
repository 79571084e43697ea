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
from typing import Any, TypeVar

import msgspec
import numpy as np

from omnix.engines.diffusers_engine import DiffusionModel, describe_model, refusal
from omnix.events.types import BlobRef, ChatMessage, MediaPart, Modality, RequestSpec, StageParams
from omnix.http.errors import ApiError
from omnix.http.render import (
    API_CHAT,
    API_COMPLETIONS,
    API_IMAGES,
    API_SPEECH,
    RENDER_VERSION,
    Opt,
)
from omnix.http.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    ImageRequest,
    JsonObjectFormat,
    JsonSchemaResponseFormat,
    MediaContentPart,
    Message,
    SamplingParamsList,
    SpeechRequest,
    TextPart,
)
from omnix.pipelines.config import CodecArgs, DiffusersArgs, PipelineConfig, engine_kind
from omnix.pipelines.plan import PipelineGraph, merge_params
from omnix.transport.work import OPT_PROMPT_TOKEN_IDS, OPT_RAW_PROMPT

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
        #: diffusers stages' models as their folders describe them (images)
        self._diffusion: dict[str, DiffusionModel] = {}

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

    def engine_of(self, stage: str) -> str:
        """The kind of the stage's engine (``"vllm"``, ``"scripted"``...)."""
        for st in self.pipeline.stages:
            if st.name == stage:
                return engine_kind(st.engine)
        return ""

    def check_engines(self, params: dict[str, StageParams]) -> None:
        """400 for a sampling parameter a stage's engine cannot honour
        (``ENGINE_PARAMS``, the diffusion fields, ``speed``), naming the
        parameter and the stage."""
        for stage, p in params.items():
            kind = self.engine_of(stage)
            can = ENGINE_PARAMS.get(kind, frozenset())
            for field in EXTRA_PARAMS:
                if getattr(p, field) is not None and field not in can:
                    param = _HTTP_NAME.get(field, field)
                    raise ApiError(
                        400,
                        f"{param} is not supported by stage {stage!r} of pipeline {self.model!r}: "
                        f"its engine ({kind}) cannot honour it (only vLLM stages take vLLM's "
                        "sampling extras); omit it.",
                        param=param,
                        code="unsupported_parameter",
                    )
            if kind != "diffusers":  # the image-only fields (every route)
                for field in DIFFUSION_PARAMS:
                    if getattr(p, field) is not None:
                        raise ApiError(
                            400,
                            f"{field} is not supported by stage {stage!r} of pipeline "
                            f"{self.model!r}: its engine ({kind}) is not a diffusers pipeline; "
                            "omit it.",
                            param=field,
                            code="unsupported_parameter",
                        )
            if p.speed is not None and p.speed != 1.0:
                _check_speech(self, "speed", (stage,))

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


#: ``StageParams`` fields (schema v5) that only some engines honour.
EXTRA_PARAMS = (
    "min_tokens",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "stop_token_ids",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "ignore_eos",
    "logit_bias",
    "logprobs",
    "json_schema",
    "json_object",
)
#: Which of them each engine kind honours (the scripted test engine makes
#: deterministic fake logprobs, so rendering is testable without a model).
ENGINE_PARAMS: dict[str, frozenset[str]] = {
    "vllm": frozenset(EXTRA_PARAMS),
    "scripted": frozenset({"logprobs"}),
}
#: The request field a ``StageParams`` field comes from, where they differ.
_HTTP_NAME = {"json_schema": "response_format", "json_object": "response_format"}
#: At most this many ``logit_bias`` entries (OpenAI's limit).
MAX_LOGIT_BIAS = 300


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


#: The bodies whose sampling fields ``_sampling_extras`` maps (one mapping
#: and one validation for chat and completions).
SamplingBody = ChatCompletionRequest | CompletionRequest


def _logit_bias(body: SamplingBody) -> dict[int, float] | None:
    if body.logit_bias is None:
        return None
    if len(body.logit_bias) > MAX_LOGIT_BIAS:
        raise _bad("logit_bias", f"logit_bias has more than {MAX_LOGIT_BIAS} entries.")
    out: dict[int, float] = {}
    for key, v in body.logit_bias.items():
        if not key.isascii() or not key.isdigit() or len(key) > 9:
            raise _bad(
                "logit_bias",
                f"logit_bias key {key!r} is not a token id: keys are token ids as strings "
                '(e.g. {"50256": -100}).',
            )
        out[int(key)] = v
    return out or None


_Item = TypeVar("_Item")


def _samples(opts: dict[str, str], stream: bool, items: list[_Item], n: int) -> list[_Item]:
    """``n`` > 1 samples of one prompt: ``n`` requests of a group (seeds
    seed, seed+1...) whose choices are the group's (usage counts the prompt
    once, as OpenAI's); streamed, their chunks interleave in log order in
    one response, each with its member's choice index.  Marks ``opts`` so."""
    if n <= 1:
        return items
    opts[Opt.CHOICES] = "1"
    if stream:
        opts[Opt.STREAM] = "0"
        opts[Opt.GROUP_STREAM] = "1"
    return items * n


def _text_params(
    served: Served,
    body: ChatCompletionRequest | CompletionRequest,
    stage: str,
    base: StageParams,
) -> dict[str, StageParams]:
    """Every stage's parameters: ``sampling_params_list``, the top-level
    ones put on the text ``stage``; 400 for one a stage's engine cannot
    honour."""
    params = served.stage_params(body.sampling_params_list)
    _put(params, stage, base)
    served.check_engines(params)
    return params


def _stream_options(
    body: ChatCompletionRequest | CompletionRequest, usage_stage: str, resumable: bool
) -> dict[str, str]:
    """The options a chat or completions response renders its stream from."""
    opts = {
        Opt.RENDER: RENDER_VERSION,
        Opt.STREAM: "1" if body.stream else "0",
        Opt.INCLUDE_USAGE: "1"
        if body.stream_options and body.stream_options.include_usage
        else "0",
        Opt.USAGE_STAGE: usage_stage,
    }
    if resumable:
        opts[Opt.SSE_IDS] = "1"
    return opts


def _sampling_extras(body: SamplingBody, default_max_tokens: int | None = None) -> StageParams:
    """The body's sampling fields (chat or completions) as the text stage's
    ``StageParams`` (``None``: not given, the stage's default)."""
    logprobs: int | None
    if isinstance(body, ChatCompletionRequest):
        if body.top_logprobs is not None and not body.logprobs:
            raise _bad("top_logprobs", "top_logprobs needs logprobs: true.")
        max_tokens = body.max_completion_tokens or body.max_tokens
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
    else:  # completions: logprobs is the number of alternatives
        max_tokens = body.max_tokens
        logprobs = body.logprobs
    # min_tokens above max_tokens is capped at it by the engine.
    if max_tokens is None:
        max_tokens = default_max_tokens
    json_schema = None
    json_object = None
    fmt = body.response_format
    if isinstance(fmt, JsonObjectFormat):
        json_object = True
    elif isinstance(fmt, JsonSchemaResponseFormat):
        json_schema = msgspec.json.encode(fmt.json_schema.schema).decode()
    stop = body.stop
    return StageParams(
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        max_tokens=max_tokens,
        stop=(stop,) if isinstance(stop, str) else (tuple(stop) if stop is not None else None),
        min_tokens=body.min_tokens,
        min_p=body.min_p,
        repetition_penalty=body.repetition_penalty,
        frequency_penalty=body.frequency_penalty,
        presence_penalty=body.presence_penalty,
        stop_token_ids=tuple(body.stop_token_ids) if body.stop_token_ids is not None else None,
        include_stop_str_in_output=body.include_stop_str_in_output,
        skip_special_tokens=body.skip_special_tokens,
        spaces_between_special_tokens=body.spaces_between_special_tokens,
        ignore_eos=body.ignore_eos,
        logit_bias=_logit_bias(body),
        logprobs=logprobs,
        json_schema=json_schema,
        json_object=json_object,
    )


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

    base = _sampling_extras(body)
    n = body.n
    resumable = bool(body.stream_options and body.stream_options.resumable)
    if n > 1:
        if batched:
            raise ApiError(
                400,
                f"n={n} with a batch of conversations is not supported: send n=1 with a batch, "
                "or one conversation with n > 1.",
                param="n",
                code="unsupported_value",
            )
        if body.stream and wants_audio:
            raise ApiError(
                400,
                f"n={n} cannot be streamed with audio output: send stream=false, or n=1, or "
                'modalities ["text"].',
                param="n",
                code="unsupported_value",
            )
        if resumable:
            raise ApiError(
                400,
                f"a stream of n={n} choices is not resumable: send n=1 to get a resumable "
                "stream, or omit stream_options.resumable.",
                param="stream_options",
                code="unsupported_value",
            )
    if base.logprobs is not None and "text" not in modalities:
        raise _bad("logprobs", 'logprobs are of the text answer: modalities must include "text".')
    outputs: tuple[Modality, ...] = modalities
    text_stage = served.output_stage("text") or served.source_stage(outputs)
    params = _text_params(served, body, text_stage, base)
    opts = _stream_options(body, text_stage, resumable)
    if base.logprobs is not None:
        opts[Opt.LOGPROBS] = "1"
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
    convs = _samples(opts, body.stream, convs, n)
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
# Completions
# --------------------------------------------------------------------------

#: The ``max_tokens`` of a completion that names none (vLLM's and OpenAI's).
COMPLETION_MAX_TOKENS = 16


def completion_stage(served: Served) -> str:
    """The stage a raw completion prompt goes to: the text stage, when it is
    a vLLM stage that reads the request's prompt itself (the pipeline's
    first stage, whose tokenizer counts the prompt); else 400 naming it."""
    stage = served.output_stage("text")
    if not stage:
        raise ApiError(
            400,
            f"pipeline {served.model!r} produces no text ({', '.join(served.pipeline.outputs) or 'nothing'}), "
            "so it cannot answer /v1/completions.",
            param="model",
            code="unsupported_modality",
        )
    kind = served.engine_of(stage)
    sources = served.graph.sources(served.graph.needed_stages(("text",)))
    if kind != "vllm" or sources != (stage,) or served.pipeline.stages[0].name != stage:
        why = (
            f"its engine is {kind}, not vLLM"
            if kind != "vllm"
            else "it does not read the request's prompt itself (an upstream stage does)"
        )
        raise ApiError(
            400,
            f"/v1/completions is not supported by pipeline {served.model!r}: it sends a raw "
            f"prompt to the text stage, and text stage {stage!r} cannot take one ({why}). Use "
            "/v1/chat/completions.",
            param="prompt",
            code="unsupported_parameter",
        )
    return stage


def completion_prompts(body: CompletionRequest) -> list[str | list[int]]:
    """The body's prompts: one (a string, or a list of token ids), or a
    batch (a list of strings, or a list of token-id lists)."""
    p = body.prompt
    if isinstance(p, str):
        return [p]
    ids = [x for x in p if isinstance(x, int)]
    texts = [x for x in p if isinstance(x, str)]
    lists = [x for x in p if isinstance(x, list)]
    if len(ids) == len(p):
        return [ids]
    if len(texts) == len(p):
        return list(texts)
    if len(lists) == len(p):
        return list(lists)
    raise _bad(
        "prompt",
        "prompt mixes strings, token ids and lists of token ids: send a string, a list of token "
        "ids, or a batch (a list of strings, or a list of token-id lists).",
    )


def completion_plan(
    body: CompletionRequest, served: Served, *, traceparent: str = "", tokenizer: Any = None
) -> Plan:
    """``tokenizer``: the text stage's (``PromptTokens.tokenizer``), needed
    for token-id prompts (checked against its vocabulary, and decoded: the
    request's ``prompt`` is their text, for the log and ``echo``)."""
    served.check_model(body.model)
    stage = completion_stage(served)
    if body.suffix is not None:
        raise _unsupported(
            "suffix", "omnix does not do fill-in-the-middle completions; omit suffix."
        )
    if body.best_of is not None and body.best_of != 1:
        raise ApiError(
            400,
            f"best_of={body.best_of} is not supported: omnix does not rank candidates; send "
            "n for several completions, or omit best_of.",
            param="best_of",
            code="unsupported_value",
        )
    if body.stream_options is not None and not body.stream:
        raise _bad("stream_options", "stream_options is only allowed when stream is true.")
    if body.echo and body.logprobs is not None:
        raise ApiError(
            400,
            "echo with logprobs is not supported: omnix records no logprobs of the prompt's "
            "tokens. Send echo or logprobs, not both.",
            param="echo",
            code="unsupported_value",
        )
    prompts = completion_prompts(body)
    batched = len(prompts) > 1
    n = body.n
    resumable = bool(body.stream_options and body.stream_options.resumable)
    if batched and body.stream:
        raise ApiError(
            400,
            "a batch of prompts cannot be streamed: send stream=false, or one prompt per "
            "request to stream.",
            param="stream",
            code="unsupported_value",
        )
    if n > 1 and batched:
        raise ApiError(
            400,
            f"n={n} with a batch of prompts is not supported: send n=1 with a batch, or one "
            "prompt with n > 1.",
            param="n",
            code="unsupported_value",
        )
    if n > 1 and resumable:
        raise ApiError(
            400,
            f"a stream of n={n} choices is not resumable: send n=1 to get a resumable stream, "
            "or omit stream_options.resumable.",
            param="stream_options",
            code="unsupported_value",
        )
    where = (lambda i: f"prompt[{i}]") if batched else (lambda i: "prompt")
    entries: list[tuple[str, list[int] | None]] = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if not p:
                raise _bad(where(i), f"{where(i)} is empty: give some text or token ids.")
            entries.append((p, None))
            continue
        if tokenizer is None:
            raise ApiError(
                400,
                f"{where(i)} is token ids, but stage {stage!r} has no tokenizer to check them "
                "against: send the prompt as text.",
                param=where(i),
                code="unsupported_value",
            )
        vocab = len(tokenizer)
        if max(p) >= vocab:
            raise _bad(
                where(i),
                f"{where(i)}: token id {max(p)} is outside the vocabulary (0..{vocab - 1}).",
            )
        entries.append((str(tokenizer.decode(p)) or " ", p))
    base = _sampling_extras(body, COMPLETION_MAX_TOKENS)
    params = _text_params(served, body, stage, base)
    opts = _stream_options(body, stage, resumable)
    opts[Opt.TEXT_STAGE] = stage
    opts[OPT_RAW_PROMPT] = "1"
    if body.logprobs is not None:
        opts[Opt.LOGPROBS] = "1"
    if body.echo:
        opts[Opt.ECHO] = "1"
    seed = body.seed if body.seed is not None else served.new_seed()
    entries = _samples(opts, body.stream, entries, n)
    gid, rids = _group_ids(served, len(entries))
    specs = []
    for i, (rid, (text, ids)) in enumerate(zip(rids, entries, strict=True)):
        member = _group_options(opts, gid, i, len(entries))
        if ids is not None:
            member = {**member, OPT_PROMPT_TOKEN_IDS: msgspec.json.encode(ids).decode()}
        spec = RequestSpec(
            prompt=text,
            outputs=("text",),
            stage_params=params,
            seed=(seed + i) % 2**63,
            api=API_COMPLETIONS,
            model=served.model,
            traceparent=traceparent,
            options=member,
        )
        specs.append((rid, spec))
    return Plan(specs=tuple(specs), stream=body.stream)


# --------------------------------------------------------------------------
# Speech
# --------------------------------------------------------------------------


#: Speech parameters and the engine kinds whose stages honour them.  None
#: of omnix's engines changes the speaking rate or takes voice instructions
#: today (the vLLM talker samples codec codes from the text alone, the
#: codec decoder turns codes into samples): a request that needs either is
#: refused, naming the stages, rather than answered as if it were honoured.
SPEECH_ENGINE_PARAMS: dict[str, frozenset[str]] = {
    "speed": frozenset(),
    "instructions": frozenset(),
}
_SPEECH_WHAT = {
    "speed": "can change the speaking rate; omit speed (or send 1.0)",
    "instructions": "takes voice instructions; omit instructions",
}


def _check_speech(served: Served, param: str, stages: tuple[str, ...]) -> None:
    """400 unless one of ``stages`` (the speech stages) honours ``param``."""
    can = SPEECH_ENGINE_PARAMS[param]
    if any(served.engine_of(st) in can for st in stages):
        return
    named = ", ".join(f"{st!r} ({served.engine_of(st)})" for st in stages) or "none"
    raise ApiError(
        400,
        f"{param} is not supported by pipeline {served.model!r}: none of its speech stages "
        f"[{named}] {_SPEECH_WHAT[param]}.",
        param=param,
        code="unsupported_parameter",
    )


def speech_plan(body: SpeechRequest, served: Served, *, traceparent: str = "") -> Plan:
    served.check_model(body.model)
    if body.stream is False and body.stream_format is not None:
        raise _bad(
            "stream",
            f"stream is false but stream_format is {body.stream_format!r}: a stream_format asks "
            "for a streamed response; omit stream, or omit stream_format for the whole file.",
        )
    # vLLM-Omni's ``stream: true`` alone is an SSE stream.
    stream_format = body.stream_format or ("sse" if body.stream else None)
    outputs: tuple[Modality, ...] = ("audio",)
    params = served.stage_params(body.sampling_params_list)
    speech_stages = served.media_stages(outputs, "audio")
    if body.speed != 1.0:
        _check_speech(served, "speed", speech_stages)
    if body.instructions:
        _check_speech(served, "instructions", speech_stages)
    for st in speech_stages:
        _put(
            params,
            st,
            StageParams(voice=body.voice, speed=None if body.speed == 1.0 else body.speed),
        )
    served.check_engines(params)
    _check_diffusion(served, params)
    usage = served.source_stage(outputs) if "audio" in served.pipeline.outputs else ""
    opts = {
        Opt.RENDER: RENDER_VERSION,
        Opt.STREAM: "1" if stream_format else "0",
        Opt.STREAM_FORMAT: stream_format or "",
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
    return Plan(specs=((rid, spec),), stream=bool(stream_format))


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


#: ``StageParams`` fields only a diffusers stage honours (schema v5).
DIFFUSION_PARAMS = ("negative_prompt", "true_cfg_scale", "output_format")
#: OpenAI's ``quality`` values that mean the stage's own settings; the
#: tiers (low, medium, high, hd) have no diffusers meaning and are refused.
DEFAULT_QUALITIES = frozenset({"auto", "standard"})


def _diffusion_model(served: Served, stage: str) -> DiffusionModel | None:
    """The diffusers stage's model, as its folder describes it (cached
    once read; None while the folder is not there)."""
    got = served._diffusion.get(stage)
    if got is None:
        args = served.pipeline.stage(stage).engine
        if isinstance(args, DiffusersArgs):
            got = describe_model(args)
            if got is not None:
                served._diffusion[stage] = got
    return got


def _check_diffusion(served: Served, params: dict[str, StageParams]) -> None:
    """400 for a diffusion parameter a diffusers stage's pipeline would
    ignore (``diffusers_engine.refusal``, judged on the stage's defaults
    with the request's values on top, as the engine will run it).  The
    fields only diffusers stages take, on another engine: ``check_engines``."""
    names = set(served.graph.stage_names)
    for stage, p in params.items():
        if stage not in names or served.engine_of(stage) != "diffusers":
            continue  # validate_request names the stages that exist
        model = _diffusion_model(served, stage)
        if model is None:
            continue  # the engine judges it (it raises rather than ignore)
        merged = merge_params(served.pipeline.stage(stage).sampling, p)
        refused = refusal(model, merged)
        if refused is not None:
            param, why = refused
            raise ApiError(
                400,
                f"{param} is not supported by stage {stage!r} of pipeline {served.model!r}: {why}.",
                param=param,
                code="unsupported_parameter",
            )


def _image_options(body: ImageRequest, served: Served, stage: str, files_url: str) -> None:
    """400 for OpenAI's image options this pipeline cannot honour."""
    kind = served.engine_of(stage)
    if body.quality is not None and body.quality not in DEFAULT_QUALITIES:
        raise _unsupported(
            "quality",
            f"quality {body.quality!r} has no meaning for stage {stage!r} ({kind}): a diffusion "
            "pipeline has no quality tiers. Send num_inference_steps (more steps, finer detail), "
            'or quality "auto" / "standard" for the stage\'s own settings.',
        )
    if body.style is not None:
        raise _unsupported(
            "style",
            f"style {body.style!r} has no meaning for stage {stage!r} ({kind}): describe the "
            "style in the prompt (and what to avoid in negative_prompt), and omit style.",
        )
    if body.background == "transparent":
        raise _unsupported(
            "background",
            f'background "transparent" cannot be honoured by stage {stage!r} ({kind}): its '
            'images have no alpha channel. Send "opaque" or "auto", or omit it.',
        )
    if body.response_format == "url":
        if kind != "diffusers":
            raise ApiError(
                400,
                f'response_format "url" is not supported by stage {stage!r} of pipeline '
                f"{served.model!r}: its engine ({kind}) does not produce image files to serve. "
                'Use "b64_json".',
                param="response_format",
                code="unsupported_value",
            )
        if not files_url:
            raise ApiError(
                400,
                'response_format "url" needs the request\'s Host header to build the URL; '
                'send one, or use "b64_json".',
                param="response_format",
                code="unsupported_value",
            )


def image_plan(
    body: ImageRequest, served: Served, *, traceparent: str = "", files_url: str = ""
) -> Plan:
    """``files_url``: the absolute URL ``GET /v1/files/`` answers at, as the
    client reached this server (``response_format: "url"`` needs it)."""
    served.check_model(body.model)
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
    _image_options(body, served, stage, files_url)
    params = served.stage_params(body.sampling_params_list)
    _put(
        params,
        stage,
        StageParams(
            num_inference_steps=body.steps or body.num_inference_steps,
            guidance_scale=body.guidance_scale,
            width=width,
            height=height,
            negative_prompt=body.negative_prompt,
            true_cfg_scale=body.true_cfg_scale,
            output_format=body.output_format,
        ),
    )
    served.check_engines(params)
    _check_diffusion(served, params)
    opts = {
        Opt.RENDER: RENDER_VERSION,
        Opt.STREAM: "0",
        Opt.IMAGE_STAGE: served.output_stage("image"),
        Opt.RESPONSE_FORMAT: body.response_format,
        Opt.USAGE_STAGE: stage,
    }
    if body.response_format == "url":
        opts[Opt.FILES_URL] = files_url
    if body.output_format is not None:
        opts[Opt.OUTPUT_FORMAT] = body.output_format
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
