"""``POST /v1/chat/completions``: the handler, its table row, its description.

Owns: the handler (decode the body, decode its media parts off the event
loop, plan, respond live: ``core.live``), and the route's OpenAPI
operation with its request schema narrowed to the served pipeline: its
model, its output modalities, the media parts its first stage takes, the
batch limit, the sampling extras the text stage's engine cannot honour
(null only), and the cross-field rules ``plan.py`` enforces.

Does not own the plan (``plan.py``), the bytes (``render.py``) nor any
plumbing (``omnix.http.core``).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from omnix.http.chat.plan import CONTENT_REQUIRED, chat_plan, media_parts
from omnix.http.chat.protocol import (
    UNSUPPORTED_CHAT_FIELDS,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
)
from omnix.http.chat.tools import tool_stage
from omnix.http.common import doc
from omnix.http.common.plan import DecodedBlob, Media
from omnix.http.core.body import read_body, traceparent
from omnix.http.core.live import respond
from omnix.http.core.route import DocContext, Route, Schemas
from omnix.http.core.server import Server
from omnix.http.media.parts import decode_parts
from omnix.pipelines.config import PipelineConfig


async def chat(server: Server, request: web.Request) -> web.StreamResponse:
    body = await read_body(request, ChatCompletionRequest, UNSUPPORTED_CHAT_FIELDS)
    parts = media_parts(body)
    media: Media = {}
    blobs: tuple[DecodedBlob, ...] = ()
    if parts:
        media, blobs = await decode_parts(server.media, parts)
    plan = chat_plan(
        body, server.served, traceparent=traceparent(request), media=media, blobs=blobs
    )
    return await respond(server, request, plan)


def _operation(ctx: DocContext) -> dict[str, Any] | None:
    if "text" not in ctx.pipeline.outputs:
        return None
    return doc.post(
        "Chat completion (OpenAI-compatible)",
        ChatCompletionRequest,
        {
            "description": "A chat.completion object; with stream=true an SSE stream of "
            "chat.completion.chunk objects ending with `data: [DONE]`",
            "content": {
                "application/json": {"schema": doc.ref(ChatCompletion)},
                "text/event-stream": doc.sse(doc.ref(ChatCompletionChunk), done=True),
            },
        },
        "messages may be a list of conversations (batch, one choice each, admitted together "
        "or not at all). sampling_params_list: a list aligned with the pipeline's stages or "
        "a map by stage name.",
    )


#: Chat fields that set each ``StageParams`` extra (``sampling.EXTRA_PARAMS``).
_CHAT_FIELDS: dict[str, tuple[str, ...]] = {
    "logprobs": ("logprobs", "top_logprobs"),
    "json_schema": (),
    "json_object": (),
}


def _media_parts(pipeline: PipelineConfig) -> list[str]:
    """The content part types (schema names) the pipeline's input takes."""
    media = pipeline.input_media
    parts = ["TextPart"]
    if media is not None and media.image:
        parts.append("ImageUrlPart")
    if media is not None and media.audio:
        parts += ["InputAudioPart", "AudioUrlPart"]
    return parts


def _shape_messages(schemas: Schemas, ctx: DocContext) -> dict[str, Any]:
    """Messages with the content parts the pipeline takes (content null
    only on an assistant message, as OpenAI answers); returns a batch."""
    content = {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"anyOf": [doc.ref(p) for p in _media_parts(ctx.pipeline)]}},
        ]
    }
    msg = schemas["Message"]
    msg["properties"]["content"] = doc.nullable(content)
    msg["anyOf"] = [
        {"properties": {"role": {"const": "assistant"}}},
        {
            "properties": {"role": {"enum": sorted(CONTENT_REQUIRED)}, "content": content},
            "required": ["content"],
        },
    ]
    conversation = {"type": "array", "items": doc.ref("Message"), "minItems": 1}
    batch = {"type": "array", "items": conversation, "minItems": 1, "maxItems": ctx.max_batch}
    schemas["ChatCompletionRequest"]["properties"]["messages"] = {"anyOf": [conversation, batch]}
    return batch


def _shape_sampling(props: dict[str, Any], pipeline: PipelineConfig) -> None:
    """The sampling extras the text stage's engine cannot honour: null only."""
    off = doc.cannot(pipeline, pipeline.outputs.get("text", ""))
    for field in off:
        for name in _CHAT_FIELDS.get(field, (field,)):
            props[name] = {"type": "null", "default": None}
    if "json_schema" in off:
        props["response_format"] = doc.nullable(doc.ref("TextFormat"))
    # An empty map biases nothing: any engine takes it.
    props["logit_bias"] = doc.nullable(
        doc.STAGE_PARAM_RANGES["logit_bias"]
        if "logit_bias" not in off
        else {"type": "object", "maxProperties": 0}
    )


def _rules(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """The cross-field rules ``plan.py`` enforces."""
    true = {"const": True}
    return [
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
                    "stream_options": doc.nullable({"properties": {"resumable": {"const": False}}})
                }
            },
        },
        {
            "if": {
                "properties": {"n": {"minimum": 2}, "stream": true},
                "required": ["n", "stream"],
            },
            "then": {
                "properties": {
                    "modalities": doc.nullable({"not": {"contains": {"const": "audio"}}})
                }
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
            "then": {"properties": {"modalities": doc.nullable({"contains": {"const": "text"}})}},
        },
    ]


def _shape(schemas: Schemas, ctx: DocContext) -> None:
    pipeline = ctx.pipeline
    req = schemas["ChatCompletionRequest"]
    props = req["properties"]
    batch = _shape_messages(schemas, ctx)
    modalities = [m for m in ("text", "audio") if m in pipeline.outputs]
    props["modalities"] = doc.nullable(
        {"type": "array", "items": {"enum": modalities}, "minItems": 1, "uniqueItems": True}
    )
    props["model"] = doc.model_enum(pipeline)
    props["n"] = {"type": "integer", "minimum": 1, "maximum": min(128, ctx.max_batch), "default": 1}
    props["sampling_params_list"] = doc.sampling_params_list(pipeline)
    _shape_sampling(props, pipeline)
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
    req["allOf"] = _rules(batch) + _tool_rules(props, pipeline)
    req["dependentSchemas"] = dependent


def _tool_rules(props: dict[str, Any], pipeline: PipelineConfig) -> list[dict[str, Any]]:
    """The tools the text stage takes (``tools.py`` enforces them): none
    unless it is a vLLM stage writing text; a choice other than ``none``
    needs tools; without auto tool choice, tools need a forcing choice."""
    args = tool_stage(pipeline, pipeline.outputs.get("text", ""))
    if args is None:
        props["tools"] = doc.nullable({"type": "array", "maxItems": 0})
        props["tool_choice"] = doc.nullable({"const": "none"})
        return []
    some = {"type": "array", "minItems": 1}
    rules: list[dict[str, Any]] = [
        {
            "if": {
                "required": ["tool_choice"],
                "properties": {"tool_choice": {"not": {"enum": [None, "none"]}}},
            },
            "then": {"required": ["tools"], "properties": {"tools": some}},
        }
    ]
    if not (args.enable_auto_tool_choice and args.tool_call_parser):
        rules.append(
            {
                "if": {"required": ["tools"], "properties": {"tools": some}},
                "then": {
                    "required": ["tool_choice"],
                    "properties": {"tool_choice": {"not": {"enum": [None, "auto"]}}},
                },
            }
        )
    return rules


CHAT = Route(
    "POST",
    "/v1/chat/completions",
    chat,
    _operation,
    submits="json",
    types=(ChatCompletionRequest, ChatCompletion, ChatCompletionChunk),
    shape=_shape,
)
