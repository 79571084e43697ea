"""The diffusers pipeline families omnix runs beyond a folder's own class.

Owns the tables, by a folder's pipeline class (``model_index.json``'s
``_class_name``): ``EDIT_FAMILIES`` (the image-edit classes of a
text-to-image family), ``VIDEO_FAMILIES`` (a text-to-video family's
image-to-video class and frame step) and ``PREVIEW_FAMILIES``.  The
classes are built from the folder's own pipeline by ``from_pipe``; read
here without importing diffusers, so that deriving a pipeline from a
folder (``folder.py``) and the HTTP checks know them too.

Does not own what a folder's model can do (``omnix.engines.diffusers_model``)
nor running them (``omnix.engines.diffusers_jobs``).
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec


class EditFamily(msgspec.Struct, frozen=True):
    """The image-edit classes of a text-to-image family (diffusers names).
    ``default``: what an edit without a mask is when the stage says
    ``edit = "auto"``; ``max_images``: input images one call takes."""

    image_to_image: str
    inpaint: str
    reference: str
    default: Literal["image_to_image", "reference"]
    max_images: int = 1


#: The image families omnix edits with, by the folder's pipeline class.
#: Kontext is Flux's reference-image edit: the reference image's latents
#: are attended to beside the generated ones (no noising of the input).
EDIT_FAMILIES: Final[dict[str, EditFamily]] = {
    "FluxPipeline": EditFamily(
        "FluxImg2ImgPipeline", "FluxInpaintPipeline", "FluxKontextPipeline", "image_to_image"
    ),
    "FluxKontextPipeline": EditFamily(
        "FluxImg2ImgPipeline", "FluxKontextInpaintPipeline", "FluxKontextPipeline", "reference"
    ),
}


class VideoFamily(msgspec.Struct, frozen=True):
    """A text-to-video family: its image-to-video class ("" none) and the
    frame counts it takes (``frame_step * k + 1``)."""

    image_to_video: str
    frame_step: int


VIDEO_FAMILIES: Final[dict[str, VideoFamily]] = {
    # Wan 2.1 / 2.2: the VAE folds 4 frames into one latent after the first.
    "WanPipeline": VideoFamily("WanImageToVideoPipeline", 4),
}

#: Families whose latents omnix can decode mid-denoising (partial images).
PREVIEW_FAMILIES: Final = frozenset(EDIT_FAMILIES)
