"""Shared pipelines for the orchestrator tests (scripted engines only)."""

from __future__ import annotations

import pytest

from omnix.pipelines.config import PipelineConfig
from omnix.testing.pipelines import scripted_omni, scripted_omni_toml

OMNI_LIKE = scripted_omni_toml("sim-omni")


def omni_like(**overrides: str) -> PipelineConfig:
    """The thinker -> talker -> code2wav shape (``omnix.testing.pipelines``);
    ``overrides`` maps a stage (or ``edge_<source>``) to TOML ``key = value``
    lines that replace or extend its table."""
    return scripted_omni("sim-omni", **overrides)


@pytest.fixture
def omni_cfg():
    return omni_like()
