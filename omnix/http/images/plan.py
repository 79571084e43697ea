"""An image generation body -> the requests it submits.

Owns: the mapping of an ``ImageRequest`` onto ``RequestSpec``s (``n`` > 1:
``n`` requests of a group, seeds ``seed``, ``seed+1``...), its size and
diffusion parameters put on the image stage, the 400 for OpenAI's image
options this pipeline cannot honour (quality tiers, style, transparency,
``url`` answers without a diffusers stage or a usable Host), and the
``ImageOptions`` the response renders from.

Does not own admission (``core.submit``) nor the response's bytes
(``render.py``).
"""

from __future__ import annotations

from typing import Final

from omnix.events.options import API_IMAGES, ImageOptions
from omnix.events.types import Modality, RequestSpec, StageParams
from omnix.http.common.plan import Plan, Served, group_ids, member
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
from omnix.http.images.protocol import ImageRequest

#: OpenAI's ``quality`` values that mean the stage's own settings; the
#: tiers (low, medium, high, hd) have no diffusers meaning and are refused.
DEFAULT_QUALITIES: Final = frozenset({"auto", "standard"})


def _size(size: str) -> tuple[int, int]:
    w, h = (int(v) for v in size.split("x"))
    for v in (w, h):
        if not (8 <= v <= 4096 and v % 8 == 0):
            raise bad(
                "size",
                f"size {size!r}: width and height must be multiples of 8 between 8 and 4096 "
                "(e.g. 64x64).",
            )
    return w, h


def _image_options(body: ImageRequest, served: Served, stage: str, files_url: str) -> None:
    """400 for OpenAI's image options this pipeline cannot honour."""
    kind = served.engine_of(stage)
    if body.quality is not None and body.quality not in DEFAULT_QUALITIES:
        raise unsupported(
            "quality",
            f"quality {body.quality!r} has no meaning for stage {stage!r} ({kind}): a diffusion "
            "pipeline has no quality tiers. Send num_inference_steps (more steps, finer detail), "
            'or quality "auto" / "standard" for the stage\'s own settings.',
        )
    if body.style is not None:
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
        raise bad("steps", "steps and num_inference_steps disagree: send one of them.")
    width = height = None
    if body.size is not None:
        width, height = _size(body.size)
    outputs: tuple[Modality, ...] = ("image",)
    stage = served.output_stage("image") or served.source_stage(outputs)
    _image_options(body, served, stage, files_url)
    params = stage_params(served, body.sampling_params_list)
    put(
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
    check_engines(served, params)
    check_diffusion(served, params)
    seed = served.seed(body.seed)
    gid, rids = group_ids(served, body.n)
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
                response=ImageOptions(
                    render=RENDER_VERSION,
                    usage_stage=stage,
                    image_stage=served.output_stage("image"),
                    response_format=body.response_format,
                    files_url=files_url if body.response_format == "url" else "",
                    output_format=body.output_format or "",
                    group=member(gid, i, body.n),
                ),
            ),
        )
        for i, rid in enumerate(rids)
    )
    return Plan(specs=specs)
