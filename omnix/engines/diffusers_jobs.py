"""One diffusion request as (part of) a pipeline call, and what comes out.

Owns: ``Job`` (a request's task, prompt, sizes, steps, seed, input image
and mask, output format, partial images, and how to reach its
``generate`` call: ``post``), the batch key of equal-shape jobs
(``Job.key``), the keyword arguments of one pipeline call for a group of
jobs (``call_kwargs``), the steps at which a job wants a partial image
(``preview_steps``), decoding a job's latents into one (``preview``), and
turning a call's output into each job's file (``outputs``: resized to the
asked size, an inpaint's unmasked pixels pasted back as the client sent
them, encoded as PNG/JPEG/WebP or, for a video, an MP4).  The values the
pipeline thread posts to a job (``Step``, ``Result``, ``Raised``,
``Stopped``).

Does not own loading pipelines or scheduling calls
(``diffusers_engine.py``, ``diffusers_batch.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from omnix.engines.diffusers_model import Task
from omnix.engines.media_files import encode_image, encode_mp4

#: Tasks whose jobs of equal shape share one call: the pipeline batches
#: their prompts (one generator per prompt, so each job's noise is its own).
BATCHED_TASKS = frozenset({"text_to_image", "text_to_video"})
VIDEO_TASKS = frozenset({"text_to_video", "image_to_video"})


class Step(NamedTuple):
    """Denoising step ``done`` of ``total`` finished; ``preview``: a
    partial image encoded at it (empty when none was asked for here)."""

    done: int
    total: int
    preview: bytes = b""


class Result(NamedTuple):
    """The call ended with this encoded file."""

    data: bytes


class Raised(NamedTuple):
    """The call failed."""

    error: BaseException


class Stopped(NamedTuple):
    """The job stopped at a step because its request was aborted."""


#: What the pipeline thread posts to a job's ``generate``, in order.
Posted = Step | Result | Raised | Stopped


@dataclass(eq=False)
class Job:
    """One request's share of a pipeline call."""

    rid: str
    task: Task
    prompt: str
    width: int  # the output's, as asked
    height: int
    run_width: int  # the pipeline's: multiples of the model's size step
    run_height: int
    steps: int
    seed: int
    pil_format: str
    media_type: str
    post: Callable[[Posted], None]
    negative_prompt: str | None = None
    guidance_scale: float | None = None
    true_cfg_scale: float | None = None
    strength: float | None = None
    num_frames: int = 0
    fps: int = 0
    partial_images: int = 0
    image: np.ndarray | None = None  # uint8 (h, w, 3)
    mask: np.ndarray | None = None  # uint8 (h, w) repaint weights, 255 = repaint
    flag: threading.Event = field(default_factory=threading.Event)
    #: denoising steps run (the pipeline thread's count)
    done: int = 0

    def key(self) -> tuple[object, ...]:
        """Jobs with equal keys may share one call; a task that is not
        batched keys on the job itself."""
        if self.task not in BATCHED_TASKS:
            return (id(self),)
        return (
            self.task,
            self.run_width,
            self.run_height,
            self.steps,
            self.guidance_scale,
            self.true_cfg_scale,
            self.negative_prompt is None,
            self.num_frames,
        )


def preview_steps(partial_images: int, total: int) -> frozenset[int]:
    """The steps (1-based, before the last) after which ``partial_images``
    partial images are decoded: spread evenly over ``total`` steps."""
    if partial_images <= 0 or total <= 1:
        return frozenset()
    k = partial_images
    return frozenset(s for j in range(1, k + 1) if 1 <= (s := round(total * j / (k + 1))) < total)


def _generator(seed: int) -> Any:
    import torch

    # A CPU generator: the same seed gives the same initial noise on every device.
    return torch.Generator("cpu").manual_seed(seed % (1 << 63))


def _pil(rgb: np.ndarray, size: tuple[int, int]) -> Any:
    from PIL import Image

    img = Image.fromarray(np.ascontiguousarray(rgb), "RGB")
    return img if img.size == size else img.resize(size, Image.Resampling.LANCZOS)


def call_kwargs(jobs: list[Job], accepts: frozenset[str]) -> dict[str, Any]:
    """The pipeline's keyword arguments for ``jobs`` (equal keys): a list
    of prompts and generators for a batch, the task's inputs; only what
    the pipeline's ``__call__`` takes (``accepts``), bar the prompt."""
    from PIL import Image

    j = jobs[0]
    one = len(jobs) == 1
    kw: dict[str, Any] = {
        "prompt": j.prompt if one else [x.prompt for x in jobs],
        "num_inference_steps": j.steps,
        "width": j.run_width,
        "height": j.run_height,
        "generator": _generator(j.seed) if one else [_generator(x.seed) for x in jobs],
    }
    if j.negative_prompt is not None:
        negatives = [x.negative_prompt or "" for x in jobs]
        kw["negative_prompt"] = negatives[0] if one else negatives
    given = {
        "guidance_scale": j.guidance_scale,
        "true_cfg_scale": j.true_cfg_scale,
        "strength": j.strength,
    }
    for name, value in given.items():
        if value is None:
            continue
        if name not in accepts:
            raise ValueError(
                f"{name} is not honoured: this diffusers pipeline's __call__ takes no {name}"
            )
        kw[name] = value
    size = (j.run_width, j.run_height)
    if j.image is not None:
        kw["image"] = _pil(j.image, size)
    if j.task == "inpaint" and j.mask is not None:
        mask = Image.fromarray(np.ascontiguousarray(j.mask), "L")
        kw["mask_image"] = mask if mask.size == size else mask.resize(size)
    if j.task == "reference":
        # Kontext resizes to a preferred area unless told the one asked for.
        kw["max_area"] = j.run_width * j.run_height
        kw["_auto_resize"] = False
    if j.task in VIDEO_TASKS:
        kw["num_frames"] = j.num_frames
        kw["output_type"] = "np"
    return {k: v for k, v in kw.items() if k in accepts or k == "prompt"}


def _resized(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    if rgb.shape[1] == width and rgb.shape[0] == height:
        return rgb
    return np.asarray(_pil(rgb, (width, height)))


def paste_back(job: Job, generated: np.ndarray) -> np.ndarray:
    """An inpaint's output with the client's pixels where its mask keeps
    them: ``out = original * (1 - w) + generated * w``, ``w`` the repaint
    weight (255: repaint), so a kept pixel (weight 0) is exactly the one
    sent.  A random VAE, or any VAE, does not reproduce them by itself."""
    if job.task != "inpaint" or job.image is None or job.mask is None:
        return generated
    original = _resized(job.image, job.width, job.height).astype(np.float32)
    mask = job.mask
    if mask.shape != (job.height, job.width):
        from PIL import Image

        mask = np.asarray(Image.fromarray(mask, "L").resize((job.width, job.height)))
    w = (mask.astype(np.float32) / 255.0)[..., None]
    out = original * (1.0 - w) + generated.astype(np.float32) * w
    return np.rint(out).clip(0, 255).astype(np.uint8)


def image_file(job: Job, rgb: np.ndarray) -> bytes:
    """A generated image as the job's file: at the asked size, pasted back."""
    return encode_image(paste_back(job, _resized(rgb, job.width, job.height)), job.pil_format)


def outputs(jobs: list[Job], result: Any) -> list[bytes]:
    """Each job's file from the call's output (``images``: PIL images;
    ``frames``: float arrays in [0, 1], one video per job)."""
    if jobs[0].task in VIDEO_TASKS:
        frames = np.asarray(result.frames)
        videos = (frames * 255.0).round().clip(0, 255).astype(np.uint8)
        return [encode_mp4(videos[i], job.fps) for i, job in enumerate(jobs)]
    return [
        image_file(job, np.asarray(img.convert("RGB")))
        for job, img in zip(jobs, result.images, strict=True)
    ]


def preview(pipe: Any, job: Job, latents: Any) -> bytes:
    """A partial image: one job's packed latents (a Flux-family pipeline's)
    decoded as the pipeline decodes its last step, then made the job's
    file as its final image is."""
    import torch

    with torch.no_grad():
        lat = pipe._unpack_latents(
            latents, job.run_height, job.run_width, pipe.vae_scale_factor
        ).to(pipe.vae.dtype)
        cfg = pipe.vae.config
        lat = lat / cfg.scaling_factor + cfg.shift_factor
        decoded = pipe.vae.decode(lat, return_dict=False)[0]
        pil = pipe.image_processor.postprocess(decoded, output_type="pil")[0]
    return image_file(job, np.asarray(pil.convert("RGB")))
