"""Image generation's request and response bodies, as typed msgspec Structs.

Owns: ``ImageRequest`` (OpenAI's, with vLLM-Omni's and omnix's diffusion
extensions) and ``ImagesResponse``.  Does not own what a body means
(``plan.py``) nor filling the response (``render.py``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from omnix.http.common.fields import REQUEST, SamplingParamsList, Seed, Steps

Size = Annotated[str, Meta(pattern=r"^[1-9][0-9]{0,4}x[1-9][0-9]{0,4}$")]
EditSize = Annotated[str, Meta(pattern=r"^(auto|[1-9][0-9]{0,4}x[1-9][0-9]{0,4})$")]
#: OpenAI's ``partial_images``: 0 to 3 images before the final one.
PartialImages = Annotated[int, Meta(ge=0, le=3)]


class ImageRequest(msgspec.Struct, **REQUEST):
    """POST /v1/images/generations.  ``seed``, ``steps`` (alias of
    ``num_inference_steps``), ``num_inference_steps``, ``guidance_scale``,
    ``negative_prompt`` and ``true_cfg_scale`` are vLLM-Omni's (and
    omnix's) extensions; ``quality``, ``style``, ``background`` and
    ``output_format`` are OpenAI's, honoured as docs/http.md "Images" says
    (a value the pipeline cannot honour is a 400 naming it)."""

    prompt: Annotated[str, Meta(min_length=1, max_length=32000)]
    model: str = ""
    n: Annotated[int, Meta(ge=1, le=16)] = 1
    size: Size | None = None
    response_format: Literal["b64_json", "url"] = "b64_json"
    seed: Seed | None = None
    steps: Steps | None = None
    num_inference_steps: Steps | None = None
    guidance_scale: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    sampling_params_list: SamplingParamsList | None = None
    user: str | None = None
    quality: Literal["auto", "standard", "low", "medium", "high", "hd"] | None = None
    style: Literal["vivid", "natural"] | None = None
    background: Literal["auto", "opaque", "transparent"] | None = None
    output_format: Literal["png", "jpeg", "webp"] | None = None
    negative_prompt: Annotated[str, Meta(max_length=32000)] | None = None
    true_cfg_scale: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    stream: bool = False
    partial_images: PartialImages | None = None


class ImageEditForm(msgspec.Struct, **REQUEST):
    """The text fields of ``POST /v1/images/edits`` (a multipart form; the
    files are ``image`` / ``image[]`` and ``mask``).  OpenAI's, vLLM-Omni's
    diffusion extensions (as ``ImageRequest``'s) and omnix's ``strength``
    (how much of the image an image-to-image or inpaint edit repaints).
    ``size`` may be ``auto``: the first image's size."""

    prompt: Annotated[str, Meta(min_length=1, max_length=32000)]
    model: str = ""
    n: Annotated[int, Meta(ge=1, le=16)] = 1
    size: EditSize | None = None
    response_format: Literal["b64_json", "url"] = "b64_json"
    seed: Seed | None = None
    steps: Steps | None = None
    num_inference_steps: Steps | None = None
    guidance_scale: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    user: str | None = None
    quality: Literal["auto", "standard", "low", "medium", "high", "hd"] | None = None
    background: Literal["auto", "opaque", "transparent"] | None = None
    output_format: Literal["png", "jpeg", "webp"] | None = None
    negative_prompt: Annotated[str, Meta(max_length=32000)] | None = None
    true_cfg_scale: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    strength: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    stream: bool = False
    partial_images: PartialImages | None = None


class ImageData(msgspec.Struct, kw_only=True):
    #: one of ``b64_json`` and ``url``, as the request's response_format says
    b64_json: str | UnsetType = UNSET
    url: str | UnsetType = UNSET
    revised_prompt: str | UnsetType = UNSET


class ImagesResponse(msgspec.Struct, kw_only=True):
    created: int
    data: list[ImageData]
    request_ids: list[str]
    #: the file format, when the request named one (as OpenAI answers it)
    output_format: str | UnsetType = UNSET
    #: the images' size (edits: the size chosen from the input when not asked)
    size: str | UnsetType = UNSET


class ImageTokenDetails(msgspec.Struct, kw_only=True):
    image_tokens: int = 0
    text_tokens: int = 0


class ImageStreamUsage(msgspec.Struct, kw_only=True):
    """OpenAI counts its image models' tokens; a diffusion pipeline has
    none to count: zeros."""

    input_tokens: int = 0
    input_tokens_details: ImageTokenDetails = msgspec.field(default_factory=ImageTokenDetails)
    output_tokens: int = 0
    total_tokens: int = 0


class ImageStreamEvent(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An SSE event of a streamed image response: ``image_generation.`` or
    ``image_edit.`` ``partial_image`` (with its ``partial_image_index``)
    and ``completed`` (with ``usage``), as OpenAI streams them."""

    type: str
    b64_json: str
    created_at: int
    size: str
    quality: str
    background: str
    output_format: str
    partial_image_index: int | None = None
    usage: ImageStreamUsage | None = None
