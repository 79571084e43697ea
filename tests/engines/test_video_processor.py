"""omnix's torchvision-free Qwen2-VL video processor equals transformers'.

transformers' ``Qwen2VLVideoProcessor`` cannot be imported here (no
torchvision), so it is held to transformers' reference math three ways:

* against the steps of ``Qwen2VLVideoProcessor._preprocess`` as
  transformers writes them (``video_processing_qwen2_vl.py``:
  ``smart_resize``, ``resize``, the fused rescale-and-normalise of
  ``image_processing_backends.TorchvisionBackend``, ``patchify``), with
  torchvision's ``resize_image`` kernel as torchvision writes it
  (bicubic with antialiasing, uint8 native on a CPU), using transformers'
  own ``smart_resize``, ``group_videos_by_shape`` and ``reorder_videos``:
  equal, bit for bit, for odd frame counts (padded), up- and downscaled
  frames, several videos at once;
* against transformers' running PIL image processor of the same model
  family (``Qwen2VLImageProcessorPil``, which needs no torchvision): a
  video of one image repeated over a temporal patch is that image's
  patches, where no resize is needed;
* loaded as the Qwen3-Omni processor's video slot through the vLLM
  plugin, from the tiny thinker's own config.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.engines

from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (  # noqa: E402
    Qwen2VLImageProcessorPil,
    smart_resize,
)
from transformers.video_utils import group_videos_by_shape, reorder_videos  # noqa: E402

from omnix.engines.video_processor import QwenVideoProcessor  # noqa: E402

MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]


def _tv_resize(image: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """torchvision.transforms.v2.functional.resize_image, BICUBIC, antialias."""
    shape = image.shape
    c, oh, ow = shape[-3:]
    if (h, w) == (oh, ow):
        return image
    dtype = image.dtype
    acceptable = [torch.float32, torch.float64]
    if image.device.type == "cpu":  # _do_native_uint8_resize_on_cpu(BICUBIC) is True
        acceptable.append(torch.uint8)
    image = image.reshape(-1, c, oh, ow)
    need_cast = dtype not in acceptable
    if need_cast:
        image = image.to(dtype=torch.float32)
    image = torch.nn.functional.interpolate(
        image, size=[h, w], mode="bicubic", align_corners=False, antialias=True
    )
    if need_cast:
        if dtype == torch.uint8:
            image = image.clamp_(min=0, max=255)
        image = image.round_().to(dtype=dtype)
    return image.reshape((*shape[:-3], c, h, w))


def _reference(
    videos: list[np.ndarray], patch: int, merge: int, tps: int, low: int, high: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2VLVideoProcessor's _prepare_input_videos + _preprocess."""
    vids = [torch.from_numpy(v).contiguous().permute(0, 3, 1, 2).contiguous() for v in videos]
    grouped, index = group_videos_by_shape(vids)
    resized = {}
    for shape, stacked in grouped.items():
        h, w = stacked.shape[-2:]
        rh, rw = smart_resize(h, w, factor=patch * merge, min_pixels=low, max_pixels=high)
        resized[shape] = _tv_resize(stacked, rh, rw)
    grouped, index = group_videos_by_shape(reorder_videos(resized, index))
    out, grids = {}, {}
    for shape, stacked in grouped.items():
        # _fuse_mean_std_and_rescale_factor, then tvF.normalize
        mean = torch.tensor(MEAN) * (1.0 / (1 / 255))
        std = torch.tensor(STD) * (1.0 / (1 / 255))
        x = stacked.to(torch.float32).clone()
        x = x.sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))
        # patchify
        b, t, c, h, w = x.shape
        if pad := -t % tps:
            x = torch.cat((x, x[:, -1:].expand(-1, pad, -1, -1, -1)), dim=1)
            t += pad
        gt, gh, gw = t // tps, h // patch, w // patch
        p = x.view(b, gt, tps, c, gh // merge, merge, patch, gw // merge, merge, patch)
        p = p.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
        out[shape] = p.reshape(b, gt * gh * gw, c * tps * patch * patch)
        grids[shape] = [[gt, gh, gw]] * b
    return torch.cat(reorder_videos(out, index), dim=0), torch.tensor(reorder_videos(grids, index))


CASES = [
    # (frames, height, width) per video; patch, merge, temporal patch, min/max pixels
    ([(5, 90, 120)], 16, 2, 2, 4096, 65536),  # odd T, resized
    ([(4, 64, 64), (3, 40, 200)], 16, 2, 2, 4096, 65536),  # two videos, two shapes
    ([(2, 32, 32)], 14, 2, 2, 56 * 56, 28 * 28 * 768),  # upscaled to the minimum
    ([(6, 480, 640)], 14, 2, 2, 3136, 50176),  # downscaled to the maximum
    ([(2, 64, 96)], 16, 2, 2, 4096, 65536),  # already the size: no resize
]


@pytest.mark.parametrize(("shapes", "patch", "merge", "tps", "low", "high"), CASES)
def test_equal_to_transformers_reference_math(shapes, patch, merge, tps, low, high):
    rng = np.random.default_rng(len(shapes) * 7 + patch)
    videos = [rng.integers(0, 256, (*s, 3), dtype=np.uint8) for s in shapes]
    proc = QwenVideoProcessor(
        patch_size=patch, merge_size=merge, temporal_patch_size=tps, min_pixels=low, max_pixels=high
    )
    got = proc(videos=videos, return_tensors="pt")
    want_pixels, want_grid = _reference(videos, patch, merge, tps, low, high)
    assert torch.equal(got["video_grid_thw"], want_grid)
    assert got["pixel_values_videos"].dtype == torch.float32
    assert torch.equal(got["pixel_values_videos"], want_pixels)
    n = sum(proc.get_num_of_video_patches(t, h, w) for t, h, w in shapes)  # vLLM's token budget
    assert n == int(want_grid.prod(dim=1).sum())


def test_a_still_video_is_the_images_patches():
    """transformers' running PIL image processor: an image is a video of
    one temporal patch of that image (no resize at this size)."""
    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)
    kw = {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2}
    pil = Qwen2VLImageProcessorPil(min_pixels=4096, max_pixels=65536, **kw)
    want = pil(images=[image], return_tensors="pt")
    got = QwenVideoProcessor(min_pixels=4096, max_pixels=65536, **kw)(
        videos=[np.stack([image, image])], return_tensors="pt"
    )
    assert got["video_grid_thw"].tolist() == want["image_grid_thw"].tolist()
    torch.testing.assert_close(
        got["pixel_values_videos"], want["pixel_values"].to(torch.float32), rtol=0, atol=1e-5
    )


def test_sampling_frames_as_transformers_does():
    proc = QwenVideoProcessor(
        patch_size=16, merge_size=2, temporal_patch_size=2, min_pixels=1024, max_pixels=4096
    )
    assert proc.sample_frames(10, 5.0, num_frames=4).tolist() == [0, 2, 5, 7]
    # fps: 10 frames at 5 fps is 2 s; 2 fps wants 4 frames (min_frames 4)
    assert proc.sample_frames(10, 5.0, fps=2).tolist() == [0, 2, 5, 7]
    video = np.zeros((10, 32, 32, 3), np.uint8)
    out = proc(videos=[video], do_sample_frames=True, num_frames=4, return_tensors="pt")
    assert out["video_grid_thw"].tolist() == [[2, 2, 2]]


def test_the_plugin_fills_the_qwen3_omni_video_slot(tiny_models):
    from transformers import AutoProcessor

    from omnix.engines.vllm_plugin import register

    register()
    processor = AutoProcessor.from_pretrained(str(tiny_models.path("omni_thinker")))
    assert isinstance(processor.video_processor, QwenVideoProcessor)
    vp = processor.video_processor
    assert (vp.patch_size, vp.merge_size, vp.temporal_patch_size) == (16, 2, 2)
    assert vp.size == {"shortest_edge": 4096, "longest_edge": 65536}
    video = np.random.default_rng(0).integers(0, 256, (4, 64, 64, 3), dtype=np.uint8)
    out = processor(
        text=["<|vision_start|><|video_pad|><|vision_end|>hi"],
        videos=[video],
        return_tensors="pt",
    )
    # As transformers' processor calls its video processor: the Omni
    # processor's video defaults (at least 128 x 32 x 32 pixels a frame)
    # win over the config's image sizes.
    grid = out["video_grid_thw"].tolist()
    assert grid == [[2, 24, 24]]
    video_id = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert int((out["input_ids"] == video_id).sum()) == 2 * 24 * 24 // 4
