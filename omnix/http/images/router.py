"""``POST /v1/images/generations``: the handler, its table row, its description.

Owns: the handler (the absolute URL of ``GET /v1/files/`` as the client
reached this server, for ``url`` answers: ``files_url``), and the route's
OpenAPI operation, published for a pipeline that makes images, with its
request schema as this pipeline takes it (what a diffusers stage's model,
as its folder describes it, can honour).

Does not own the plan (``plan.py``) nor the bytes (``render.py``).
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from omnix.engines.diffusers_model import TRUE_CFG_PIPELINES, describe_model
from omnix.http.common import doc
from omnix.http.common.sampling import DIFFUSION_PARAMS
from omnix.http.core.body import read_body, traceparent
from omnix.http.core.live import respond
from omnix.http.core.route import DocContext, Route, Schemas
from omnix.http.core.server import Server
from omnix.http.images.plan import DEFAULT_QUALITIES, image_plan
from omnix.http.images.protocol import ImageRequest, ImagesResponse
from omnix.pipelines.config import DiffusersArgs, PipelineConfig

#: A Host header usable in an absolute URL: a name or IPv4 address, or a
#: bracketed IPv6 address, and an optional port.
_HOST = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?$")


def files_url(request: web.Request) -> str:
    """The absolute URL of ``GET /v1/files/`` as the client reached this
    server (its Host header), "" when the Host is not usable."""
    host = request.host
    if not host or not _HOST.match(host):
        return ""
    return f"{request.scheme}://{host}/v1/files/"


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
        doc.json_body(
            ImagesResponse, "Generated images: base64 files, or URLs of GET /v1/files/{digest}"
        ),
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
    # WxH, each a multiple of 8 in 8..4096 (plan._size).
    side = "(" + "|".join(str(v) for v in range(4096, 7, -8)) + ")"
    ip["size"] = doc.nullable({"type": "string", "pattern": f"^{side}x{side}$"})


IMAGES = Route(
    "POST",
    "/v1/images/generations",
    images,
    _operation,
    submits="json",
    types=(ImageRequest, ImagesResponse),
    shape=_shape,
)
