"""Wan 2.1 T2V 1.3B and FLUX.1-dev as diffusers folders at their published
sizes, with random weights built on a device (no download).

Owns: the published configs' numbers (``WAN21_*``: Wan2.1-T2V-1.3B's
transformer, its VAE, which is ``AutoencoderKLWan``'s defaults, and its
UniPC scheduler at the 480p shift; ``FLUX1_*``: FLUX.1-dev's transformer,
VAE and scheduler), a ``tiny`` set of the same classes at test sizes, and
``published_folder``: the folder built once into a cache directory (a
temporary sibling renamed into place, the marker written last) and
reused after.  The GPU diffusion bench (``omnix bench diffusion --device
cuda --sizes real``) serves these folders on ``DiffusersEngine``.

Not the published text encoders: UMT5-XXL (Wan) and CLIP-L with T5-XXL
(Flux) are 5 to 10 GB of weights that run once a request, before the
first step.  Each is one layer at the published width (4096; CLIP's 768),
so the denoiser reads text of the published shape (512 tokens), over
omnix's byte-level tokenizer.  Weights: PyTorch's default initialisation
of each module from one seed per component, made on the device in the
device's dtype (seconds for 12 B parameters on a GPU, where a CPU would
take minutes).

Does not own the tiny models of the built-in pipelines (``build.py``) nor
loading or running a folder (``omnix.engines``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, Literal

from omnix.models.build import byte_tokenizer, quiet_hf
from omnix.models.paths import built_once, stay_offline
from omnix.models.seeds import derived_seed, made_on, pad64

Published = Literal["wan2.1-t2v-1.3b", "flux.1-dev"]
PUBLISHED: Final[tuple[Published, ...]] = ("wan2.1-t2v-1.3b", "flux.1-dev")
Sizes = Literal["real", "tiny"]

# -- Wan 2.1 T2V 1.3B -----------------------------------------------------------------
#: Wan2.1-T2V-1.3B-Diffusers' ``transformer/config.json``
WAN21_TRANSFORMER: Final[dict[str, Any]] = {
    "patch_size": [1, 2, 2],
    "num_attention_heads": 12,
    "attention_head_dim": 128,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 8960,
    "num_layers": 30,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "rope_max_seq_len": 1024,
}
#: Wan 2.1's VAE is ``AutoencoderKLWan``'s defaults (z_dim 16, base_dim 96)
WAN21_VAE: Final[dict[str, Any]] = {}
#: UniPC on flow sigmas, shift 3.0: Wan 2.1's scheduler for 480p
WAN21_SCHEDULER: Final[dict[str, Any]] = {
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "flow_shift": 3.0,
    "num_train_timesteps": 1000,
}
#: UMT5-XXL's width, one of its 24 layers
WAN21_TEXT: Final[dict[str, Any]] = {
    "d_model": 4096,
    "d_kv": 64,
    "num_heads": 64,
    "d_ff": 10240,
    "num_layers": 1,
    "feed_forward_proj": "gated-gelu",
}
#: the prompt tokens Wan's transformer attends to
WAN21_TEXT_LEN = 512

# -- FLUX.1-dev -------------------------------------------------------------------------
#: FLUX.1-dev's ``transformer/config.json`` (12 B parameters)
FLUX1_TRANSFORMER: Final[dict[str, Any]] = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": True,
    "axes_dims_rope": [16, 56, 56],
}
#: FLUX.1-dev's ``vae/config.json``
FLUX1_VAE: Final[dict[str, Any]] = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [128, 256, 512, 512],
    "layers_per_block": 2,
    "latent_channels": 16,
    "norm_num_groups": 32,
    "sample_size": 1024,
    "scaling_factor": 0.3611,
    "shift_factor": 0.1159,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
}
#: FLUX.1-dev's ``scheduler/scheduler_config.json``
FLUX1_SCHEDULER: Final[dict[str, Any]] = {
    "shift": 3.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "base_image_seq_len": 256,
    "max_image_seq_len": 4096,
}
#: CLIP-L's width (its pooled output is the transformer's pooled input), one layer
FLUX1_CLIP: Final[dict[str, Any]] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_attention_heads": 12,
    "num_hidden_layers": 1,
    "projection_dim": 768,
    "hidden_act": "quick_gelu",
}
#: T5-XXL's width, one of its 24 layers
FLUX1_T5: Final[dict[str, Any]] = {**WAN21_TEXT}
FLUX1_T5_LEN = 512
CLIP_LEN = 77

# -- the same classes at test sizes -----------------------------------------------------
_TINY: Final[dict[str, dict[str, Any]]] = {
    "wan_transformer": {
        **WAN21_TRANSFORMER,
        "num_attention_heads": 2,
        "attention_head_dim": 12,
        "text_dim": 32,
        "ffn_dim": 32,
        "num_layers": 2,
        "rope_max_seq_len": 32,
    },
    # diffusers' own Wan 2.1 test VAE
    "wan_vae": {
        "base_dim": 3,
        "z_dim": 16,
        "dim_mult": [1, 1, 1, 1],
        "num_res_blocks": 1,
        "temperal_downsample": [False, True, True],
    },
    "text": {
        "d_model": 32,
        "d_kv": 16,
        "num_heads": 2,
        "d_ff": 64,
        "num_layers": 1,
        "feed_forward_proj": "gated-gelu",
    },
    "flux_transformer": {
        **FLUX1_TRANSFORMER,
        "in_channels": 16,
        "num_layers": 1,
        "num_single_layers": 1,
        "attention_head_dim": 32,
        "num_attention_heads": 2,
        "joint_attention_dim": 32,
        "pooled_projection_dim": 64,
        "axes_dims_rope": [8, 12, 12],
    },
    "flux_vae": {
        **FLUX1_VAE,
        "down_block_types": ["DownEncoderBlock2D"] * 3,
        "up_block_types": ["UpDecoderBlock2D"] * 3,
        "block_out_channels": [16, 32, 32],
        "layers_per_block": 1,
        "latent_channels": 4,
        "norm_num_groups": 8,
        "sample_size": 64,
    },
    "clip": {
        **FLUX1_CLIP,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "projection_dim": 64,
    },
}


def published_folder(
    name: Published, sizes: Sizes, root: Path, device: str, dtype: str, seed: int = 0
) -> tuple[Path, dict[str, Any]]:
    """``name``'s folder under ``root`` (built there first if missing, on
    ``device`` in ``dtype``) and what its marker says (``parameters``: the
    transformer's).  Weights made on a CUDA device differ from a CPU's of
    the same seed, so the folder's name says which made them."""
    kind = "cuda" if device.startswith("cuda") else device
    folder = Path(root) / f"{name}-{sizes}-{kind}-{dtype}-seed{seed}"

    def build(tmp: Path) -> dict[str, Any]:
        make = _build_wan if name == "wan2.1-t2v-1.3b" else _build_flux
        with made_on(device, dtype):
            made = make(tmp, sizes, seed)
        return {"name": name, "sizes": sizes, "seed": seed, **made}

    return built_once(folder, build)


def _seeded(seed: int, model: str, component: str) -> None:
    import torch

    torch.manual_seed(derived_seed(seed, model, component))


def _t5(cls: Any, config_cls: Any, sizes: Sizes, vocab: int, pad: int) -> Any:
    text = WAN21_TEXT if sizes == "real" else _TINY["text"]
    return cls(config_cls(vocab_size=vocab, pad_token_id=pad, decoder_start_token_id=pad, **text))


def _parameters(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())


def _save(pipe: Any, out: Path) -> None:
    stay_offline()
    with quiet_hf():
        pipe.save_pretrained(str(out))


def _build_wan(out: Path, sizes: Sizes, seed: int) -> dict[str, Any]:
    from diffusers import (
        AutoencoderKLWan,
        UniPCMultistepScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import UMT5Config, UMT5EncoderModel

    real = sizes == "real"
    tokenizer, n_text = byte_tokenizer(WAN21_TEXT_LEN)
    _seeded(seed, "wan", "transformer")
    transformer = WanTransformer3DModel(**(WAN21_TRANSFORMER if real else _TINY["wan_transformer"]))
    _seeded(seed, "wan", "vae")
    vae = AutoencoderKLWan(**(WAN21_VAE if real else _TINY["wan_vae"]))
    _seeded(seed, "wan", "text_encoder")
    text = _t5(UMT5EncoderModel, UMT5Config, sizes, pad64(n_text), tokenizer.pad_token_id)
    pipe = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text,
        vae=vae,
        scheduler=UniPCMultistepScheduler(**WAN21_SCHEDULER),
        transformer=transformer,
    )
    _save(pipe, out)
    return {"parameters": _parameters(transformer), "pipeline": "WanPipeline"}


def _build_flux(out: Path, sizes: Sizes, seed: int) -> dict[str, Any]:
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxPipeline,
        FluxTransformer2DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    real = sizes == "real"
    clip_tokenizer, n_text = byte_tokenizer(CLIP_LEN)
    t5_tokenizer, _ = byte_tokenizer(FLUX1_T5_LEN)
    vocab, pad, eos = pad64(n_text), clip_tokenizer.pad_token_id, clip_tokenizer.eos_token_id
    tiny_flux = {**_TINY["flux_transformer"], "joint_attention_dim": _TINY["text"]["d_model"]}
    _seeded(seed, "flux", "transformer")
    transformer = FluxTransformer2DModel(**(FLUX1_TRANSFORMER if real else tiny_flux))
    _seeded(seed, "flux", "vae")
    vae = AutoencoderKL(**(FLUX1_VAE if real else _TINY["flux_vae"]))
    _seeded(seed, "flux", "text_encoder")
    clip = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=vocab,
            max_position_embeddings=CLIP_LEN,
            pad_token_id=pad,
            bos_token_id=pad,
            eos_token_id=eos,
            **(FLUX1_CLIP if real else _TINY["clip"]),
        )
    )
    _seeded(seed, "flux", "text_encoder_2")
    t5 = _t5(T5EncoderModel, T5Config, sizes, vocab, pad)
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**FLUX1_SCHEDULER),
        vae=vae,
        text_encoder=clip,
        tokenizer=clip_tokenizer,
        text_encoder_2=t5,
        tokenizer_2=t5_tokenizer,
        transformer=transformer,
    )
    _save(pipe, out)
    return {"parameters": _parameters(transformer), "pipeline": "FluxPipeline"}
