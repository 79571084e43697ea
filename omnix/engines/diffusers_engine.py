"""The diffusion stage engine: a diffusers pipeline from a local folder.

Owns: loading the pipeline (``DiffusionPipeline.from_pretrained``, local
files only; a component whose class keeps modules in float32, such as
Wan's transformer, is loaded by omnix itself, since diffusers then needs
``accelerate``) onto a device, the sibling pipelines an edit or an
image-to-video request runs on (``from_pipe``: the same components), and
turning each request into a ``Job``: its task (text to image, image to
image, inpaint, reference edit, text to video, image to video: from its
media and the stage's ``edit``), sizes, steps, seed, format.  Jobs run
through the ``Batcher`` (``diffusers_batch.py``); the stage's step cache
compilation and guidance batching are the ``Denoiser``'s
(``diffusers_cache.py``, ``diffusers_cfg.py``).  What a model folder
says about its pipeline (``describe_model``, ``refusal``) is
``diffusers_model.py``'s, read without torch so the HTTP layer refuses a
parameter before admission.  Does not own the models (``omnix.models``)
or the stage plumbing (``omnix.stages``).

Input: the prompt is the pieces' text concatenated (upstream text deltas
join exactly), or, for a source stage, the request's messages' contents;
an edit's image and mask (and an image-to-video's first frame) are the
messages' media parts (``MediaPart`` kinds ``image`` and ``mask``).  The
whole input is awaited before denoising starts: a diffusion step needs
the full prompt.  Output: one ``EngineOutput(step=i, total=n)`` per
finished step (with ``preview``, a partial image, at the steps
``partial_images`` asks for), then ``EngineOutput(modality="image" or
"video", data=the encoded file, media_type=..., finish_reason="stop")``.

Parameters: ``num_inference_steps``, ``width``, ``height``, the seed and,
for video, ``num_frames`` and ``fps`` always; ``guidance_scale``,
``negative_prompt``, ``true_cfg_scale`` and ``strength`` when given, and
only if the pipeline honours them (``refusal``; a parameter its
``__call__`` does not take raises instead of being dropped).

Cancellation: ``abort`` sets the job's flag, which the step callback
checks after every step: the job is dropped there (the step in flight
finishes; nothing is yielded after ``abort``) and a call whose jobs are
all dropped stops before the next step and the VAE decode.

The pipeline calls block, so they run in this engine's single worker
thread, keeping the worker's event loop free; ``capacity`` is
``max_batch``: that many requests may wait or share a call.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import json
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, assert_never

import numpy as np

from omnix.engines.device import pick_device
from omnix.engines.diffusers_batch import Batcher
from omnix.engines.diffusers_cache import Denoiser, compile_problem
from omnix.engines.diffusers_jobs import VIDEO_TASKS, Job, Posted, Raised, Result, Step, Stopped
from omnix.engines.diffusers_model import (
    IMAGE_FORMATS,
    TRUE_CFG_PIPELINES,
    DiffusionModel,
    Task,
    describe_model,
    edit_task,
    refusal,
)
from omnix.engines.diffusers_prompts import call_guidance
from omnix.events.types import Modality
from omnix.models.paths import resolve_model, stay_offline
from omnix.pipelines.config import DiffusersArgs
from omnix.pipelines.diffusion_cache import cfg_batch_problem, family_problem
from omnix.transport.work import EngineInfo, EngineOutput, GenerateRequest, InputPiece

__all__ = [
    "IMAGE_FORMATS",
    "TRUE_CFG_PIPELINES",
    "DiffusersEngine",
    "DiffusionModel",
    "describe_model",
    "refusal",
]


class DiffusersEngine:
    """``Engine`` over a diffusers pipeline.  Built as ``DiffusersEngine(args)``."""

    def __init__(self, args: DiffusersArgs) -> None:
        self.args = args
        #: the pipeline text-to-image (or -video) calls run on
        self.pipe: Any = None
        self.device = "cpu"
        self._base: Any = None
        self._siblings: dict[str, Any] = {}
        self._jobs: dict[str, Job] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._batcher: Batcher | None = None
        self._max_sequence_length: int | None = None
        self._model: DiffusionModel | None = None
        self._denoiser = Denoiser(args.cache, args.compile, args.cfg_batch)
        #: (request_id, steps run, "done" | "aborted" | "error") per finished job.
        self.history: collections.deque[tuple[str, int, str]] = collections.deque(maxlen=64)

    @property
    def batcher(self) -> Batcher | None:
        return self._batcher

    async def start(self) -> EngineInfo:
        folder = resolve_model(self.args.model)
        self._model = describe_model(self.args)
        if self._model is not None and self._model.makes != self.args.output_modality:
            raise ValueError(
                f"model {folder} is a {self._model.pipeline}, which makes "
                f"{self._model.makes}s, but the stage says output_modality = "
                f"{self.args.output_modality!r}: set output_modality = {self._model.makes!r}"
            )
        if self._model is not None:
            refused = family_problem(self.args.cache, self._model.pipeline) or (
                cfg_batch_problem(self.args.cfg_batch, self._model.pipeline)
            )
            if refused is not None:
                raise ValueError(refused)
        stay_offline()
        self.device = pick_device(self.args.device)
        refused = compile_problem(self.args.compile, self.device)
        if refused is not None:
            raise ValueError(refused)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="omnix-diffusers")
        loop = asyncio.get_running_loop()
        self.pipe = self._base = await loop.run_in_executor(self._pool, self._load, folder)
        self._batcher = Batcher(
            self._pool, self._pipeline, self._prepare, self.args.max_batch, self.history
        )
        return EngineInfo(
            engine="diffusers",
            capacity=max(1, self.args.max_batch),
            device=self.device,
            model=str(folder),
            settings=self._denoiser.settings(),
        )

    def _load(self, folder: Path) -> Any:
        import diffusers
        import torch
        from diffusers import DiffusionPipeline
        from diffusers.utils import logging as dlog
        from transformers.utils import logging as tlog

        dtype = getattr(torch, self.args.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {self.args.dtype!r}: use float32, float16 or bfloat16")
        # A server draws no progress bars (steps are reported as outputs).
        dlog.disable_progress_bar()
        tlog.disable_progress_bar()
        own = _fp32_components(folder, dtype)
        # The folder's own class: DiffusionPipeline's from_pretrained reads
        # a passed component of an optional slot (Wan's transformer) as a
        # keyword and loads the component anyway.
        index = json.loads((folder / "model_index.json").read_text())
        cls = getattr(diffusers, str(index.get("_class_name", "")), None)
        if not (isinstance(cls, type) and issubclass(cls, DiffusionPipeline)):
            cls = DiffusionPipeline
        pipe = cls.from_pretrained(str(folder), dtype=dtype, local_files_only=True, **own)
        pipe = pipe.to(self.device)
        self._denoiser.apply(pipe, type(pipe).__name__)
        self._ready(pipe)
        # Pipelines pad the prompt to max_sequence_length (Flux: 512) whatever
        # the tokenizer can hold; cap it at the tokenizer's own limit (77 for
        # the tiny model: 8x fewer text tokens in every denoising step).
        params = inspect.signature(pipe.__call__).parameters
        if "max_sequence_length" in params:
            default = params["max_sequence_length"].default
            tok = getattr(pipe, "tokenizer_2", None) or getattr(pipe, "tokenizer", None)
            limit = getattr(tok, "model_max_length", None)
            if isinstance(default, int) and isinstance(limit, int) and 0 < limit < default:
                self._max_sequence_length = limit
        return pipe

    @staticmethod
    def _ready(pipe: Any) -> None:
        pipe.set_progress_bar_config(disable=True)
        params = inspect.signature(pipe.__call__).parameters
        pipe._omnix_accepts = frozenset(params)
        guidance = params.get("guidance_scale")
        pipe._omnix_guidance_default = guidance.default if guidance is not None else None

    def _pipeline(self, task: str) -> Any:
        """The pipeline ``task`` runs on (in the pipeline thread): the
        folder's own, or a sibling class over its components, built once."""
        if task in ("text_to_image", "text_to_video"):
            return self.pipe
        got = self._siblings.get(task)
        if got is None:
            import diffusers

            name = self._sibling_class(task)
            got = getattr(diffusers, name).from_pipe(self._base)
            self._ready(got)
            self._siblings[task] = got
        return got

    def _sibling_class(self, task: str) -> str:
        model = self._model
        family = model.edits if model is not None else None
        if task == "image_to_video" and model is not None and model.image_to_video:
            return model.image_to_video
        if family is not None and task in ("image_to_image", "inpaint", "reference"):
            return str(getattr(family, task))
        pipeline = model.pipeline if model is not None else "this pipeline"
        raise ValueError(f"{pipeline} has no {task.replace('_', '-')} pipeline")

    def _prepare(
        self, pipe: Any, jobs: list[Job], kwargs: dict[str, Any]
    ) -> AbstractContextManager[Any]:
        """In the pipeline thread, before a call: the prompt length cap; the
        prompts of a call whose guidance pairs, encoded here
        (``call_guidance``); the denoiser's cache state, reset, and the
        context the call runs in."""
        self._denoiser.before_call(pipe, kwargs)
        accepts = pipe._omnix_accepts
        if self._max_sequence_length is not None and "max_sequence_length" in accepts:
            kwargs["max_sequence_length"] = self._max_sequence_length
        guidance = call_guidance(pipe, self._base, jobs[0].task, kwargs)
        return self._denoiser.call_context(pipe, guidance)

    def generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        return self._generate(request, inputs)

    async def abort(self, request_id: str) -> None:
        job = self._jobs.get(request_id)
        if job is not None:
            job.flag.set()

    async def close(self) -> None:
        for job in self._jobs.values():
            job.flag.set()
        if self._batcher is not None:
            self._batcher.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, True)
        self.pipe = self._base = None
        self._siblings.clear()

    async def _generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        if self.pipe is None or self._batcher is None:
            raise RuntimeError("DiffusersEngine.generate before start() (or after close())")
        rid = request.request_id
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Posted] = asyncio.Queue()

        def post(ev: Posted) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, ev)
            except RuntimeError:
                pass  # the loop is gone (shutdown): nobody is listening

        # Registered before the input is awaited: an abort meanwhile counts.
        job = self._jobs[rid] = _pending(rid, post)
        try:
            pieces = [p async for p in inputs]
            if job.flag.is_set():
                return
            job = self._jobs[rid] = self._job(request, pieces, post, job)
            modality: Modality = "video" if job.task in VIDEO_TASKS else "image"
            self._batcher.submit(job)
            while True:
                ev = await events.get()
                if job.flag.is_set():
                    return
                match ev:
                    case Step():
                        yield EngineOutput(
                            modality=modality,
                            step=ev.done,
                            total=ev.total,
                            preview=ev.preview,
                            media_type=job.media_type if ev.preview else "",
                        )
                    case Result():
                        yield EngineOutput(
                            modality=modality,
                            data=ev.data,
                            media_type=job.media_type,
                            finish_reason="stop",
                        )
                        return
                    case Raised():
                        raise ev.error
                    case Stopped():  # only with the flag set, checked above
                        return
                    case _:
                        assert_never(ev)
        finally:
            # An abort (or the worker cancelling this task) leaves the flag set,
            # so a call still running drops the job at its next step.
            job.flag.set()
            self._jobs.pop(rid, None)

    def _job(
        self, request: GenerateRequest, pieces: list[InputPiece], post: Any, pending: Job
    ) -> Job:
        """The request as a job (raises on a parameter it cannot honour)."""
        p, a = request.params, self.args
        steps = p.num_inference_steps or a.default_steps
        if steps < 1:
            raise ValueError(f"num_inference_steps must be >= 1, got {steps}")
        if p.output_format is not None and p.output_format not in IMAGE_FORMATS:
            raise ValueError(f"output_format {p.output_format!r} is not one of png, jpeg, webp")
        if self._model is not None:
            refused = refusal(self._model, p)
            if refused is not None:
                raise ValueError(f"{refused[0]} is not honoured: {refused[1]}")
        prompt, image, mask = _inputs(pieces)
        task = self._task(image, mask)
        multiple = self._model.size_multiple if self._model is not None else 8
        width = p.width or (image.shape[1] if image is not None else a.default_size)
        height = p.height or (image.shape[0] if image is not None else a.default_size)
        run_w, run_h = (max(multiple, v // multiple * multiple) for v in (width, height))
        video = task in VIDEO_TASKS
        frames = 0
        if video:
            width, height = run_w, run_h  # a video is made at the size its model takes
            frames = p.num_frames or a.default_frames
            step = self._model.frame_step if self._model is not None else 4
            if step and (frames - 1) % step:
                raise ValueError(f"num_frames must be {step}k + 1, got {frames}")
        pil_format, media_type = IMAGE_FORMATS[p.output_format or "png"]
        if video:
            pil_format, media_type = "", "video/mp4"
        job = Job(
            rid=request.request_id,
            task=task,
            prompt=prompt,
            width=width,
            height=height,
            run_width=run_w,
            run_height=run_h,
            steps=steps,
            seed=p.seed if p.seed is not None else request.seed,
            pil_format=pil_format,
            media_type=media_type,
            post=post,
            negative_prompt=p.negative_prompt,
            guidance_scale=p.guidance_scale,
            true_cfg_scale=p.true_cfg_scale,
            strength=p.strength if task in ("image_to_image", "inpaint") else None,
            num_frames=frames,
            fps=(p.fps or a.default_fps) if video else 0,
            partial_images=p.partial_images or 0,
            image=image,
            mask=mask,
            flag=pending.flag,
        )
        if p.strength is not None and job.strength is None:
            raise ValueError(f"strength is not honoured: a {task.replace('_', '-')} has none")
        return job

    def _task(self, image: np.ndarray | None, mask: np.ndarray | None) -> Task:
        video = self.args.output_modality == "video"
        if mask is not None and image is None:
            raise ValueError("a mask without an image to edit")
        if image is None:
            return "text_to_video" if video else "text_to_image"
        if video:
            return "image_to_video"
        task = edit_task(self._model, self.args.edit, mask is not None) if self._model else None
        if task is None:
            pipeline = self._model.pipeline if self._model is not None else "this pipeline"
            raise ValueError(f"{pipeline} has no image edits")
        return task


def _pending(rid: str, post: Any) -> Job:
    """A placeholder job whose flag an abort can set while the input arrives."""
    return Job(rid, "text_to_image", "", 0, 0, 0, 0, 0, 0, "", "", post)


def _inputs(pieces: list[InputPiece]) -> tuple[str, np.ndarray | None, np.ndarray | None]:
    """The prompt, the first image and the mask of the input pieces."""
    text = "".join(p.text for p in pieces).strip()
    if not text:
        contents = [m.content for p in pieces for m in p.messages if m.role != "system"]
        text = "\n".join(contents).strip()
    image = mask = None
    for piece in pieces:
        kinds = [part.kind for m in piece.messages for part in m.media]
        for kind, array in zip(kinds, piece.media, strict=False):
            if kind == "image" and image is None:
                image = np.asarray(array, dtype=np.uint8)
            elif kind == "mask" and mask is None:
                mask = np.asarray(array, dtype=np.uint8)
    return text, image, mask


def _fp32_components(folder: Path, dtype: Any) -> dict[str, Any]:
    """Components omnix loads itself: diffusers' ``from_pretrained`` refuses
    a model class with ``_keep_in_fp32_modules`` unless ``accelerate`` is
    installed (Wan's transformer).  Built from its config, its weights
    loaded from safetensors (one file or an index of shards), cast to
    ``dtype``; passed to the pipeline's ``from_pretrained`` by name."""
    import importlib.util

    if importlib.util.find_spec("accelerate") is not None:
        return {}
    import diffusers
    from safetensors.torch import load_file

    index = json.loads((folder / "model_index.json").read_text())
    out: dict[str, Any] = {}
    for name, spec in sorted(index.items()):
        if not (isinstance(spec, list) and len(spec) == 2 and spec[0] == "diffusers"):
            continue
        cls = getattr(diffusers, str(spec[1]), None)
        if cls is None or not getattr(cls, "_keep_in_fp32_modules", None):
            continue
        sub = folder / name
        model = cls.from_config(cls.load_config(str(sub)))
        shards = sorted(sub.glob("*.safetensors"))
        state: dict[str, Any] = {}
        for shard in shards:
            state.update(load_file(str(shard)))
        model.load_state_dict(state)
        out[name] = model.to(dtype).eval()
    return out
