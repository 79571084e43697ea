"""What a diffusers model folder says its pipeline can do, read without torch.

Owns: ``DiffusionModel`` (a folder's pipeline class, its guidance
embedding, what it makes, the sizes and frame counts it takes),
``describe_model`` (from ``model_index.json`` and the components'
``config.json``, no torch, no diffusers import: the HTTP server calls it),
which task an image edit is (``edit_task``),
and ``refusal``: the parameter of a request the model's pipeline would
ignore, so the HTTP layer answers 400 before admission and the engine
raises rather than silently change the request.

Does not own loading or running pipelines (``diffusers_engine.py``,
``diffusers_jobs.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import msgspec

from omnix.events.types import StageParams
from omnix.models.paths import resolve_model
from omnix.pipelines.config import DiffusersArgs
from omnix.pipelines.families import EDIT_FAMILIES, PREVIEW_FAMILIES, VIDEO_FAMILIES, EditFamily

#: ``StageParams.output_format`` -> (PIL format, media type).  The default
#: (None) is PNG.  JPEG and WebP are lossy at PIL's default quality, whose
#: encoders are deterministic: the same pixels give the same bytes.
IMAGE_FORMATS: dict[str, tuple[str, str]] = {
    "png": ("PNG", "image/png"),
    "jpeg": ("JPEG", "image/jpeg"),
    "webp": ("WEBP", "image/webp"),
}

#: Pipelines whose negative prompt works only through "true" classifier-free
#: guidance: ``negative_prompt`` is used only when ``true_cfg_scale > 1``
#: (and ``true_cfg_scale`` only with a negative prompt); ``guidance_scale``
#: is an embedded guidance that only a transformer with ``guidance_embeds``
#: reads (FLUX.1-dev has one; FLUX.1-schnell and omnix's tiny model do not).
TRUE_CFG_PIPELINES = frozenset(
    {
        "FluxPipeline",
        "FluxImg2ImgPipeline",
        "FluxInpaintPipeline",
        "FluxKontextPipeline",
        "FluxKontextInpaintPipeline",
    }
)

Task = Literal[
    "text_to_image",
    "image_to_image",
    "inpaint",
    "reference",
    "text_to_video",
    "image_to_video",
]
"""What one pipeline call does: the folder's own pipeline (text to image,
text to video), or a sibling class built over the same components."""
EditMode = Literal["auto", "image_to_image", "reference"]


class DiffusionModel(msgspec.Struct, frozen=True):
    """What a diffusers model folder says about its pipeline."""

    #: ``model_index.json``'s ``_class_name`` ("FluxPipeline")
    pipeline: str
    #: ``transformer/config.json``'s ``guidance_embeds``; None when absent
    guidance_embeds: bool | None = None
    #: width and height must be multiples of this (the VAE's downsampling
    #: times the transformer's patch); 8 when the folder does not say
    size_multiple: int = 8
    #: a video family's frame step (frames = step * k + 1); 0 for images
    frame_step: int = 0
    #: the most frames and the longest side the model's positions reach
    #: (Wan: ``rope_max_seq_len`` latent positions per axis); 0: no bound
    max_frames: int = 0
    max_side: int = 0

    @property
    def makes(self) -> Literal["image", "video"]:
        return "video" if self.pipeline in VIDEO_FAMILIES else "image"

    @property
    def edits(self) -> EditFamily | None:
        return EDIT_FAMILIES.get(self.pipeline)

    @property
    def image_to_video(self) -> str:
        family = VIDEO_FAMILIES.get(self.pipeline)
        return family.image_to_video if family is not None else ""


def _json(path: Path) -> dict[str, object]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text())
    return value if isinstance(value, dict) else {}


def _size_multiple(folder: Path, pipeline: str) -> int:
    vae = _json(folder / "vae" / "config.json")
    transformer = _json(folder / "transformer" / "config.json")
    if pipeline in VIDEO_FAMILIES:
        spatial = vae.get("scale_factor_spatial", 8)
        patch = transformer.get("patch_size", [1, 2, 2])
        p = patch[1] if isinstance(patch, list) and len(patch) == 3 else 2
        return int(spatial) * int(p) if isinstance(spatial, int) and isinstance(p, int) else 16
    blocks = vae.get("block_out_channels")
    if isinstance(blocks, list) and blocks:
        # Flux packs 2x2 latent patches: the VAE's factor times 2.
        return 2 ** (len(blocks) - 1) * (2 if pipeline in EDIT_FAMILIES else 1)
    return 8


def describe_model(args: DiffusersArgs) -> DiffusionModel | None:
    """The stage's model as its JSON configs describe it (no torch, no
    diffusers import: the HTTP server calls it); None when the folder is
    not there (yet) or not a diffusers folder."""
    try:
        folder = resolve_model(args.model)
        index = _json(folder / "model_index.json")
        if not index:
            return None
        pipeline = str(index.get("_class_name", ""))
        value = _json(folder / "transformer" / "config.json").get("guidance_embeds")
        family = VIDEO_FAMILIES.get(pipeline)
        multiple = _size_multiple(folder, pipeline)
        max_frames = max_side = 0
        rope = _json(folder / "transformer" / "config.json").get("rope_max_seq_len")
        if family is not None and isinstance(rope, int) and rope > 0:
            max_frames = family.frame_step * (rope - 1) + 1
            max_side = multiple * rope
        return DiffusionModel(
            pipeline=pipeline,
            guidance_embeds=value if isinstance(value, bool) else None,
            size_multiple=multiple,
            frame_step=family.frame_step if family is not None else 0,
            max_frames=max_frames,
            max_side=max_side,
        )
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return None


def edit_task(model: DiffusionModel, mode: EditMode, has_mask: bool) -> Task | None:
    """What an image edit runs as: ``inpaint`` with a mask, else the
    stage's ``edit`` mode (``auto``: the family's default); None when the
    family has no edits."""
    family = model.edits
    if family is None:
        return None
    if has_mask:
        return "inpaint"
    return family.default if mode == "auto" else mode


def refusal(model: DiffusionModel, p: StageParams) -> tuple[str, str] | None:
    """(parameter, why) for a parameter of ``p`` the model's pipeline would
    ignore; None when it honours them all.  The HTTP layer answers 400 with
    it before admission; the engine raises with it (a defence: a request
    built around the HTTP layer fails rather than being silently changed)."""
    if p.output_format is not None and p.output_format not in IMAGE_FORMATS:
        return "output_format", f"{p.output_format!r} is not one of png, jpeg, webp"
    if p.partial_images and model.pipeline not in PREVIEW_FAMILIES:
        return "partial_images", (
            f"omnix cannot decode {model.pipeline or 'this pipeline'}'s latents before the "
            "last step; omit partial_images (the completed image still streams)"
        )
    if model.pipeline in TRUE_CFG_PIPELINES:
        if p.guidance_scale is not None and model.guidance_embeds is False:
            return "guidance_scale", (
                f"this {model.pipeline} model has no guidance embedding (a guidance-distilled "
                "model, like FLUX.1-schnell), so the pipeline ignores guidance_scale; omit it "
                "(true_cfg_scale with a negative_prompt is the guidance this model takes)"
            )
        true_cfg = p.true_cfg_scale is not None and p.true_cfg_scale > 1.0
        if p.negative_prompt is not None and not true_cfg:
            return "negative_prompt", (
                f"{model.pipeline} uses a negative prompt only with true classifier-free "
                "guidance: send true_cfg_scale > 1 with it (e.g. 4.0), or omit it"
            )
        if p.true_cfg_scale is not None and p.negative_prompt is None:
            return "true_cfg_scale", (
                f"{model.pipeline} applies true_cfg_scale only against a negative prompt: "
                "send negative_prompt with it, or omit it"
            )
    elif p.true_cfg_scale is not None:
        return "true_cfg_scale", (
            f"{model.pipeline or 'this pipeline'} has no true classifier-free guidance "
            "(use guidance_scale)"
        )
    return None
