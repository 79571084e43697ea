"""The published diffusion models' numbers (``omnix.models.diffusion_real``)
give the published parameter counts: Wan2.1-T2V-1.3B's transformer 1.42 B
and its VAE 127 M, FLUX.1-dev's transformer 11.9 B and its VAE 84 M.
Built on torch's meta device: shapes only, no memory, no time."""

from __future__ import annotations

import importlib.util

import pytest

from omnix.models.diffusion_real import (
    FLUX1_TRANSFORMER,
    FLUX1_VAE,
    WAN21_TRANSFORMER,
    WAN21_VAE,
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("diffusers") is None, reason="real engines unavailable: no diffusers"
)


@pytest.mark.parametrize(
    ("cls", "config", "parameters"),
    [
        ("WanTransformer3DModel", WAN21_TRANSFORMER, 1_418_996_800),
        ("AutoencoderKLWan", WAN21_VAE, 126_892_531),
        ("FluxTransformer2DModel", FLUX1_TRANSFORMER, 11_901_408_320),
        ("AutoencoderKL", FLUX1_VAE, 83_819_683),
    ],
)
def test_the_published_configs_have_the_published_parameter_counts(cls, config, parameters):
    import diffusers
    import torch

    with torch.device("meta"):
        module = getattr(diffusers, cls)(**config)
    assert sum(p.numel() for p in module.parameters()) == parameters
