"""The diffusion stage engine: a diffusers pipeline from a local folder.

Owns: loading the pipeline (``DiffusionPipeline.from_pretrained``, local
files only) onto a device, building each request's call from its input
pieces and ``StageParams``, reporting steps, cancelling between steps and
encoding the image (PNG, JPEG or WebP: ``StageParams.output_format``).
Also what a model folder says about which parameters its pipeline honours
(``describe_model``, ``refusal``: read from its JSON configs, no torch), so
the HTTP layer refuses a parameter before admission rather than the
pipeline ignoring it.  Does not own the models (``omnix.models``) or the
stage plumbing (``omnix.stages``).

Input: the prompt is the pieces' text concatenated (upstream text deltas
join exactly), or, for a source stage, the request's messages' contents.
The whole input is awaited before denoising starts: a diffusion step needs
the full prompt.  Output: one ``EngineOutput(step=i, total=n)`` per finished
step, then ``EngineOutput(modality="image", data=the encoded file,
media_type="image/png" (or image/jpeg, image/webp), finish_reason="stop")``.

Parameters: ``num_inference_steps``, ``width``, ``height`` and the seed
always; ``guidance_scale``, ``negative_prompt`` and ``true_cfg_scale`` when
given, and only if the pipeline honours them (``refusal``; a parameter its
``__call__`` does not take raises instead of being dropped).

Cancellation: ``abort`` sets a flag that the step callback checks at the
end of every step; when set the callback raises, so the pipeline stops
before the next step (and skips the VAE decode).  The step in flight when
the abort arrives finishes; nothing is yielded after ``abort``.

The pipeline call blocks, so it runs in this engine's single worker thread
(capacity 1: one pipeline, one request at a time), keeping the worker's
event loop free.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import io
import json
import os
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, assert_never

import msgspec

from omnix.engines.device import pick_device
from omnix.events.types import StageParams
from omnix.models.paths import resolve_model
from omnix.pipelines.config import DiffusersArgs
from omnix.transport.work import EngineInfo, EngineOutput, GenerateRequest, InputPiece

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
TRUE_CFG_PIPELINES = frozenset({"FluxPipeline"})


class DiffusionModel(msgspec.Struct, frozen=True):
    """What a diffusers model folder says about its pipeline."""

    #: ``model_index.json``'s ``_class_name`` ("FluxPipeline")
    pipeline: str
    #: ``transformer/config.json``'s ``guidance_embeds``; None when absent
    guidance_embeds: bool | None = None


def describe_model(args: DiffusersArgs) -> DiffusionModel | None:
    """The stage's model as its JSON configs describe it (no torch, no
    diffusers import: the HTTP server calls it); None when the folder is
    not there (yet) or not a diffusers folder."""
    try:
        folder = resolve_model(args.model)
        index = json.loads((folder / "model_index.json").read_text())
        guidance: bool | None = None
        tconf = folder / "transformer" / "config.json"
        if tconf.is_file():
            value = json.loads(tconf.read_text()).get("guidance_embeds")
            guidance = value if isinstance(value, bool) else None
        return DiffusionModel(pipeline=str(index.get("_class_name", "")), guidance_embeds=guidance)
    except (OSError, ValueError, AttributeError, KeyError):
        return None


def refusal(model: DiffusionModel, p: StageParams) -> tuple[str, str] | None:
    """(parameter, why) for a parameter of ``p`` the model's pipeline would
    ignore; None when it honours them all.  The HTTP layer answers 400 with
    it before admission; the engine raises with it (a defence: a request
    built around the HTTP layer fails rather than being silently changed)."""
    if p.output_format is not None and p.output_format not in IMAGE_FORMATS:
        return "output_format", f"{p.output_format!r} is not one of png, jpeg, webp"
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


class _Aborted(Exception):
    """Raised from the step callback to stop a pipeline call."""


class DiffusersEngine:
    """``Engine`` over a diffusers pipeline.  Built as ``DiffusersEngine(args)``."""

    def __init__(self, args: DiffusersArgs) -> None:
        self.args = args
        self.pipe: Any = None
        self.device = "cpu"
        self._flags: dict[str, threading.Event] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._accepts: set[str] = set()
        self._max_sequence_length: int | None = None
        self._model: DiffusionModel | None = None
        #: (request_id, steps run, "done" | "aborted" | "error") per finished call.
        self.history: collections.deque[tuple[str, int, str]] = collections.deque(maxlen=64)

    async def start(self) -> EngineInfo:
        folder = resolve_model(self.args.model)
        self._model = describe_model(self.args)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.device = pick_device(self.args.device)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="omnix-diffusers")
        loop = asyncio.get_running_loop()
        self.pipe = await loop.run_in_executor(self._pool, self._load, folder)
        return EngineInfo(engine="diffusers", capacity=1, device=self.device, model=str(folder))

    def _load(self, folder: Path) -> Any:
        import torch
        from diffusers import DiffusionPipeline

        dtype = getattr(torch, self.args.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {self.args.dtype!r}: use float32, float16 or bfloat16")
        from diffusers.utils import logging as dlog
        from transformers.utils import logging as tlog

        # A server draws no progress bars (steps are reported as outputs).
        dlog.disable_progress_bar()
        tlog.disable_progress_bar()
        pipe = DiffusionPipeline.from_pretrained(str(folder), dtype=dtype, local_files_only=True)
        pipe = pipe.to(self.device)
        pipe.set_progress_bar_config(disable=True)
        params = inspect.signature(pipe.__call__).parameters
        self._accepts = set(params)
        # Pipelines pad the prompt to max_sequence_length (Flux: 512) whatever
        # the tokenizer can hold; cap it at the tokenizer's own limit (77 for
        # the tiny model: 8x fewer text tokens in every denoising step).
        if "max_sequence_length" in params:
            default = params["max_sequence_length"].default
            tok = getattr(pipe, "tokenizer_2", None) or getattr(pipe, "tokenizer", None)
            limit = getattr(tok, "model_max_length", None)
            if isinstance(default, int) and isinstance(limit, int) and 0 < limit < default:
                self._max_sequence_length = limit
        return pipe

    def generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        return self._generate(request, inputs)

    async def abort(self, request_id: str) -> None:
        flag = self._flags.get(request_id)
        if flag is not None:
            flag.set()

    async def close(self) -> None:
        for flag in self._flags.values():
            flag.set()
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, True)
        self.pipe = None

    async def _generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        if self.pipe is None or self._pool is None:
            raise RuntimeError("DiffusersEngine.generate before start() (or after close())")
        rid = request.request_id
        flag = threading.Event()
        self._flags[rid] = flag
        try:
            prompt = _prompt_of([p async for p in inputs])
            if flag.is_set():
                return
            kwargs, steps = self._call_kwargs(request, prompt)
            fmt, media_type = IMAGE_FORMATS[request.params.output_format or "png"]
            loop = asyncio.get_running_loop()
            events: asyncio.Queue[_Posted] = asyncio.Queue()

            def post(ev: _Posted) -> None:
                try:
                    loop.call_soon_threadsafe(events.put_nowait, ev)
                except RuntimeError:
                    pass  # the loop is gone (shutdown): nobody is listening

            loop.run_in_executor(self._pool, self._run, rid, kwargs, fmt, flag, post)
            while True:
                ev = await events.get()
                if flag.is_set():
                    return
                match ev:
                    case _Step():
                        yield EngineOutput(modality="image", step=ev.done, total=steps)
                    case _Image():
                        yield EngineOutput(
                            modality="image",
                            data=ev.data,
                            media_type=media_type,
                            finish_reason="stop",
                        )
                        return
                    case _Raised():
                        raise ev.error
                    case _Stopped():  # only with the flag set, checked above
                        return
                    case _:
                        assert_never(ev)
        finally:
            # An abort (or the worker cancelling this task) leaves the flag set,
            # so a call still running stops at its next step.
            flag.set()
            self._flags.pop(rid, None)

    def _call_kwargs(self, request: GenerateRequest, prompt: str) -> tuple[dict[str, Any], int]:
        import torch

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
        seed = p.seed if p.seed is not None else request.seed
        kwargs: dict[str, Any] = {
            "prompt": prompt,
            "num_inference_steps": steps,
            "width": p.width or a.default_size,
            "height": p.height or a.default_size,
            # A CPU generator: the same seed gives the same initial noise on
            # every device.
            "generator": torch.Generator("cpu").manual_seed(seed % (1 << 63)),
        }
        given: dict[str, Any] = {
            "guidance_scale": p.guidance_scale,
            "negative_prompt": p.negative_prompt,
            "true_cfg_scale": p.true_cfg_scale,
        }
        for name, value in given.items():
            if value is None:
                continue
            if name not in self._accepts:
                raise ValueError(
                    f"{name} is not honoured: this diffusers pipeline's __call__ takes no {name}"
                )
            kwargs[name] = value
        if self._max_sequence_length is not None:
            kwargs["max_sequence_length"] = self._max_sequence_length
        return {k: v for k, v in kwargs.items() if k in self._accepts or k == "prompt"}, steps

    def _run(
        self,
        rid: str,
        kwargs: dict[str, Any],
        fmt: str,
        flag: threading.Event,
        post: Callable[[_Posted], None],
    ) -> None:
        """In the pipeline thread: run one call, post progress and the result."""
        done = 0

        def on_step_end(pipe: Any, i: int, t: Any, tensors: dict[str, Any]) -> dict[str, Any]:
            nonlocal done
            done = i + 1
            post(_Step(done))
            if flag.is_set():
                raise _Aborted
            return tensors

        if flag.is_set():
            self.history.append((rid, 0, "aborted"))
            return
        if "callback_on_step_end" in self._accepts:
            kwargs["callback_on_step_end"] = on_step_end
        try:
            image = self.pipe(**kwargs).images[0]
            buf = io.BytesIO()
            image.convert("RGB").save(buf, format=fmt)
        except _Aborted:
            self.history.append((rid, done, "aborted"))
            post(_Stopped())
            return
        except Exception as exc:
            self.history.append((rid, done, "error"))
            post(_Raised(exc))
            return
        self.history.append((rid, done, "done"))
        post(_Image(buf.getvalue()))


class _Step(NamedTuple):
    """The pipeline thread finished denoising step ``done`` (1-based)."""

    done: int


class _Image(NamedTuple):
    """The call ended with this encoded image."""

    data: bytes


class _Raised(NamedTuple):
    """The call failed."""

    error: BaseException


class _Stopped(NamedTuple):
    """The call stopped at a step because its request was aborted."""


#: What the pipeline thread posts to the request's loop, in order.
_Posted = _Step | _Image | _Raised | _Stopped


def _prompt_of(pieces: list[InputPiece]) -> str:
    text = "".join(p.text for p in pieces)
    if text.strip():
        return text.strip()
    contents = [m.content for p in pieces for m in p.messages if m.role != "system"]
    return "\n".join(contents).strip()
