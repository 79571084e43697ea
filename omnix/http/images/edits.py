"""``POST /v1/images/edits``: OpenAI's multipart image-edit form.

Owns: reading the form (``image`` or repeated ``image[]``, optional
``mask``, and the text fields of ``ImageEditForm``), every check of the
files before anything is admitted, each a 400 naming the field: no image,
more images than the pipeline edits at once (``too_many_media_parts``), a
mask without an image, a file that is not an image or over the byte or
pixel limit, a mask without an alpha channel or of another size than the
image (``mask``); that the served pipeline edits images at all (a
diffusers image stage whose model family has edits, taking image input:
``unsupported_input`` otherwise), and the parameters the edit's task does
not take (``strength`` on a reference edit).  The images and the mask
are decoded once (the mask as repaint weights, from OpenAI's alpha 0 =
repaint), stored content-addressed at admission and referenced by the
request's message, so the engine and a replay get the same pixels.  Then
the plan is ``plan.image_plan``'s and the response ``render.py``'s, as
for a generation.

Does not own decoding (``omnix.http.media``) nor the engine's use of the
files (``omnix.engines.diffusers_engine``).
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from omnix.engines.diffusers_model import edit_task
from omnix.http.common import form as common_form
from omnix.http.common.plan import PlanContext
from omnix.http.core.body import files_url, traceparent
from omnix.http.core.errors import ApiError
from omnix.http.core.live import respond
from omnix.http.core.server import Server
from omnix.http.images.plan import Edit, image_plan
from omnix.http.images.protocol import ImageEditForm
from omnix.http.media.common import FilePart
from omnix.http.media.parts import decode_files
from omnix.pipelines.config import DiffusersArgs

IMAGE: Final = "image"
MASK: Final = "mask"

_HINT = (
    "send multipart/form-data with the image in a file field (curl -F image=@photo.png "
    "-F prompt=...; the openai client's images.edit(image=..., prompt=...) does this)"
)
#: OpenAI fields this route knows and does not take, with what to do.
UNSUPPORTED_FIELDS: Final[dict[str, str]] = {
    "input_fidelity": "a diffusion edit has no fidelity setting: send strength (lower keeps "
    "more of the image) for an image-to-image or inpaint edit, or omit it.",
    "output_compression": "omnix encodes at the format's default quality; omit it.",
    "complexity": "omit it.",
    "frame_count": "omnix edits still images; omit it.",
    "frame_duration_ms": "omnix edits still images; omit it.",
    "markup": "omit it.",
    "svg": "omnix makes raster images; omit it.",
    "safety_identifier": "omit it.",
}
_SPEC: Final = common_form.FormSpec(
    route="POST /v1/images/edits",
    hint=_HINT,
    texts=frozenset(ImageEditForm.__struct_fields__),
    files=frozenset({IMAGE, MASK}),
    repeat=frozenset({IMAGE}),
    unsupported=UNSUPPORTED_FIELDS,
)


def _bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _stage_args(served: PlanContext) -> tuple[str, DiffusersArgs]:
    """The image stage, which must be a diffusers stage taking images."""
    p = served.pipeline
    stage = served.output_stage("image")
    args = p.stage(stage).engine if stage else None
    media = p.input_media
    if not isinstance(args, DiffusersArgs) or media is None or not media.image:
        raise _bad(
            IMAGE,
            f"pipeline {p.name!r} does not edit images: image edits need a diffusers image "
            "stage that takes image input (media = { image = true }); serve tiny-image, or "
            "such a pipeline.",
            "unsupported_input",
        )
    return stage, args


def _files(
    served: PlanContext, stage: str, args: DiffusersArgs, form: common_form.Form
) -> list[FilePart]:
    """The files to decode, after the checks that need no decoding."""
    images = form.files.get(IMAGE, [])
    masks = form.files.get(MASK, [])
    if not images:
        raise _bad(IMAGE, f"The form has no image: {_HINT}.")
    media = served.pipeline.input_media
    model = served.diffusion_model(stage)
    family = model.edits if model is not None else None
    most = media.max_image_parts if media is not None else 1
    if family is not None:
        most = min(most, family.max_images)
    if len(images) > most:
        raise _bad(
            IMAGE,
            f"The form has {len(images)} images; pipeline {served.model!r} edits at most "
            f"{most} at a time. Send fewer.",
            "too_many_media_parts",
        )
    if model is not None and family is None:
        raise _bad(
            IMAGE,
            f"pipeline {served.model!r}'s model ({model.pipeline}) has no image edits in "
            "omnix (Flux and Flux Kontext folders have).",
            "unsupported_input",
        )
    one = len(images) == 1
    parts = [
        FilePart(IMAGE if one else f"{IMAGE}[{i}]", "image", u.data) for i, u in enumerate(images)
    ]
    return parts + [FilePart(MASK, "mask", u.data) for u in masks]


def _check_task(
    served: PlanContext, stage: str, args: DiffusersArgs, body: ImageEditForm, mask: bool
) -> None:
    model = served.diffusion_model(stage)
    if model is None:
        return  # the folder is not there yet: the engine judges
    task = edit_task(model, args.edit, mask)
    if body.strength is not None and task == "reference":
        raise _bad(
            "strength",
            f"strength is not supported by stage {stage!r}: its edits without a mask are "
            "reference-image edits (the image guides a new one; none of it is noised), which "
            "have no strength. Omit it, or send a mask to inpaint.",
            "unsupported_parameter",
        )


async def edits(server: Server, request: web.Request) -> web.StreamResponse:
    form = await common_form.read_form(request, _SPEC)
    body = common_form.form_struct(form.texts, ImageEditForm)
    served = server.served
    served.check_model(body.model)
    stage, args = _stage_args(served)
    if len(form.files.get(MASK, [])) > 0 and not form.files.get(IMAGE):
        raise _bad(IMAGE, "The form has a mask but no image to edit: send the image too.")
    files = _files(served, stage, args, form)
    media, blobs = await decode_files(server.media, files)
    first = media[files[0].param]
    height, width = first.blob.shape[:2]
    mask = media.get(MASK)
    if mask is not None and tuple(mask.blob.shape) != (height, width):
        mh, mw = mask.blob.shape[:2]
        raise _bad(
            MASK,
            f"The mask is {mw}x{mh} but the image is {width}x{height}: a mask must be the "
            "image's size.",
        )
    _check_task(served, stage, args, body, mask is not None)
    parts = tuple(media[f.param] for f in files)
    edit = Edit(parts=parts, blobs=blobs, width=int(width), height=int(height))
    plan = image_plan(
        body, served, traceparent=traceparent(request), files_url=files_url(request), edit=edit
    )
    return await respond(server, request, plan)
