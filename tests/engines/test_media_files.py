"""Encoded media files (``omnix.engines.media_files``): an MP4 of the same
frames is the same bytes, in any process and any number of times."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("av")

ENCODE = """
import hashlib, numpy as np
from omnix.engines.media_files import encode_mp4
f = np.random.default_rng(0).integers(0, 255, (9, 32, 64, 3), dtype=np.uint8)
f = (np.cumsum(f, axis=2) % 255).astype(np.uint8)
print(" ".join(hashlib.sha256(encode_mp4(f, 8)).hexdigest() for _ in range(4)))
"""


def test_an_mp4_of_the_same_frames_is_the_same_bytes_in_every_process() -> None:
    # Each encode's output freed before the next: with PyAV's own RGB to
    # YUV conversion one encode in a few processes came out different.
    digests = set()
    for _ in range(4):
        done = subprocess.run(
            [sys.executable, "-c", ENCODE], capture_output=True, text=True, check=True
        )
        digests.update(done.stdout.split())
    assert len(digests) == 1


def test_the_planes_are_bt601_limited_range() -> None:
    from omnix.engines.media_files import mp4_frames, rgb_to_yuv420

    white, black = np.full((2, 2, 3), 255, np.uint8), np.zeros((2, 2, 3), np.uint8)
    assert rgb_to_yuv420(white).ravel().tolist() == [235] * 4 + [128, 128]
    assert rgb_to_yuv420(black).ravel().tolist() == [16] * 4 + [128, 128]
    red = np.zeros((2, 2, 3), np.uint8)
    red[..., 0] = 255
    assert rgb_to_yuv420(red).ravel().tolist() == [81] * 4 + [90, 240]
    # and a decoder reads the colours back
    from omnix.engines.media_files import encode_mp4

    frames = np.zeros((5, 32, 32, 3), np.uint8)
    frames[..., 0] = np.arange(32)[None, None, :] * 8
    frames[..., 2] = np.arange(32)[None, :, None] * 8
    back = mp4_frames(encode_mp4(frames, 8)).astype(int)
    assert np.abs(back - frames).mean() < 4
