"""A video form -> the one request a job is, with its shape mapped onto
what the pipeline accepts.

Owns: the mapping of ``seconds``, ``fps``, ``num_frames``, ``size`` (or
``width`` / ``height``) onto the video stage's model (``shape``): sides
rounded to the nearest multiple of the model's size step, frames to the
nearest ``step * k + 1`` (from ``num_frames``, else ``seconds * fps``,
else the stage's default), within the longest side and the most frames
the model's positions reach, else a 400 naming the field and the values
it takes; what the client asked, where rounding changed it, recorded
(``VideoOptions.asked``); and the ``RequestSpec`` (prompt, the
``input_reference`` image as the first frame, the stage's parameters,
the seed, ``VideoOptions``).

Does not own reading the form or its file (``router.py``), admission
(``core.submit``) nor the ``Video`` object (``render.py``).
"""

from __future__ import annotations

import msgspec

from omnix.engines.diffusers_model import DiffusionModel
from omnix.events.options import API_VIDEOS, VideoOptions
from omnix.events.types import ChatMessage, MediaPart, RequestSpec, StageParams
from omnix.http.common.plan import DecodedBlob, Plan, PlanContext
from omnix.http.common.rendering import RENDER_VERSION
from omnix.http.common.sampling import check_diffusion, check_engines
from omnix.http.core.errors import ApiError
from omnix.http.videos.protocol import VideoForm
from omnix.pipelines.config import DiffusersArgs

#: The longest side any video model here takes, when its folder says none.
MAX_SIDE = 4096


class Shape(msgspec.Struct, frozen=True):
    """What a job makes: its size, frame count and rate, its length as
    the ``Video`` object says it (``seconds``), and what the client asked
    where rounding changed it (``asked``, "" when nothing changed)."""

    width: int
    height: int
    num_frames: int
    fps: int
    seconds: str
    asked: str


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


def _side(v: int, multiple: int) -> int:
    return max(multiple, round(v / multiple) * multiple)


def _seconds(frames: int, fps: int) -> str:
    return f"{frames / fps:.4g}"


def _size(form: VideoForm, args: DiffusersArgs) -> tuple[int, int, str]:
    """(width, height, the field that gave them)."""
    if form.size is not None:
        w, h = (int(v) for v in form.size.split("x"))
        if (form.width is not None and form.width != w) or (
            form.height is not None and form.height != h
        ):
            raise _bad("size", f"size {form.size} and width/height disagree: send one of them.")
        return w, h, "size"
    if form.width is not None or form.height is not None:
        w = form.width or form.height or args.default_size
        h = form.height or form.width or args.default_size
        return w, h, "width" if form.width is not None else "height"
    return args.default_size, args.default_size, ""


def shape(form: VideoForm, args: DiffusersArgs, model: DiffusionModel | None) -> Shape:
    """``form``'s video as the stage's model takes it (see the module doc)."""
    multiple = model.size_multiple if model is not None else 16
    step = model.frame_step if model is not None and model.frame_step else 1
    longest = min(model.max_side or MAX_SIDE, MAX_SIDE) if model is not None else MAX_SIDE
    most = (model.max_frames if model is not None else 0) or 10_000
    asked: list[str] = []
    w0, h0, field = _size(form, args)
    w, h = _side(w0, multiple), _side(h0, multiple)
    if max(w, h) > longest:
        raise _bad(
            field or "size",
            f"size {w0}x{h0}: this model makes sides that are multiples of {multiple} from "
            f"{multiple} to {longest}. Send a smaller size.",
        )
    if field and (w, h) != (w0, h0):
        asked.append(f"size={w0}x{h0}")
    fps = form.fps or args.default_fps
    if form.num_frames is not None:
        want, param = form.num_frames, "num_frames"
    elif form.seconds is not None:
        want, param = max(1, round(form.seconds * fps)), "seconds"
    else:
        want, param = args.default_frames, ""
    frames = max(1, round((want - 1) / step) * step + 1)
    if frames > most:
        limit = f"{most} frames ({_seconds(most, fps)} s at {fps} fps)"
        raise _bad(
            param or "num_frames",
            f"{param or 'the default'} asks for {want} frames; this model makes "
            f"{step}k + 1 frames, at most {limit}. Send fewer.",
        )
    if param == "num_frames" and frames != want:
        asked.append(f"num_frames={want}")
    if (
        param == "seconds"
        and form.seconds is not None
        and _seconds(frames, fps) != f"{form.seconds:.4g}"
    ):
        asked.append(f"seconds={form.seconds:g}")
    return Shape(w, h, frames, fps, _seconds(frames, fps), " ".join(asked))


def video_plan(
    form: VideoForm,
    served: PlanContext,
    *,
    reference: tuple[MediaPart, DecodedBlob] | None = None,
    traceparent: str = "",
) -> Plan:
    """One request: the job.  ``reference``: the ``input_reference`` image
    (the first frame), decoded."""
    served.check_model(form.model)
    stage = served.output_stage("video")
    args = served.pipeline.stage(stage).engine
    assert isinstance(args, DiffusersArgs)  # router.check_pipeline
    got = shape(form, args, served.diffusion_model(stage))
    params = {
        stage: StageParams(
            num_inference_steps=form.num_inference_steps,
            guidance_scale=form.guidance_scale,
            true_cfg_scale=form.true_cfg_scale,
            width=got.width,
            height=got.height,
            negative_prompt=form.negative_prompt,
            num_frames=got.num_frames,
            fps=got.fps,
        )
    }
    check_engines(served, params)
    check_diffusion(served, params)
    messages: tuple[ChatMessage, ...] = ()
    blobs: tuple[DecodedBlob, ...] = ()
    if reference is not None:
        messages = (ChatMessage(role="user", content=form.prompt, media=(reference[0],)),)
        blobs = (reference[1],)
    rid = served.new_request_id()
    spec = RequestSpec(
        prompt=form.prompt,
        messages=messages,
        outputs=("video",),
        stage_params=params,
        seed=served.seed(form.seed),
        api=API_VIDEOS,
        model=served.model,
        traceparent=traceparent,
        response=VideoOptions(
            render=RENDER_VERSION,
            usage_stage=stage,
            video_stage=stage,
            seconds=got.seconds,
            size=f"{got.width}x{got.height}",
            fps=got.fps,
            num_frames=got.num_frames,
            asked=got.asked,
        ),
    )
    return Plan(specs=((rid, spec),), blobs=blobs)
