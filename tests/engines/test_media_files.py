"""Encoded media files (``omnix.engines.media_files``): an MP4 of the same
frames is the same bytes, in any process and any number of times (the
video engine's test holds it after a diffusion run too)."""

from __future__ import annotations

import subprocess
import sys

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
    # Each encode's output freed before the next; with x264's lookahead and
    # macroblock tree, some encodes of a process came out different.
    digests = set()
    for _ in range(4):
        done = subprocess.run(
            [sys.executable, "-c", ENCODE], capture_output=True, text=True, check=True
        )
        digests.update(done.stdout.split())
    assert len(digests) == 1
