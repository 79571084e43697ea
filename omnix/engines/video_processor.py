"""Qwen2-VL's video processor without torchvision, for Qwen-Omni thinkers.

Owns ``QwenVideoProcessor``: what transformers' ``Qwen2VLVideoProcessor``
computes (the processor Qwen2.5-Omni's and Qwen3-Omni's processor
configs name), the same ``pixel_values_videos`` and ``video_grid_thw``
for the same frames, built on torch alone.  transformers' class cannot be
imported where torchvision is missing (vLLM's CPU build), and without a
video processor a Qwen-Omni processor refuses every video.  The steps, in
transformers' order (``video_processing_qwen2_vl.py``,
``image_processing_backends.py``):

1. frames to ``(T, C, H, W)`` tensors (channels last is permuted; grey
   repeated to RGB);
2. ``smart_resize`` of each video's height and width (factor ``patch_size
   * merge_size``, pixels within ``size["shortest_edge"]`` and
   ``size["longest_edge"]``), then a resize as torchvision's tensor kernel
   does it: nothing when the size is unchanged; on a CPU, bicubic with
   antialiasing straight on uint8 (torch's native kernel, which
   torchvision uses for bicubic there); elsewhere in float32, clamped,
   rounded and cast back;
3. rescale and normalise fused (mean and std times ``1 / rescale_factor``,
   then ``(x - mean) / std`` in float32);
4. the frame count padded to a multiple of ``temporal_patch_size`` with
   copies of the last frame, and the patches flattened in Qwen2-VL's order
   (``grid_t, grid_h / merge, grid_w / merge, merge, merge, C,
   temporal_patch, patch, patch``).

Frame sampling (``do_sample_frames``, with ``fps`` or ``num_frames`` and
the video's metadata) follows ``Qwen2VLVideoProcessor.sample_frames``.
``tests/engines/test_video_processor.py`` holds it equal to transformers'
reference math.  Does not own registering it in transformers
(``vllm_plugin.py``) nor decoding videos (vLLM's loaders, omnix's media
decoder).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
from transformers.video_processing_utils import VideoProcessorMixin
from transformers.video_utils import group_videos_by_shape, reorder_videos

#: ``Qwen2VLVideoProcessor``'s defaults (transformers 5.x).
DEFAULTS: dict[str, Any] = {
    "size": {"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768},
    "image_mean": list(OPENAI_CLIP_MEAN),
    "image_std": list(OPENAI_CLIP_STD),
    "rescale_factor": 1 / 255,
    "do_resize": True,
    "do_rescale": True,
    "do_normalize": True,
    "do_convert_rgb": True,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "min_frames": 4,
    "max_frames": 768,
    "do_sample_frames": False,
    "fps": None,
    "num_frames": None,
}


def resize_like_torchvision(video: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``video`` (..., C, H, W) resized as torchvision's ``resize_image``
    kernel does with bicubic interpolation and antialiasing."""
    *lead, c, h, w = video.shape
    if (h, w) == (height, width) or video.numel() == 0:
        return video
    flat = video.reshape(-1, c, h, w)
    dtype = flat.dtype
    native = dtype in (torch.float32, torch.float64) or (
        dtype == torch.uint8 and flat.device.type == "cpu"
    )
    x = flat if native else flat.to(torch.float32)
    x = torch.nn.functional.interpolate(
        x, size=[height, width], mode="bicubic", align_corners=False, antialias=True
    )
    if not native:
        if dtype == torch.uint8:
            x = x.clamp_(min=0, max=255)
        if not dtype.is_floating_point:
            x = x.round_()
        x = x.to(dtype)
    return x.reshape(*lead, c, height, width)


def patchify(
    videos: torch.Tensor, patch_size: int, merge_size: int, temporal_patch_size: int
) -> tuple[torch.Tensor, int, int, int]:
    """(B, T, C, H, W) -> (B, grid_t * grid_h * grid_w, C * tp * p * p) and the grid."""
    batch, frames, channel, height, width = videos.shape
    if pad := -frames % temporal_patch_size:
        videos = torch.cat((videos, videos[:, -1:].expand(-1, pad, -1, -1, -1)), dim=1)
        frames += pad
    grid_t = frames // temporal_patch_size
    grid_h, grid_w = height // patch_size, width // patch_size
    patches = videos.view(
        batch,
        grid_t,
        temporal_patch_size,
        channel,
        grid_h // merge_size,
        merge_size,
        patch_size,
        grid_w // merge_size,
        merge_size,
        patch_size,
    )
    patches = patches.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    flat = patches.reshape(
        batch, grid_t * grid_h * grid_w, channel * temporal_patch_size * patch_size * patch_size
    )
    return flat, grid_t, grid_h, grid_w


def _as_tensor(video: Any) -> torch.Tensor:
    """A video as (T, C, H, W): from (T, H, W, C) or (T, C, H, W) arrays or
    tensors, or a list of frames; grey frames repeated to three channels."""
    if isinstance(video, (list, tuple)):
        video = np.stack([np.asarray(f) for f in video])
    t = torch.from_numpy(np.ascontiguousarray(video)) if isinstance(video, np.ndarray) else video
    if t.ndim == 3:  # (T, H, W): grey
        t = t.unsqueeze(1)
    elif t.shape[-1] in (1, 3, 4) and t.shape[1] not in (1, 3, 4):
        t = t.permute(0, 3, 1, 2).contiguous()
    if t.shape[1] == 1:
        t = t.expand(-1, 3, -1, -1).contiguous()
    elif t.shape[1] == 4:
        t = t[:, :3].contiguous()
    return t


class QwenVideoProcessor(VideoProcessorMixin):
    """transformers' ``Qwen2VLVideoProcessor`` on torch alone (see the
    module doc).  Loaded from the model's processor config like the
    original; attributes as the original's (``size``, ``patch_size``,
    ``merge_size``, ``temporal_patch_size``...), which vLLM reads."""

    model_input_names = ["pixel_values_videos", "video_grid_thw"]
    # Set from the config by ``__init__`` (declared for the checker).
    size: dict[str, int]
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    num_frames: int | None
    fps: float | None

    def __init__(self, **kwargs: Any) -> None:
        size = dict(kwargs.pop("size", None) or DEFAULTS["size"])
        if (low := kwargs.pop("min_pixels", None)) is not None:
            size["shortest_edge"] = low
        if (high := kwargs.pop("max_pixels", None)) is not None:
            size["longest_edge"] = high
        for key in ("shortest_edge", "longest_edge"):
            size.setdefault(key, DEFAULTS["size"][key])
        for name, value in DEFAULTS.items():
            kwargs.setdefault(name, value)
        kwargs["size"] = size
        super().__init__(**kwargs)

    def __call__(self, videos: Any, **kwargs: Any) -> BatchFeature:  # type: ignore[override]
        return self.preprocess(videos, **kwargs)

    def _option(self, kwargs: dict[str, Any], name: str) -> Any:
        value = kwargs.get(name)
        return getattr(self, name) if value is None else value

    def sample_frames(self, total: int, video_fps: float | None, **kwargs: Any) -> torch.Tensor:
        """``Qwen2VLVideoProcessor.sample_frames``' indices."""
        num_frames = kwargs.get("num_frames")
        fps = kwargs.get("fps")
        if fps is not None and num_frames is not None:
            raise ValueError(
                "`num_frames` and `fps` are mutually exclusive arguments, please use only one!"
            )
        num_frames = num_frames if num_frames is not None else self.num_frames
        fps = fps if fps is not None else self.fps
        tps = self._option(kwargs, "temporal_patch_size")
        min_frames = self._option(kwargs, "min_frames")
        max_frames = self._option(kwargs, "max_frames")
        if num_frames is not None:
            num_frames = round(num_frames / tps) * tps
        elif fps is not None:
            if video_fps is None:
                raise ValueError("sampling at `fps` needs the video's fps (video_metadata)")
            max_frames = math.floor(min(max_frames, total) / tps) * tps
            num_frames = total / video_fps * fps
            num_frames = min(max(num_frames, min_frames), max_frames, total)
            num_frames = math.floor(num_frames / tps) * tps
        if num_frames is not None and num_frames > total:
            raise ValueError(
                f"Video can't be sampled. The inferred `num_frames={num_frames}` exceeds "
                f"`total_num_frames={total}`. Decrease `num_frames` or `fps` for sampling."
            )
        if num_frames is not None:
            return torch.arange(0, total, total / num_frames).int()
        return torch.arange(0, total).int()

    def preprocess(self, videos: Any, **kwargs: Any) -> BatchFeature:
        if isinstance(videos, (np.ndarray, torch.Tensor)) and videos.ndim in (3, 4):
            videos = [videos]
        tensors = [_as_tensor(v) for v in videos]
        if self._option(kwargs, "do_sample_frames"):
            metadata = kwargs.get("video_metadata") or [None] * len(tensors)
            if not isinstance(metadata, (list, tuple)):
                metadata = [metadata]
            out = []
            for t, meta in zip(tensors, metadata, strict=False):
                fps = meta.get("fps") if isinstance(meta, dict) else getattr(meta, "fps", None)
                out.append(t[self.sample_frames(t.shape[0], fps, **kwargs).long()])
            tensors = out
        return self._preprocess(tensors, **kwargs)

    def _preprocess(self, videos: list[torch.Tensor], **kwargs: Any) -> BatchFeature:
        patch = self._option(kwargs, "patch_size")
        merge = self._option(kwargs, "merge_size")
        tps = self._option(kwargs, "temporal_patch_size")
        size = dict(self._option(kwargs, "size"))
        if kwargs.get("min_pixels") is not None:
            size["shortest_edge"] = kwargs["min_pixels"]
        if kwargs.get("max_pixels") is not None:
            size["longest_edge"] = kwargs["max_pixels"]
        grouped, index = group_videos_by_shape(videos)
        resized = {}
        for shape, stacked in grouped.items():
            if self._option(kwargs, "do_resize"):
                h, w = smart_resize(
                    stacked.shape[-2],
                    stacked.shape[-1],
                    factor=patch * merge,
                    min_pixels=size["shortest_edge"],
                    max_pixels=size["longest_edge"],
                )
                stacked = resize_like_torchvision(stacked, h, w)
            resized[shape] = stacked
        grouped, index = group_videos_by_shape(reorder_videos(resized, index))
        done: dict[Any, torch.Tensor] = {}
        grids: dict[Any, list[list[int]]] = {}
        for shape, stacked in grouped.items():
            stacked = self._normalized(stacked, kwargs)
            patches, t, h, w = patchify(stacked, patch, merge, tps)
            done[shape] = patches
            grids[shape] = [[t, h, w]] * len(stacked)
        pixels = torch.cat(reorder_videos(done, index), dim=0)
        grid = torch.tensor(reorder_videos(grids, index))  # type: ignore[arg-type]
        return BatchFeature(
            data={"pixel_values_videos": pixels, "video_grid_thw": grid},
            tensor_type=kwargs.get("return_tensors"),
        )

    def _normalized(self, videos: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        """Rescale and normalise, fused as transformers fuses them."""
        rescale = self._option(kwargs, "do_rescale")
        normalize = self._option(kwargs, "do_normalize")
        factor = self._option(kwargs, "rescale_factor")
        mean = self._option(kwargs, "image_mean")
        std = self._option(kwargs, "image_std")
        if rescale and normalize:
            mean_t = torch.tensor(mean, device=videos.device) * (1.0 / factor)
            std_t = torch.tensor(std, device=videos.device) * (1.0 / factor)
        elif normalize:
            mean_t = torch.as_tensor(mean, device=videos.device)
            std_t = torch.as_tensor(std, device=videos.device)
        if normalize:
            x = videos.to(torch.float32)
            if x is videos:
                x = x.clone()
            m = mean_t.to(torch.float32).view(-1, 1, 1)
            s = std_t.to(torch.float32).view(-1, 1, 1)
            return x.sub_(m).div_(s)
        if rescale:
            return videos * factor
        return videos

    def get_num_of_video_patches(
        self, num_frames: int, height: int, width: int, videos_kwargs: Any = None
    ) -> int:
        """Patches of a video of this shape (vLLM asks, to budget tokens):
        ``Qwen2VLVideoProcessor.get_num_of_video_patches``."""
        kw = dict(videos_kwargs or {})
        size = kw.get("size") or self.size
        patch = kw.get("patch_size") or self.patch_size
        merge = kw.get("merge_size") or self.merge_size
        tps = kw.get("temporal_patch_size") or self.temporal_patch_size
        h, w = smart_resize(
            height,
            width,
            patch * merge,
            min_pixels=size["shortest_edge"],
            max_pixels=size["longest_edge"],
        )
        grid_t = (num_frames + -num_frames % tps) // tps
        return grid_t * (h // patch) * (w // patch)
