"""``POST /v1/completions``: the handler, its table row, its description.

Owns: the handler (a pipeline that cannot take a raw prompt refuses
before anything else; token-id prompts get the stage's tokenizer), and
the route's OpenAPI operation, published only for a pipeline whose text
stage takes a raw prompt (``plan.completion_stage``), with its request
schema as ``plan.completion_plan`` takes it.

Does not own the plan (``plan.py``) nor the bytes (``render.py``).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from omnix.http.common import doc
from omnix.http.common.plan import PlanContext
from omnix.http.completions.plan import completion_plan, completion_stage
from omnix.http.completions.protocol import Completion, CompletionRequest
from omnix.http.core.body import read_body, traceparent
from omnix.http.core.errors import ApiError
from omnix.http.core.live import respond
from omnix.http.core.route import DocContext, Route, Schemas
from omnix.http.core.server import Server
from omnix.pipelines.config import PipelineConfig


async def completions(server: Server, request: web.Request) -> web.StreamResponse:
    body = await read_body(request, CompletionRequest)
    completion_stage(server.served)  # a pipeline that cannot: 400 before anything
    ids = not isinstance(body.prompt, str) and any(not isinstance(p, str) for p in body.prompt)
    plan = completion_plan(
        body,
        server.served,
        traceparent=traceparent(request),
        tokenizer=await server.tokens.tokenizer() if ids else None,
    )
    return await respond(server, request, plan)


def completions_served(pipeline: PipelineConfig) -> bool:
    """Whether ``/v1/completions`` answers for this pipeline (else 400)."""
    try:
        completion_stage(PlanContext(pipeline, new_request_id=str, new_seed=int))
    except ApiError:
        return False
    return True


def _operation(ctx: DocContext) -> dict[str, Any] | None:
    if not completions_served(ctx.pipeline):
        return None
    return doc.post(
        "Completion of a raw prompt (OpenAI's legacy API, as vLLM serves it)",
        CompletionRequest,
        {
            "description": "A text_completion object; with stream=true an SSE stream of "
            "text_completion objects ending with `data: [DONE]`",
            "content": {
                "application/json": {"schema": doc.ref(Completion)},
                "text/event-stream": doc.sse(doc.ref(Completion), done=True),
            },
        },
        "prompt: a string or token ids, sent to the text stage as is (no chat template); "
        "a list of them is a batch (one choice each, admitted together or not at all).",
    )


def _shape(schemas: Schemas, ctx: DocContext) -> None:
    """The request as ``plan.completion_plan`` takes it."""
    req = schemas["CompletionRequest"]
    props = req["properties"]
    token_id = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
    ids = {"type": "array", "items": token_id, "minItems": 1}
    text = {"type": "string", "minLength": 1}
    props["prompt"] = {
        "anyOf": [
            text,
            ids,
            {"type": "array", "items": text, "minItems": 1, "maxItems": ctx.max_batch},
            {"type": "array", "items": ids, "minItems": 1, "maxItems": ctx.max_batch},
        ]
    }
    props["model"] = doc.model_enum(ctx.pipeline)
    props["n"] = {"type": "integer", "minimum": 1, "maximum": min(128, ctx.max_batch), "default": 1}
    props["sampling_params_list"] = doc.sampling_params_list(ctx.pipeline)
    props["suffix"] = {"type": "null", "default": None}
    props["best_of"] = doc.nullable({"const": 1})
    props["logit_bias"] = doc.nullable(doc.STAGE_PARAM_RANGES["logit_bias"])
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
                    "stream_options": doc.nullable({"properties": {"resumable": {"const": False}}})
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


COMPLETIONS = Route(
    "POST",
    "/v1/completions",
    completions,
    _operation,
    submits="json",
    types=(CompletionRequest, Completion),
    shape=_shape,
)
