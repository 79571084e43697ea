"""The tiny Qwen3-Omni thinker: built locally and deterministically, and
loaded by a real vLLM engine that takes audio and image input through
omnix's torchvision shim (a vLLM general plugin)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from omnix.models.build import build_model
from omnix.models.paths import ModelPaths, folder_digest

HERE = Path(__file__).resolve().parent


def test_the_omni_thinker_builds_the_same_folder_for_a_seed(
    tiny_models: ModelPaths, tmp_path: Path
) -> None:
    again = build_model("omni_thinker", tmp_path / "a", seed=0)
    other = build_model("omni_thinker", tmp_path / "b", seed=1)
    built = Path(tiny_models.omni_thinker)
    assert folder_digest(again) == folder_digest(built)
    assert folder_digest(other) != folder_digest(built)


def test_the_shim_is_a_vllm_general_plugin() -> None:
    found = {ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert "omnix.engines.vllm_plugin:register" in found


@pytest.mark.engines
@pytest.mark.slow
def test_a_spawned_vllm_engine_takes_audio_and_image_input(tiny_models: ModelPaths) -> None:
    done = subprocess.run(
        [sys.executable, str(HERE / "omni_chat.py"), tiny_models.omni_thinker],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    text, audio, image = (
        counts["text"]["prompt"],
        counts["audio"]["prompt"],
        counts["image"]["prompt"],
    )
    # A 2 s clip is 26 audio placeholder tokens (+ start/end markers and a
    # newline); a 320x224 image 54 image tokens (+3): the thinker saw them.
    assert audio - text >= 26
    assert image - text >= 54
    assert all(c["output"] > 0 for c in counts.values())
