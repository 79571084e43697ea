"""Moshi at its published size, with random weights built on a device (no
download, nothing written to disk).

Owns: the published checkpoint's ``config.json`` numbers (Kyutai's
``moshiko``, as transformers' ``kmhf/hf-moshiko`` carries them:
``REAL_TEMPORAL``, ``REAL_DEPTH``, ``REAL_MIMI``: a 7B temporal transformer
of 32 layers at width 4096, a depth decoder of 6 layers at width 1024 with
weights per codebook, 8 codebooks of Mimi's 32), ``real_moshi_config`` (a
``MoshiConfig`` with every one of them set) and ``random_moshi``
(transformers' ``MoshiForConditionalGeneration`` for a config, initialised
on the device from one seed).  ``omnix bench duplex --sizes real``
measures it; ``--sizes tiny`` builds the tiny checkpoint's config
(``moshi.moshi_config``) the same way.

Does not own the tiny checkpoint on disk (``moshi.py``) nor running the
model (``omnix.engines.duplex_model``).

Every value is written out rather than taken from transformers' defaults
(which are moshiko's today, but a default is no promise).  Mimi's
codebooks are buffers transformers leaves at zero (every frame would take
code 0): they are filled too.
"""

from __future__ import annotations

from typing import Any

from omnix.models.moshi import CODEBOOK_SIZE, CONTEXT, NUM_CODEBOOKS, SAMPLE_RATE
from omnix.models.seeds import fill_random

REAL_TEXT_VOCAB = 32000

#: The temporal transformer (``decoder``): ~6.8B of the model's ~7.8B.
REAL_TEMPORAL: dict[str, Any] = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "ffn_dim": 22528,  # fc1's width; the gated MLP's inner width is half of it
    "rms_norm_eps": 1e-8,
}

#: The depth decoder: one set of weights per codebook.
REAL_DEPTH: dict[str, Any] = {
    "hidden_size": 1024,
    "num_hidden_layers": 6,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 64,
    "ffn_dim": 5632,
    "rms_norm_eps": 1e-8,
}

#: Mimi (``kyutai/mimi``).
REAL_MIMI: dict[str, Any] = {
    "model_type": "mimi",
    "sampling_rate": SAMPLE_RATE,
    "audio_channels": 1,
    "hidden_size": 512,
    "num_filters": 64,
    "num_residual_layers": 1,
    "upsampling_ratios": [8, 6, 5, 4],
    "kernel_size": 7,
    "last_kernel_size": 3,
    "residual_kernel_size": 3,
    "dilation_growth_rate": 2,
    "use_causal_conv": True,
    "pad_mode": "constant",
    "compress": 2,
    "trim_right_ratio": 1.0,
    "codebook_size": CODEBOOK_SIZE,
    "codebook_dim": 256,
    "num_quantizers": 32,
    "vector_quantization_hidden_dimension": 256,
    "num_semantic_quantizers": 1,
    "upsample_groups": 512,
    "num_hidden_layers": 8,
    "intermediate_size": 2048,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "hidden_act": "gelu",
    "max_position_embeddings": 8000,
    "norm_eps": 1e-5,
    "use_cache": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "sliding_window": 250,
    "attention_dropout": 0.0,
    "layer_scale_initial_scale": 0.01,
    "attention_bias": False,
}


def real_moshi_config() -> Any:
    """moshiko's ``MoshiConfig``: 7B temporal transformer, depth decoder,
    Mimi, 8 codebooks, a context of 3000 frames."""
    from transformers import MoshiConfig

    t, d = REAL_TEMPORAL, REAL_DEPTH
    return MoshiConfig(
        vocab_size=REAL_TEXT_VOCAB,
        **t,
        max_position_embeddings=CONTEXT,
        sliding_window=CONTEXT,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        num_codebooks=NUM_CODEBOOKS,
        audio_vocab_size=CODEBOOK_SIZE,
        tie_word_embeddings=False,
        audio_encoder_config=dict(REAL_MIMI),
        depth_decoder_config={
            **d,
            "max_position_embeddings": NUM_CODEBOOKS + 1,
            "sliding_window": NUM_CODEBOOKS,
        },
        architectures=["MoshiForConditionalGeneration"],
    )


def random_moshi(config: Any, device: str, dtype: str = "bfloat16", seed: int = 0) -> Any:
    """``MoshiForConditionalGeneration(config)`` in ``dtype`` on ``device``,
    in eval mode: norms one, biases zero, matrices N(0, 0.02), embeddings
    N(0, 1), Mimi's codebooks N(0, 1), from one generator on the device."""
    import torch
    from transformers import MoshiForConditionalGeneration

    # Built on the device itself: its init is fast there (seconds for 7B on
    # a GPU), and the rotary frequencies (buffers) come out right.
    with torch.device(device):
        # Any: mypy misreads the decorated classmethod's signature.
        moshi: Any = MoshiForConditionalGeneration
        model = moshi._from_config(config, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    fill_random(model, seed, lambda name: 1.0 if "embed_tokens" in name else 0.02)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("embed_sum"):
                b.normal_(0.0, 1.0, generator=gen)
            elif name.endswith("cluster_usage"):
                b.fill_(1.0)
    for module in model.modules():  # the codebooks' cached ``embed``, if read already
        if hasattr(module, "_embed"):
            module._embed = None
    return model.eval()
