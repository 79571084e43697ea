"""``POST /v1/images/generations`` and ``POST /v1/images/edits``: the
handlers, their table rows, the generations' description.

Owns: the generations handler (the absolute URL of ``GET /v1/files/`` as
the client reached this server, for ``url`` answers: ``files_url``), its
OpenAPI operation, published for a pipeline that makes images, with its
request schema as this pipeline takes it (what a diffusers stage's model,
as its folder describes it, can honour); the edits row (its handler is
``edits.py``'s; a multipart form, which the document leaves out).

Does not own the plans (``plan.py``, ``edits.py``) nor the bytes
(``render.py``).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from omnix.engines.diffusers_model import TRUE_CFG_PIPELINES, describe_model
from omnix.http.common import doc
from omnix.http.common.sampling import DIFFUSION_PARAMS
from omnix.http.core.body import files_url, read_body, traceparent
from omnix.http.core.live import respond
from omnix.http.core.route import DocContext, Route, Schemas, Undescribed
from omnix.http.core.server import Server
from omnix.http.images import edits as edits_room
from omnix.http.images.plan import DEFAULT_QUALITIES, image_plan
from omnix.http.images.protocol import ImageRequest, ImagesResponse, ImageStreamEvent
from omnix.pipelines.config import DiffusersArgs, PipelineConfig
from omnix.pipelines.families import PREVIEW_FAMILIES


async def images(server: Server, request: web.Request) -> web.StreamResponse:
    body = await read_body(request, ImageRequest)
    plan = image_plan(
        body, server.served, traceparent=traceparent(request), files_url=files_url(request)
    )
    return await respond(server, request, plan)


def _operation(ctx: DocContext) -> dict[str, Any] | None:
    if "image" not in ctx.pipeline.outputs:
        return None
    return doc.post(
        "Image generation (OpenAI-compatible)",
        ImageRequest,
        {
            "description": "Generated images: base64 files, or URLs of GET /v1/files/{digest}; "
            "stream=true: image_generation.partial_image events, then "
            "image_generation.completed",
            "content": {
                "application/json": {"schema": doc.ref(ImagesResponse)},
                "text/event-stream": doc.sse(doc.ref(ImageStreamEvent)),
            },
        },
        "n > 1 submits n requests, admitted together or not at all.",
    )


def _shape_diffusion(image: dict[str, Any], pipeline: PipelineConfig) -> None:
    """The diffusion fields as the image stage's model takes them."""
    ip = image["properties"]
    stage = pipeline.outputs.get("image", "")
    args = pipeline.stage(stage).engine if stage else None
    if not isinstance(args, DiffusersArgs):
        ip["response_format"] = {"const": "b64_json", "default": "b64_json"}
        for field in DIFFUSION_PARAMS:
            ip.pop(field, None)
        return
    model = describe_model(args)
    if model is not None and model.pipeline not in PREVIEW_FAMILIES:
        ip.pop("partial_images", None)  # sampling.check_diffusion refuses it
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


def _shape(schemas: Schemas, ctx: DocContext) -> None:
    """Image fields as this pipeline takes them (``plan._image_options``,
    ``sampling.check_diffusion``)."""
    pipeline = ctx.pipeline
    image = schemas["ImageRequest"]
    ip = image["properties"]
    ip["model"] = doc.model_enum(pipeline)
    ip["sampling_params_list"] = doc.sampling_params_list(pipeline)
    ip["quality"] = doc.nullable({"enum": sorted(DEFAULT_QUALITIES)})
    del ip["style"]
    ip["background"] = doc.nullable({"enum": ["auto", "opaque"]})
    _shape_diffusion(image, pipeline)
    # steps is an alias of num_inference_steps: one of them.
    image["not"] = {"required": ["steps", "num_inference_steps"]}
    # plan._image_options: a stream is of one image; partial images are streamed.
    streamed = {"required": ["stream"], "properties": {"stream": {"const": True}}}
    image["allOf"] = [
        {"if": streamed, "then": {"properties": {"n": {"maximum": 1}}}},
        {
            "if": {
                "required": ["partial_images"],
                "properties": {"partial_images": {"type": "integer", "minimum": 1}},
            },
            "then": streamed,
        },
    ]
    # WxH, each a multiple of 8 in 8..4096 (plan._size).
    side = "(" + "|".join(str(v) for v in range(4096, 7, -8)) + ")"
    ip["size"] = doc.nullable({"type": "string", "pattern": f"^{side}x{side}$"})


IMAGES = Route(
    "POST",
    "/v1/images/generations",
    images,
    _operation,
    submits="json",
    types=(ImageRequest, ImagesResponse, ImageStreamEvent),
    shape=_shape,
)


EDITS = Route(
    "POST",
    "/v1/images/edits",
    edits_room.edits,
    Undescribed("a multipart form, which the document's JSON schemas do not describe"),
    submits="form",
)
