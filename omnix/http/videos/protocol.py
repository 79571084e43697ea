"""The videos API's bodies, as typed msgspec Structs.

Owns: ``VideoForm`` (the text fields of ``POST /v1/videos``' multipart
form: OpenAI's and vLLM-Omni's), ``Video`` (OpenAI's ``Video`` object, what
every route of the room answers about a job), ``VideoError``, ``VideoList``
and ``VideoDeleted``.  Does not own what a form means (``plan.py``) nor
filling a ``Video`` (``render.py``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from omnix.http.common.fields import REQUEST, Seed, Steps

VideoStatus = Literal["queued", "in_progress", "completed", "failed"]


class VideoForm(msgspec.Struct, **REQUEST):
    """``POST /v1/videos``' text fields (the ``input_reference`` image is
    the form's one file).  ``seconds``, ``size``, ``model`` and ``prompt``
    are OpenAI's; ``width``, ``height``, ``num_frames``, ``fps``, ``seed``,
    ``num_inference_steps``, ``guidance_scale``, ``true_cfg_scale`` and
    ``negative_prompt`` vLLM-Omni's."""

    prompt: Annotated[str, Meta(min_length=1, max_length=32000)]
    model: str = ""
    seconds: Annotated[float, Meta(gt=0, le=600)] | None = None
    size: Annotated[str, Meta(pattern=r"^[1-9][0-9]{0,4}x[1-9][0-9]{0,4}$")] | None = None
    width: Annotated[int, Meta(ge=1, le=8192)] | None = None
    height: Annotated[int, Meta(ge=1, le=8192)] | None = None
    num_frames: Annotated[int, Meta(ge=1, le=10000)] | None = None
    fps: Annotated[int, Meta(ge=1, le=120)] | None = None
    seed: Seed | None = None
    num_inference_steps: Steps | None = None
    guidance_scale: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    true_cfg_scale: Annotated[float, Meta(ge=0.0, le=100.0)] | None = None
    negative_prompt: Annotated[str, Meta(max_length=32000)] | None = None
    user: str | None = None


class VideoError(msgspec.Struct, kw_only=True):
    code: str
    message: str


class Video(msgspec.Struct, kw_only=True):
    """OpenAI's ``Video``; ``fps``, ``num_frames`` and ``request_ids`` are
    omnix's (what the job makes, and its request in the log)."""

    id: str
    object: Literal["video"] = "video"
    model: str
    status: VideoStatus
    progress: int
    created_at: int
    completed_at: int | None = None
    expires_at: int | None = None
    error: VideoError | None = None
    prompt: str | None = None
    remixed_from_video_id: str | None = None
    seconds: str
    size: str
    fps: int
    num_frames: int
    #: times the generation started over from step 0 (a server restarted
    #: mid-job on its log: a diffusion stage cannot continue from a step)
    restarts: int = 0
    #: what the client asked where rounding changed it ("seconds=4 size=720x1280")
    asked: str | None = None
    request_ids: list[str]


class VideoList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Video]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class VideoDeleted(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["video.deleted"] = "video.deleted"
    deleted: bool = True
