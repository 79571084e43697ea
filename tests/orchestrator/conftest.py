"""Shared pipelines for the orchestrator tests (scripted engines only)."""

from __future__ import annotations

import pytest

from omnix.pipelines.validate import parse_pipeline

OMNI_LIKE = """
name = "sim-omni"
[[stages]]
name = "thinker"
engine = { kind = "scripted", chunks_per_piece = 12, delay_ms = 2 }
[[stages]]
name = "talker"
engine = { kind = "scripted", chunks_per_piece = 3, delay_ms = 1, output_modality = "codec" }
[[stages]]
name = "code2wav"
engine = { kind = "scripted", chunks_per_piece = 1, delay_ms = 1, output_modality = "audio" }
[[edges]]
source = "thinker"
target = "talker"
forward = "sentence"
[[edges]]
source = "talker"
target = "code2wav"
forward = "chunk"
every = 2
[outputs]
text = "thinker"
audio = "code2wav"
"""


def omni_like(**stage_overrides: str):
    """The thinker -> talker -> code2wav shape; ``stage_overrides`` maps a
    stage name to TOML ``key = value`` lines that replace or extend that
    stage's table."""
    blocks = OMNI_LIKE.split("[[")
    for stage, extra in stage_overrides.items():
        for i, block in enumerate(blocks):
            if block.startswith("stages]]") and f'name = "{stage}"\n' in block:
                lines = block.rstrip("\n").split("\n")
                for new in extra.strip().split("\n"):
                    key = new.split("=")[0].strip()
                    lines = [ln for ln in lines if ln.split("=")[0].strip() != key]
                    lines.append(new)
                blocks[i] = "\n".join(lines) + "\n"
    return parse_pipeline("[[".join(blocks))


@pytest.fixture
def omni_cfg():
    return omni_like()
