"""Fixtures for the tiny-model tests: the session's built models."""

from __future__ import annotations

import pytest

from omnix.models.paths import ModelPaths
from tests.model_fixtures import session_models


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> ModelPaths:
    return session_models(tmp_path_factory)
