"""An image generation or edit body -> the requests it submits.

Owns: the mapping of an ``ImageRequest`` (generations) or an
``ImageEditForm`` with its decoded images and mask (edits) onto
``RequestSpec``s (``n`` > 1: ``n`` requests of a group, seeds ``seed``,
``seed+1``...), its size and diffusion parameters put on the image stage,
the 400 for OpenAI's image options this pipeline cannot honour (quality
tiers, style, transparency, ``url`` answers without a diffusers stage or
a usable Host, a stream of several images, partial images without a
stream), and the ``ImageOptions`` the response renders from.  An edit's
spec holds one user message: the prompt, its images (``MediaPart`` kind
``image``) and its mask (kind ``mask``), so the engine gets them as the
source stage's input.

Does not own admission (``core.submit``), reading an edit's form and
checking its files (``edits.py``) nor the response's bytes (``render.py``).
"""

from __future__ import annotations

from typing import Final

import msgspec

from omnix.events.options import API_IMAGE_EDITS, API_IMAGES, ImageOptions
from omnix.events.types import ChatMessage, MediaPart, Modality, RequestSpec, StageParams
from omnix.http.common.plan import DecodedBlob, Plan, PlanContext, group_ids, member
from omnix.http.common.rendering import RENDER_VERSION
from omnix.http.common.sampling import (
    bad,
    check_diffusion,
    check_engines,
    put,
    stage_params,
    unsupported,
)
from omnix.http.core.errors import ApiError
from omnix.http.images.protocol import ImageEditForm, ImageRequest

#: OpenAI's ``quality`` values that mean the stage's own settings; the
#: tiers (low, medium, high, hd) have no diffusers meaning and are refused.
DEFAULT_QUALITIES: Final = frozenset({"auto", "standard"})

ImageBody = ImageRequest | ImageEditForm


class Edit(msgspec.Struct, frozen=True):
    """An edit's inputs: its decoded images and mask as the spec's media
    parts (in the form's order, the mask last), their arrays, and the
    first image's size (what ``size`` auto makes, any width: the engine
    runs at the model's multiple and resizes back)."""

    parts: tuple[MediaPart, ...]
    blobs: tuple[DecodedBlob, ...]
    width: int
    height: int


def parse_size(size: str, param: str = "size") -> tuple[int, int]:
    w, h = (int(v) for v in size.split("x"))
    for v in (w, h):
        if not (8 <= v <= 4096 and v % 8 == 0):
            raise bad(
                param,
                f"size {size!r}: width and height must be multiples of 8 between 8 and 4096 "
                "(e.g. 64x64).",
            )
    return w, h


def _image_options(body: ImageBody, served: PlanContext, stage: str, files_url: str) -> None:
    """400 for OpenAI's image options this pipeline cannot honour."""
    kind = served.engine_of(stage)
    if body.quality is not None and body.quality not in DEFAULT_QUALITIES:
        raise unsupported(
            "quality",
            f"quality {body.quality!r} has no meaning for stage {stage!r} ({kind}): a diffusion "
            "pipeline has no quality tiers. Send num_inference_steps (more steps, finer detail), "
            'or quality "auto" / "standard" for the stage\'s own settings.',
        )
    if isinstance(body, ImageRequest) and body.style is not None:
        raise unsupported(
            "style",
            f"style {body.style!r} has no meaning for stage {stage!r} ({kind}): describe the "
            "style in the prompt (and what to avoid in negative_prompt), and omit style.",
        )
    if body.background == "transparent":
        raise unsupported(
            "background",
            f'background "transparent" cannot be honoured by stage {stage!r} ({kind}): its '
            'images have no alpha channel. Send "opaque" or "auto", or omit it.',
        )
    if body.stream and body.n > 1:
        raise ApiError(
            400,
            f"stream=true sends one image's partial and completed events; n={body.n} would "
            "interleave several. Send n=1 to stream, or stream=false for n images.",
            param="stream",
            code="unsupported_value",
        )
    if body.partial_images and not body.stream:
        raise ApiError(
            400,
            "partial_images are streamed events: send stream=true with them, or omit them.",
            param="partial_images",
            code="invalid_value",
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


def _steps(body: ImageBody) -> int | None:
    if (
        body.steps is not None
        and body.num_inference_steps is not None
        and body.steps != body.num_inference_steps
    ):
        raise bad("steps", "steps and num_inference_steps disagree: send one of them.")
    return body.steps or body.num_inference_steps


def _params(
    body: ImageBody,
    served: PlanContext,
    stage: str,
    steps: int | None,
    width: int | None,
    height: int | None,
) -> dict[str, StageParams]:
    """Every stage's parameters: ``sampling_params_list`` (generations),
    the body's diffusion fields on the image stage; each checked against
    the engine that will run it."""
    given = body.sampling_params_list if isinstance(body, ImageRequest) else None
    params = stage_params(served, given)
    put(
        params,
        stage,
        StageParams(
            num_inference_steps=steps,
            guidance_scale=body.guidance_scale,
            width=width,
            height=height,
            negative_prompt=body.negative_prompt,
            true_cfg_scale=body.true_cfg_scale,
            output_format=body.output_format,
            strength=body.strength if isinstance(body, ImageEditForm) else None,
            partial_images=body.partial_images or None,
        ),
    )
    check_engines(served, params)
    check_diffusion(served, params)
    return params


def image_plan(
    body: ImageBody,
    served: PlanContext,
    *,
    traceparent: str = "",
    files_url: str = "",
    edit: Edit | None = None,
) -> Plan:
    """``files_url``: the absolute URL ``GET /v1/files/`` answers at, as the
    client reached this server (``response_format: "url"`` needs it);
    ``edit``: an edit's images and mask (``body`` is its form)."""
    served.check_model(body.model)
    steps = _steps(body)
    width = height = None
    if body.size is not None and body.size != "auto":
        width, height = parse_size(body.size)
    outputs: tuple[Modality, ...] = ("image",)
    stage = served.output_stage("image") or served.source_stage(outputs)
    # The size the images come at: asked, else the stage's, else (an edit)
    # the first image's, which the engine takes when no width is given.
    names = served.graph.stage_names
    defaults = served.pipeline.stage(stage).sampling if stage in names else StageParams()
    shown = (width or defaults.width, height or defaults.height)
    if edit is not None and not all(shown):
        shown = (edit.width, edit.height)
    _image_options(body, served, stage, files_url)
    params = _params(body, served, stage, steps, width, height)
    seed = served.seed(body.seed)
    gid, rids = group_ids(served, body.n)
    messages: tuple[ChatMessage, ...] = ()
    if edit is not None:
        messages = (ChatMessage(role="user", content=body.prompt, media=edit.parts),)
    size = f"{shown[0]}x{shown[1]}" if all(shown) else ""
    specs = tuple(
        (
            rid,
            RequestSpec(
                prompt=body.prompt,
                messages=messages,
                outputs=outputs,
                stage_params=params,
                seed=(seed + i) % 2**63,
                api=API_IMAGE_EDITS if edit is not None else API_IMAGES,
                model=served.model,
                traceparent=traceparent,
                response=ImageOptions(
                    render=RENDER_VERSION,
                    stream=body.stream,
                    usage_stage=stage,
                    image_stage=served.output_stage("image"),
                    response_format=body.response_format,
                    files_url=files_url if body.response_format == "url" else "",
                    output_format=body.output_format or "",
                    group=member(gid, i, body.n),
                    edit=edit is not None,
                    size=size,
                ),
            ),
        )
        for i, rid in enumerate(rids)
    )
    return Plan(specs=specs, stream=body.stream, blobs=edit.blobs if edit is not None else ())
