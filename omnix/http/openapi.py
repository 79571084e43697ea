"""GET /openapi.json: an OpenAPI 3.1 description of the HTTP API as served.

Owns: the list of routes with their summaries, parameters and responses,
for the pipeline being served (``OpenApi``): only the generation routes it
can answer are published (chat for a pipeline that produces text, speech
for audio, images for images), and the request schemas say what this
server accepts, no more and no less (its model name, its stages in
``sampling_params_list``, its output modalities, the media parts its
source stage takes, the batch limit, the cross-field rules the handlers
enforce).  A test runs schemathesis against the document: whatever it
accepts the server accepts, and the reverse.

Body schemas are generated from the msgspec Structs in ``schemas.py``
(``msgspec.json.schema_components``), then narrowed to the pipeline, so
they cannot drift from what the server decodes and encodes.  Streamed
bodies (SSE, raw audio) are described in prose: OpenAPI has no way to type
an event stream.

Does not own the routes themselves (``routes.py`` registers them; a test
checks that both lists agree).
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec
from aiohttp import web

from omnix import __version__
from omnix.engines.diffusers_engine import TRUE_CFG_PIPELINES, describe_model
from omnix.http.adapt import (
    DEFAULT_QUALITIES,
    DIFFUSION_PARAMS,
    ENGINE_PARAMS,
    EXTRA_PARAMS,
    Served,
    completion_stage,
)
from omnix.http.errors import ApiError, ErrorBody
from omnix.http.schemas import (
    CancelResult,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    Health,
    ImageRequest,
    ImagesResponse,
    ModelList,
    Readiness,
    SpeechAudioDelta,
    SpeechAudioDone,
    SpeechRequest,
    Version,
)
from omnix.pipelines.config import DiffusersArgs, PipelineConfig, engine_kind

_TYPES = (
    ChatCompletionRequest,
    ChatCompletion,
    ChatCompletionChunk,
    CompletionRequest,
    Completion,
    SpeechRequest,
    SpeechAudioDelta,
    SpeechAudioDone,
    ImageRequest,
    ImagesResponse,
    ModelList,
    Health,
    Version,
    Readiness,
    CancelResult,
    ErrorBody,
)

#: Generation routes and the output modality each needs.
GENERATION_ROUTES = {
    "/v1/chat/completions": "text",
    "/v1/audio/speech": "audio",
    "/v1/images/generations": "image",
    "/v1/completions": "text",
}
#: Published only for a pipeline whose text stage takes a raw prompt
#: (``adapt.completion_stage``: a vLLM stage reading the request itself).
COMPLETIONS = "/v1/completions"


def completions_served(pipeline: PipelineConfig) -> bool:
    """Whether ``/v1/completions`` answers for this pipeline (else 400)."""
    try:
        completion_stage(Served(pipeline, new_request_id=str, new_seed=int))
    except ApiError:
        return False
    return True


#: Routes served but not (yet) described here: a multipart form; the
#: files of url image responses (content-addressed: a client only ever
#: follows a url it was given, and no valid example exists before an image
#: is generated, so a schema-driven probe could only ever see 404s); and
#: vLLM's operational routes, outside the OpenAI API (tokenize, profiling:
#: 404 on a pipeline without a tokenizer or a server without --profile-dir).
UNDESCRIBED = frozenset(
    {
        "/v1/audio/transcriptions",
        "/v1/files/{digest}",
        "/tokenize",
        "/detokenize",
        "/start_profile",
        "/stop_profile",
    }
)


def _ref(t: type) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{t.__name__}"}


def _sse(data: dict[str, Any] | None = None, *, done: bool = False) -> dict[str, Any]:
    """``text/event-stream`` whose events' ``data`` is JSON of schema
    ``data`` (OpenAPI before 3.2: ``schema`` describes one event);
    ``done``: the last event's data is ``[DONE]``."""
    field: dict[str, Any] = {"type": "string"}
    if data is not None:
        field |= {"contentMediaType": "application/json", "contentSchema": data}
    if done:
        field = {"anyOf": [{"const": "[DONE]"}, field]}
    return {
        "schema": {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "event": {"type": "string"},
                "data": field,
            },
        }
    }


def _json(t: type, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(t)}}}


_ERRORS = {
    "400": _json(
        ErrorBody,
        "Invalid request (bad JSON, wrong type, unknown field, out of range, a parameter or "
        "input this pipeline does not take, a batch over the limit, a bad X-Request-Id)",
    ),
    "403": _json(ErrorBody, "A browser origin the server does not allow (--allowed-origins)"),
    "404": _json(ErrorBody, "Unknown model"),
    "409": _json(ErrorBody, "The X-Request-Id is already in use"),
    "413": _json(ErrorBody, "Body larger than the server's limit"),
    "415": _json(ErrorBody, "The body was not sent as Content-Type: application/json"),
    "429": _json(ErrorBody, "Overloaded: retry after Retry-After seconds"),
    "500": _json(ErrorBody, "The request failed in a stage"),
    "503": _json(ErrorBody, "Not ready, or shutting down: retry after Retry-After seconds"),
    "504": _json(ErrorBody, "A stage timed out"),
}
_UNAUTHORIZED = _json(ErrorBody, "Missing or wrong API key")
_RID = {
    "X-Request-Id": {
        "description": "The omnix request id(s), comma-separated for a batch",
        "schema": {"type": "string"},
    }
}
_CLIENT_RID = {
    "name": "X-Request-Id",
    "in": "header",
    "required": False,
    "description": "Names the request (a batch's members get -0, -1...); must not be in use",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:\\-]{0,127}$"},
}
_ID_PARAM = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
#: A log position (``/events``), and an SSE event id of a response (``POS``
#: or ``POS.N``, ``/stream``).
_POSITION = {"type": "string", "pattern": "^[0-9]{1,18}$"}
_EVENT_ID = {"type": "string", "pattern": "^[0-9]{1,18}([.][0-9]{1,4})?$"}


def _post(summary: str, body: type, ok: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "description": description,
            "parameters": [_CLIENT_RID],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref(body)}},
            },
            "responses": {"200": {**ok, "headers": _RID}, **_ERRORS},
        }
    }


def _get(
    summary: str,
    ok: dict[str, Any],
    *,
    params: list[dict[str, Any]] | None = None,
    errors: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A GET operation; ``errors`` are its responses by status code."""
    op: dict[str, Any] = {"summary": summary, "responses": {"200": ok, **(errors or {})}}
    if params:
        op["parameters"] = params
    return {"get": op}


# -- request schemas narrowed to the pipeline -----------------------------------

_NULL = {"type": "null"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, _NULL], "default": None}


#: The ranges ``validate_request`` enforces on a stage's parameters.
_STAGE_PARAM_RANGES: dict[str, dict[str, Any]] = {
    "temperature": {"type": "number", "minimum": 0.0, "maximum": 2.0},
    "top_p": {"type": "number", "exclusiveMinimum": 0.0, "maximum": 1.0},
    "top_k": {"type": "integer", "minimum": -1},
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
    "seed": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
    "num_inference_steps": {"type": "integer", "minimum": 1, "maximum": 1000},
    "width": {"type": "integer", "minimum": 8, "maximum": 4096, "multipleOf": 8},
    "height": {"type": "integer", "minimum": 8, "maximum": 4096, "multipleOf": 8},
    "speed": {"type": "number", "minimum": 0.25, "maximum": 4.0},
    # schema v5 extras
    "min_tokens": {"type": "integer", "minimum": 0, "maximum": 1_000_000},
    "min_p": {"type": "number", "minimum": 0.0, "maximum": 1.0},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0.0, "maximum": 10.0},
    "frequency_penalty": {"type": "number", "minimum": -2.0, "maximum": 2.0},
    "presence_penalty": {"type": "number", "minimum": -2.0, "maximum": 2.0},
    "stop_token_ids": {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 64},
    "logit_bias": {
        "type": "object",
        "propertyNames": {"pattern": "^[0-9]{1,9}$"},
        "additionalProperties": {"type": "number", "minimum": -100.0, "maximum": 100.0},
        "maxProperties": 300,
    },
    "logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
    # JSON text of a JSON Schema object
    "json_schema": {"type": "string", "pattern": "^\\s*[{]"},
}

#: Chat fields that set each ``StageParams`` extra (``adapt.EXTRA_PARAMS``).
_CHAT_FIELDS: dict[str, tuple[str, ...]] = {
    "logprobs": ("logprobs", "top_logprobs"),
    "json_schema": (),
    "json_object": (),
}

#: Roles whose ``content`` may not be null (``adapt._CONTENT_REQUIRED``).
_CONTENT_ROLES = ["developer", "system", "tool", "user"]


def _cannot(pipeline: PipelineConfig, stage: str) -> list[str]:
    """The ``StageParams`` extras the stage's engine cannot honour."""
    kinds = {st.name: engine_kind(st.engine) for st in pipeline.stages}
    can = ENGINE_PARAMS.get(kinds.get(stage, ""), frozenset())
    off = [f for f in EXTRA_PARAMS if f not in can]
    if kinds.get(stage) != "diffusers" and "diffusers" in kinds.values():
        # adapt.DIFFUSION_PARAMS: diffusers stages only (a pipeline without
        # one nulls them in StageParams itself: _shape_speech_image)
        off += DIFFUSION_PARAMS
    return off


def _stage_params(pipeline: PipelineConfig, stage: str) -> dict[str, Any]:
    ref = {"$ref": "#/components/schemas/StageParams"}
    off = _cannot(pipeline, stage)
    if not off:
        return ref
    return {"allOf": [ref, {"properties": {f: {"type": "null"} for f in off}}]}


def _unique(schemas: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for sc in schemas:
        if sc not in out:
            out.append(sc)
    return out


def _sampling_params_list(pipeline: PipelineConfig, stages: list[str]) -> dict[str, Any]:
    """A list aligned with the stages, or a map from stage name."""
    per = {s: _stage_params(pipeline, s) for s in stages}
    return _nullable(
        {
            "anyOf": [
                {
                    "type": "array",
                    "items": {"anyOf": [*_unique(per.values()), _NULL]},
                    "minItems": len(stages),
                    "maxItems": len(stages),
                },
                {
                    "type": "object",
                    "properties": per,
                    "additionalProperties": False,
                },
            ]
        }
    )


def _media_parts(pipeline: PipelineConfig) -> list[str]:
    """The content part types (schema names) the pipeline's input takes."""
    media = pipeline.input_media
    parts = ["TextPart"]
    if media is not None and media.image:
        parts.append("ImageUrlPart")
    if media is not None and media.audio:
        parts += ["InputAudioPart", "AudioUrlPart"]
    return parts


def _shape_chat(
    schemas: dict[str, Any], pipeline: PipelineConfig, stages: list[str], max_batch: int
) -> None:
    req = schemas["ChatCompletionRequest"]
    props = req["properties"]
    parts = _media_parts(pipeline)
    content = {
        "anyOf": [
            {"type": "string"},
            {
                "type": "array",
                "items": {
                    "anyOf": [{"$ref": f"#/components/schemas/{p}"} for p in parts],
                },
            },
        ]
    }
    msg = schemas["Message"]
    msg["properties"]["content"] = _nullable(content)
    # content: null only on an assistant message (as OpenAI answers).
    msg["anyOf"] = [
        {"properties": {"role": {"const": "assistant"}}},
        {
            "properties": {"role": {"enum": _CONTENT_ROLES}, "content": content},
            "required": ["content"],
        },
    ]
    message = {"$ref": "#/components/schemas/Message"}
    conversation = {"type": "array", "items": message, "minItems": 1}
    batch = {"type": "array", "items": conversation, "minItems": 1, "maxItems": max_batch}
    props["messages"] = {"anyOf": [conversation, batch]}
    modalities = [m for m in ("text", "audio") if m in pipeline.outputs]
    props["modalities"] = _nullable(
        {"type": "array", "items": {"enum": modalities}, "minItems": 1, "uniqueItems": True}
    )
    props["model"] = {"enum": ["", pipeline.name], "default": ""}
    props["n"] = {"type": "integer", "minimum": 1, "maximum": min(128, max_batch), "default": 1}
    props["sampling_params_list"] = _sampling_params_list(pipeline, stages)
    # The sampling extras the text stage's engine cannot honour: null only.
    text_stage = pipeline.outputs.get("text", "")
    for field in _cannot(pipeline, text_stage):
        for name in _CHAT_FIELDS.get(field, (field,)):
            props[name] = {"type": "null", "default": None}
    if "json_schema" in _cannot(pipeline, text_stage):
        props["response_format"] = _nullable({"$ref": "#/components/schemas/TextFormat"})
    # An empty map biases nothing: any engine takes it.
    props["logit_bias"] = _nullable(
        _STAGE_PARAM_RANGES["logit_bias"]
        if "logit_bias" not in _cannot(pipeline, text_stage)
        else {"type": "object", "maxProperties": 0}
    )
    true = {"const": True}
    rules: list[dict[str, Any]] = [
        # A batch is not streamed, nor sampled n > 1 times.
        {
            "if": {"properties": {"messages": batch}, "required": ["messages"]},
            "then": {"properties": {"stream": {"const": False}, "n": {"const": 1}}},
        },
        # n > 1: not resumable, nor streamed with audio.
        {
            "if": {"properties": {"n": {"minimum": 2}}, "required": ["n"]},
            "then": {
                "properties": {
                    "stream_options": _nullable({"properties": {"resumable": {"const": False}}})
                }
            },
        },
        {
            "if": {
                "properties": {"n": {"minimum": 2}, "stream": true},
                "required": ["n", "stream"],
            },
            "then": {
                "properties": {"modalities": _nullable({"not": {"contains": {"const": "audio"}}})}
            },
        },
        # top_logprobs needs logprobs; logprobs need the text output.
        {
            "if": {
                "required": ["top_logprobs"],
                "properties": {"top_logprobs": {"type": "integer"}},
            },
            "then": {"required": ["logprobs"], "properties": {"logprobs": true}},
        },
        {
            "if": {"required": ["logprobs"], "properties": {"logprobs": true}},
            "then": {"properties": {"modalities": _nullable({"contains": {"const": "text"}})}},
        },
    ]
    dependent: dict[str, Any] = {
        "stream_options": {"properties": {"stream": {"const": True}}, "required": ["stream"]},
    }
    if "audio" in modalities:
        dependent["audio"] = {
            "properties": {"modalities": {"type": "array", "contains": {"const": "audio"}}},
            "required": ["modalities"],
        }
    else:
        del props["audio"]
    req["allOf"] = rules
    req["dependentSchemas"] = dependent


def _shape_completions(
    schemas: dict[str, Any], pipeline: PipelineConfig, stages: list[str], max_batch: int
) -> None:
    """``/v1/completions`` as ``adapt.completion_plan`` takes it."""
    req = schemas["CompletionRequest"]
    props = req["properties"]
    token_id = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
    ids = {"type": "array", "items": token_id, "minItems": 1}
    text = {"type": "string", "minLength": 1}
    props["prompt"] = {
        "anyOf": [
            text,
            ids,
            {"type": "array", "items": text, "minItems": 1, "maxItems": max_batch},
            {"type": "array", "items": ids, "minItems": 1, "maxItems": max_batch},
        ]
    }
    props["model"] = {"enum": ["", pipeline.name], "default": ""}
    props["n"] = {"type": "integer", "minimum": 1, "maximum": min(128, max_batch), "default": 1}
    props["sampling_params_list"] = _sampling_params_list(pipeline, stages)
    props["suffix"] = {"type": "null", "default": None}
    props["best_of"] = _nullable({"const": 1})
    props["logit_bias"] = _nullable(_STAGE_PARAM_RANGES["logit_bias"])
    batch = {"type": "array", "minItems": 2, "items": {"type": ["string", "array"]}}
    req["allOf"] = [
        # A batch (a list of strings or of id lists, two or more) is not
        # streamed, nor sampled n > 1 times.
        {
            "if": {"properties": {"prompt": batch}, "required": ["prompt"]},
            "then": {"properties": {"stream": {"const": False}, "n": {"const": 1}}},
        },
        {
            "if": {"properties": {"n": {"minimum": 2}}, "required": ["n"]},
            "then": {
                "properties": {
                    "stream_options": _nullable({"properties": {"resumable": {"const": False}}})
                }
            },
        },
        # echo and logprobs: one or the other.
        {
            "if": {"properties": {"echo": {"const": True}}, "required": ["echo"]},
            "then": {"properties": {"logprobs": {"type": "null"}}},
        },
    ]
    req["dependentSchemas"] = {
        "stream_options": {"properties": {"stream": {"const": True}}, "required": ["stream"]},
    }


def _shape_speech_image(schemas: dict[str, Any], pipeline: PipelineConfig) -> None:
    """Speech and image fields as this pipeline takes them (``adapt``'s
    ``_check_speech``, ``_image_options``, ``_check_diffusion``)."""
    stage_params = schemas["StageParams"]["properties"]
    if not any(engine_kind(st.engine) == "diffusers" for st in pipeline.stages):
        for field in DIFFUSION_PARAMS:
            stage_params[field] = {"type": "null", "default": None}
    # No engine honours a speaking rate, on any route (adapt.SPEECH_ENGINE_PARAMS).
    stage_params["speed"] = _nullable({"const": 1.0})
    speech = schemas["SpeechRequest"]
    sp = speech["properties"]
    # No engine honours a speaking rate or voice instructions (adapt.SPEECH_ENGINE_PARAMS).
    sp["speed"] = {"const": 1.0, "default": 1.0}
    sp["instructions"] = _nullable({"const": ""})
    # stream: false contradicts a stream_format.
    speech["not"] = {
        "properties": {"stream": {"const": False}, "stream_format": {"enum": ["audio", "sse"]}},
        "required": ["stream", "stream_format"],
    }
    image = schemas["ImageRequest"]
    ip = image["properties"]
    ip["quality"] = _nullable({"enum": sorted(DEFAULT_QUALITIES)})
    del ip["style"]
    ip["background"] = _nullable({"enum": ["auto", "opaque"]})
    stage = pipeline.outputs.get("image", "")
    args = pipeline.stage(stage).engine if stage else None
    if not isinstance(args, DiffusersArgs):
        ip["response_format"] = {"const": "b64_json", "default": "b64_json"}
        for field in DIFFUSION_PARAMS:
            del ip[field]
        return
    model = describe_model(args)
    if model is None or model.pipeline not in TRUE_CFG_PIPELINES:
        return
    if model.guidance_embeds is False:
        del ip["guidance_scale"]
    # true CFG: a negative prompt and a scale above 1, together or neither
    ip["negative_prompt"] = {"type": "string", "maxLength": 32000}
    ip["true_cfg_scale"] = {"type": "number", "exclusiveMinimum": 1.0, "maximum": 100.0}
    image["dependentRequired"] = {
        "negative_prompt": ["true_cfg_scale"],
        "true_cfg_scale": ["negative_prompt"],
    }


def _shape_requests(schemas: dict[str, Any], pipeline: PipelineConfig, max_batch: int) -> None:
    stages = [st.name for st in pipeline.stages]
    params = schemas["StageParams"]["properties"]
    for name, rng in _STAGE_PARAM_RANGES.items():
        params[name] = _nullable(rng)
    _shape_chat(schemas, pipeline, stages, max_batch)
    _shape_completions(schemas, pipeline, stages, max_batch)
    for name in ("SpeechRequest", "ImageRequest"):
        props = schemas[name]["properties"]
        props["model"] = {"enum": ["", pipeline.name], "default": ""}
        props["sampling_params_list"] = _sampling_params_list(pipeline, stages)
    _shape_speech_image(schemas, pipeline)
    image = schemas["ImageRequest"]
    # steps is an alias of num_inference_steps: one of them.
    image["not"] = {"required": ["steps", "num_inference_steps"]}
    # WxH, each a multiple of 8 in 8..4096 (adapt._size).
    side = "(" + "|".join(str(v) for v in range(4096, 7, -8)) + ")"
    image["properties"]["size"] = _nullable({"type": "string", "pattern": f"^{side}x{side}$"})


# -- the document ----------------------------------------------------------------


class OpenApi:
    """The document for one served pipeline, built once."""

    def __init__(
        self, pipeline: PipelineConfig, *, max_batch: int, auth: bool = False, metrics: bool = True
    ) -> None:
        self.pipeline = pipeline
        self.max_batch = max_batch
        self.auth = auth
        self.metrics = metrics
        self._body: bytes | None = None

    def published(self, path: str) -> bool:
        """Whether ``path`` is in the document: a generation route only
        when the pipeline produces what it returns, /metrics only when the
        server has telemetry."""
        if path in UNDESCRIBED or (path == "/metrics" and not self.metrics):
            return False
        need = GENERATION_ROUTES.get(path)
        if path == COMPLETIONS and not completions_served(self.pipeline):
            return False
        return need is None or need in self.pipeline.outputs

    def document(self) -> dict[str, Any]:
        _, components = msgspec.json.schema_components(
            _TYPES, ref_template="#/components/schemas/{name}"
        )
        schemas = copy.deepcopy(components)
        _shape_requests(schemas, self.pipeline, self.max_batch)
        paths = {p: op for p, op in _paths().items() if self.published(p)}
        if self.auth:
            for p, item in paths.items():
                for op in item.values():
                    if p == "/health":
                        op["security"] = []
                    else:
                        op["responses"]["401"] = _UNAUTHORIZED
        doc: dict[str, Any] = {
            "openapi": "3.1.0",
            "info": {
                "title": "omnix",
                "version": __version__,
                "description": f"OpenAI-compatible API of the omnix pipeline {self.pipeline.name!r}, "
                "plus omnix's request introspection routes. See docs/http.md.",
            },
            "paths": paths,
            "components": {"schemas": schemas},
        }
        if self.auth:
            doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            doc["security"] = [{"bearer": []}]
        return doc

    async def handle(self, request: web.Request) -> web.Response:
        if self._body is None:
            self._body = msgspec.json.encode(self.document())
        return web.Response(body=self._body, content_type="application/json")


def _paths() -> dict[str, Any]:
    not_found = _json(ErrorBody, "No such request")
    return {
        "/v1/chat/completions": _post(
            "Chat completion (OpenAI-compatible)",
            ChatCompletionRequest,
            {
                "description": "A chat.completion object; with stream=true an SSE stream of "
                "chat.completion.chunk objects ending with `data: [DONE]`",
                "content": {
                    "application/json": {"schema": _ref(ChatCompletion)},
                    "text/event-stream": _sse(_ref(ChatCompletionChunk), done=True),
                },
            },
            "messages may be a list of conversations (batch, one choice each, admitted together "
            "or not at all). sampling_params_list: a list aligned with the pipeline's stages or "
            "a map by stage name.",
        ),
        "/v1/completions": _post(
            "Completion of a raw prompt (OpenAI's legacy API, as vLLM serves it)",
            CompletionRequest,
            {
                "description": "A text_completion object; with stream=true an SSE stream of "
                "text_completion objects ending with `data: [DONE]`",
                "content": {
                    "application/json": {"schema": _ref(Completion)},
                    "text/event-stream": _sse(_ref(Completion), done=True),
                },
            },
            "prompt: a string or token ids, sent to the text stage as is (no chat template); "
            "a list of them is a batch (one choice each, admitted together or not at all).",
        ),
        "/v1/audio/speech": _post(
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
                    "text/event-stream": _sse(
                        {"oneOf": [_ref(SpeechAudioDelta), _ref(SpeechAudioDone)]}
                    ),
                },
            },
        ),
        "/v1/images/generations": _post(
            "Image generation (OpenAI-compatible)",
            ImageRequest,
            _json(
                ImagesResponse, "Generated images: base64 files, or URLs of GET /v1/files/{digest}"
            ),
            "n > 1 submits n requests, admitted together or not at all.",
        ),
        "/v1/models": _get("The served pipeline as a model", _json(ModelList, "Model list")),
        "/version": _get("The server's version (as vLLM answers it)", _json(Version, "Version")),
        "/health": _get("Liveness: the process answers", _json(Health, "Alive")),
        "/ready": _get(
            "Readiness: every stage has a ready replica",
            _json(Readiness, "Ready"),
            errors={"503": _json(Readiness, "Not ready")},
        ),
        "/metrics": _get(
            "Prometheus exposition of omnix's metrics",
            {"description": "Prometheus text format", "content": {"text/plain": {}}},
        ),
        "/v1/requests/{id}": _get(
            "A request's state, folded from its events",
            {"description": "RequestState as a JSON object", "content": {"application/json": {}}},
            params=[_ID_PARAM],
            errors={"404": not_found},
        ),
        "/v1/requests/{id}/events": _get(
            "SSE tail of a request's events (resumable with Last-Event-ID)",
            {
                "description": "`id:` is the log position, `event:` the type tag, `data:` the event "
                "as msgspec JSON; ends after the terminal event",
                "content": {"text/event-stream": _sse()},
            },
            params=[
                _ID_PARAM,
                {"name": "Last-Event-ID", "in": "header", "schema": _POSITION},
                {"name": "last_event_id", "in": "query", "schema": _POSITION},
                {"name": "format", "in": "query", "schema": {"enum": ["array", "object"]}},
            ],
            errors={
                "400": _json(ErrorBody, "Last-Event-ID is not an event id"),
                "404": not_found,
            },
        ),
        "/v1/requests/{id}/stream": _get(
            "The request's streamed response again: whole, or the rest after Last-Event-ID",
            {
                "description": "The same bytes as the original response (chat or speech SSE, "
                "raw audio from the start), live to the request's end; after Last-Event-ID, "
                "what followed that SSE event",
                "content": {"text/event-stream": _sse(), "audio/wav": {}, "audio/pcm": {}},
            },
            params=[
                _ID_PARAM,
                {"name": "Last-Event-ID", "in": "header", "schema": _EVENT_ID},
                {"name": "last_event_id", "in": "query", "schema": _EVENT_ID},
            ],
            errors={
                "400": _json(ErrorBody, "Last-Event-ID is not an event id"),
                "404": not_found,
                "409": _json(
                    ErrorBody,
                    "The request was not streamed, or its response has no such event",
                ),
            },
        ),
        "/v1/requests/{id}/cancel": {
            "post": {
                "summary": "Cancel a request (every active stage is aborted)",
                "parameters": [_ID_PARAM],
                "responses": {
                    "200": _json(CancelResult, "Cancel requested (or already ended)"),
                    "403": _ERRORS["403"],
                    "404": not_found,
                },
            }
        },
        "/v1/requests/{id}/trace": _get(
            "Download a replayable trace of the request",
            {"description": "Trace file", "content": {"application/octet-stream": {}}},
            params=[_ID_PARAM],
            errors={
                "404": not_found,
                "409": _json(ErrorBody, "Still running"),
                "501": _json(ErrorBody, "Not available"),
            },
        ),
        "/openapi.json": _get(
            "This document", {"description": "OpenAPI 3.1", "content": {"application/json": {}}}
        ),
    }
