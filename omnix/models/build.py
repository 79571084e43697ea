"""Builders of the tiny random-weight models the built-in pipelines use.

Owns: one builder per tiny model (``thinker``, ``talker``, ``code2wav``,
``image``, ``video``; the Qwen3-Omni, Qwen3-TTS and Moshi ones in their own
modules), the talker's vocabulary layout, atomic builds into the model
cache and ``ensure_models`` (build only what is missing).  Does not own
where the cache is or how names resolve (``paths.py``), the tokenizer
(``tokenizer.py``), the codec module (``omnix.models.codec``) or any
loading for inference (``omnix.engines``).

Determinism: every random tensor comes from a torch generator seeded from
``(seed, model, tensor or component name)``, configs and JSON are written in
a fixed order, and the tokenizer trains on a fixed corpus.  With the same
seed and the same library versions (torch, transformers, diffusers,
tokenizers) the files are byte-identical; ``folder_digest`` checks it.

Why Qwen2 and not Llama: the tiny models stand in for Qwen's (Qwen3-Omni's
thinker and talker).  transformers 5.x rebuilds a ``Qwen2Tokenizer`` for ``model_type: qwen2`` whatever
``tokenizer_class`` says, so the tokenizer is trained with Qwen2's exact
pipeline and saved natively (see ``tokenizer.py``); ids then agree across
every loader, vLLM's included.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from omnix.models.moshi import build_moshi, build_personaplex
from omnix.models.paths import (
    MARKER,
    TINY_MODELS,
    ModelInfo,
    ModelPaths,
    default_model_dir,
    is_built,
    read_info,
    stay_offline,
)
from omnix.models.qwen3_omni import build_omni_thinker, build_omni_tokenizer
from omnix.models.qwen3_omni_speech import build_omni
from omnix.models.qwen3_tts import (
    build_qwen3_tts_base,
    build_qwen3_tts_custom_voice,
    build_qwen3_tts_voice_design,
)
from omnix.models.seeds import derived_seed, pad64

if TYPE_CHECKING:  # imported where used: most commands never build a model
    import torch
    from transformers import Qwen2Config

# -- sizes ------------------------------------------------------------------

# vLLM's CPU attention takes head sizes 32, 64, 80, ...: 128 / 2 heads = 64.
LM_HIDDEN = 128
LM_LAYERS = 2
LM_HEADS = 2
LM_INTERMEDIATE = 384
LM_MAX_POSITIONS = 2048

# Talker vocabulary layout (ids):
#   [0, CODEC_SIZE)              codec codes (the codebook of a code is its
#                                position in the frame-major stream mod K)
#   CODEC_EOS                    end of audio (stop token)
#   CODEC_BOS                    start of audio (ends every prompt)
#   [TEXT_OFFSET, +text_vocab)   the thinker's text ids, shifted
# Codes first means a generated id *is* the code: no mapping on output.
CODEC_SIZE = 1024
NUM_CODEBOOKS = 2
CODEC_EOS = CODEC_SIZE
CODEC_BOS = CODEC_SIZE + 1
TEXT_OFFSET = 1088  # next multiple of 64 after the codec ids


# -- language models (thinker, talker) ----------------------------------------


def _qwen2_config(vocab_size: int, eos: int, bos: int | None, pad: int | None) -> Qwen2Config:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=LM_HIDDEN,
        intermediate_size=LM_INTERMEDIATE,
        num_hidden_layers=LM_LAYERS,
        num_attention_heads=LM_HEADS,
        num_key_value_heads=LM_HEADS,
        max_position_embeddings=LM_MAX_POSITIONS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        dtype="float32",
        use_sliding_window=False,
    )


def _lm_weights(
    config: Qwen2Config, seed: int, model: str, std: float = 0.05, head_std: float = 0.15
) -> dict[str, torch.Tensor]:
    """Random weights for a Qwen2 causal LM, one generator per tensor name:
    norms are ones, biases zeros, the output head N(0, head_std), everything
    else N(0, std).

    The head is untied and wider than the rest on purpose: with tied
    embeddings a random model's top logit is almost always the current token
    (its embedding dominates the residual stream), so it repeats one token
    forever; an independent head with logits of std ~1.7 samples varied
    tokens that depend on the model and the prompt, not only on the seed."""
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in Qwen2ForCausalLM(config).state_dict().items()}
    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape)
        elif name.endswith(".bias"):
            out[name] = torch.zeros(shape)
        else:
            gen = torch.Generator().manual_seed(derived_seed(seed, model, name))
            scale = head_std if name == "lm_head.weight" else std
            out[name] = torch.randn(shape, generator=gen) * scale
    return out


def _write_lm(
    out: Path, config: Qwen2Config, weights: dict[str, torch.Tensor], generation: dict[str, object]
) -> None:
    from safetensors.torch import save_file

    config.save_pretrained(str(out))
    (out / "generation_config.json").write_text(
        json.dumps(generation, indent=2, sort_keys=True) + "\n"
    )
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})


def build_thinker(out: Path, seed: int) -> ModelInfo:
    """Tiny Qwen2 text LM + its native Qwen2 tokenizer (ChatML template)."""
    from omnix.models.tokenizer import ENDOFTEXT, IM_END, build_tokenizer

    n_text = build_tokenizer(out)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    eos, pad = tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(ENDOFTEXT)
    assert isinstance(eos, int) and isinstance(pad, int)  # one token in, one id out
    config = _qwen2_config(pad64(n_text), eos=eos, bos=None, pad=pad)
    _write_lm(
        out,
        config,
        _lm_weights(config, seed, "thinker"),
        {"eos_token_id": [eos, pad], "pad_token_id": pad},
    )
    return ModelInfo(name="thinker", seed=seed, layout={"text_vocab": n_text})


def build_talker(out: Path, seed: int) -> ModelInfo:
    """Tiny Qwen2 AR LM over [codec codes | eos | bos | thinker text ids].

    Its prompt is thinker text ids shifted by ``TEXT_OFFSET`` then
    ``CODEC_BOS``; it generates codes (sampling restricted to the codec ids
    and ``CODEC_EOS``).  vLLM runs it without a tokenizer; the thinker's
    tokenizer is kept in ``text_tokenizer/`` for input pieces that carry text
    but no ids.

    Its text range covers every id the Qwen3-Omni thinker's head can emit
    (``omni_thinker``: the trained vocabulary, the multimodal special tokens
    and the padding rows), so either thinker feeds it: the plain thinker's
    ids are the same trained vocabulary.
    """
    n_text = build_omni_tokenizer(
        out / "text_tokenizer", model_max_length=LM_MAX_POSITIONS
    ).vocab_size
    vocab = TEXT_OFFSET + n_text
    config = _qwen2_config(vocab, eos=CODEC_EOS, bos=CODEC_BOS, pad=CODEC_EOS)
    _write_lm(
        out,
        config,
        _lm_weights(config, seed, "talker"),
        {"eos_token_id": CODEC_EOS, "bos_token_id": CODEC_BOS, "pad_token_id": CODEC_EOS},
    )
    layout = {
        "text_offset": TEXT_OFFSET,
        "text_vocab": n_text,
        "codec_offset": 0,
        "codec_size": CODEC_SIZE,
        "codec_eos": CODEC_EOS,
        "codec_bos": CODEC_BOS,
        "num_codebooks": NUM_CODEBOOKS,
    }
    return ModelInfo(name="talker", seed=seed, layout=layout)


# -- code2wav -----------------------------------------------------------------


def build_code2wav(out: Path, seed: int) -> ModelInfo:
    """The codec decoder with random weights (see ``codec.py``)."""
    import torch

    from omnix.models.codec import CodecConfig, CodecDecoder, save_codec

    config = CodecConfig(num_codebooks=NUM_CODEBOOKS, codebook_size=CODEC_SIZE)
    torch.manual_seed(derived_seed(seed, "code2wav"))
    decoder = CodecDecoder(config)
    with torch.no_grad():
        # Default init leaves the output around -40 dBFS; lift it to a level
        # one can hear (tanh still bounds it by out_scale).
        decoder.post.conv.weight.mul_(8.0)
    save_codec(decoder, out)
    return ModelInfo(
        name="code2wav",
        seed=seed,
        layout={
            "num_codebooks": config.num_codebooks,
            "codebook_size": config.codebook_size,
            "hop": config.hop,
            "sample_rate": config.sample_rate,
        },
    )


# -- image ----------------------------------------------------------------------


def build_image(out: Path, seed: int) -> ModelInfo:
    """A tiny text-conditioned Flux-style pipeline (``FluxPipeline``: CLIP +
    T5 text encoders, a 1+1-layer Flux transformer, a 3-level VAE, flow-match
    Euler scheduler) for 64x64 images; the byte-level tokenizer fills both
    tokenizer slots."""
    import torch
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxPipeline,
        FluxTransformer2DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    tokenizer, n_text = byte_tokenizer(77)
    vocab = pad64(n_text)

    def seeded(component: str) -> None:
        torch.manual_seed(derived_seed(seed, "image", component))

    seeded("text_encoder")
    clip = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=77,
            projection_dim=64,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    )
    seeded("text_encoder_2")
    t5 = T5EncoderModel(
        T5Config(
            vocab_size=vocab,
            d_model=64,
            d_kv=32,
            d_ff=128,
            num_layers=1,
            num_heads=2,
            relative_attention_num_buckets=8,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    seeded("transformer")
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,  # 4 latent channels packed 2x2
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=64,
        pooled_projection_dim=64,
        guidance_embeds=False,
        axes_dims_rope=(8, 12, 12),
    )
    seeded("vae")
    vae = _flux_vae(AutoencoderKL)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0)
    pipe = FluxPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=clip,
        tokenizer=tokenizer,
        text_encoder_2=t5,
        tokenizer_2=tokenizer,
        transformer=transformer,
    )
    # mypy resolves diffusers' FluxPipeline to the placeholder diffusers
    # exports when torch is missing, which has no save_pretrained.
    pipe.save_pretrained(str(out))  # type: ignore[attr-defined]
    return ModelInfo(name="image", seed=seed, layout={"default_size": 64, "text_vocab": n_text})


def _flux_vae(cls: Any) -> Any:
    """A 3-level VAE with 4 latent channels (Flux's has 16) for 64x64 images."""
    return cls(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(16, 32, 32),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=64,
        scaling_factor=1.0,
        shift_factor=0.0,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


# -- video ----------------------------------------------------------------------


def _wan22_vae(cls: Any) -> Any:
    """Wan 2.2 TI2V's VAE at the size of diffusers' tests: 48 latent
    channels, 2x2 patching, 16x spatial and 4x temporal compression."""
    return cls(
        base_dim=3,
        z_dim=48,
        in_channels=12,
        out_channels=12,
        is_residual=True,
        patch_size=2,
        latents_mean=[0.0] * 48,
        latents_std=[1.0] * 48,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        scale_factor_spatial=16,
        scale_factor_temporal=4,
        temperal_downsample=[False, True, True],
    )


def _wan22_transformer(cls: Any) -> Any:
    """A 2-layer Wan transformer over those latents (diffusers' test size)."""
    return cls(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=48,
        out_channels=48,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )


def build_video(out: Path, seed: int) -> ModelInfo:
    """A tiny Wan 2.2 text/image-to-video pipeline (``WanPipeline`` with
    ``expand_timesteps``, as Wan2.2-TI2V-5B: a 48-channel VAE with 2x2
    patching, 16x spatial and 4x temporal compression; a 2-layer Wan
    transformer; a 1-layer T5 encoder), at the sizes of diffusers' own Wan
    2.2 TI2V tests: 32x32 videos of 4k+1 frames.  The same components run
    ``WanImageToVideoPipeline`` (the first frame from an image).  The
    byte-level tokenizer stands in for T5's."""
    import torch
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import T5Config, T5EncoderModel

    tokenizer, n_text = byte_tokenizer(64)

    def seeded(component: str) -> None:
        torch.manual_seed(derived_seed(seed, "video", component))

    seeded("vae")
    vae = _wan22_vae(AutoencoderKLWan)
    seeded("text_encoder")
    text_encoder = T5EncoderModel(
        T5Config(
            vocab_size=pad64(n_text),
            d_model=32,
            d_kv=16,
            d_ff=64,
            num_layers=1,
            num_heads=2,
            relative_attention_num_buckets=8,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    seeded("transformer")
    transformer = _wan22_transformer(WanTransformer3DModel)
    pipe = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
        transformer=transformer,
        expand_timesteps=True,
    )
    pipe.save_pretrained(str(out))  # type: ignore[attr-defined]
    return ModelInfo(name="video", seed=seed, layout={"default_size": 32, "text_vocab": n_text})


BUILDERS: dict[str, Callable[[Path, int], ModelInfo]] = {
    "thinker": build_thinker,
    "talker": build_talker,
    "code2wav": build_code2wav,
    "image": build_image,
    "omni_thinker": build_omni_thinker,
    "omni": build_omni,
    "video": build_video,
    "qwen3_tts_custom_voice": build_qwen3_tts_custom_voice,
    "qwen3_tts_voice_design": build_qwen3_tts_voice_design,
    "qwen3_tts_base": build_qwen3_tts_base,
    "moshi": build_moshi,
    "personaplex": build_personaplex,
}


# -- cache management -----------------------------------------------------------


@contextlib.contextmanager
def quiet_hf() -> Iterator[None]:
    """transformers and diffusers draw a progress bar per saved file; the
    CLI draws one per model instead."""
    from diffusers.utils import logging as dlog
    from transformers.utils import logging as tlog

    tlog.disable_progress_bar()
    dlog.disable_progress_bar()
    try:
        yield
    finally:
        tlog.enable_progress_bar()
        dlog.enable_progress_bar()


def build_model(name: str, model_dir: Path, seed: int = 0) -> Path:
    """Build ``name`` into ``model_dir/name``, replacing what is there.

    Builds in a temporary sibling folder and renames it into place, so a
    crash or a concurrent reader never sees half a model; the marker
    ``omnix.json`` is the last file written."""
    if name not in BUILDERS:
        raise ValueError(f"unknown tiny model {name!r}; known: {', '.join(TINY_MODELS)}")
    stay_offline()
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    final = model_dir / name
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=model_dir))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any other
    try:
        with quiet_hf():
            info = BUILDERS[name](tmp, seed)
        (tmp / MARKER).write_bytes(msgspec.json.format(msgspec.json.encode(info)) + b"\n")
        for path in tmp.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        if final.exists():
            old = model_dir / f".{name}.old.{os.getpid()}"
            final.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            tmp.rename(final)
        except OSError:
            # Another process finished the same build first: keep theirs.
            if not is_built(final, name):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def missing_models(
    model_dir: Path | None = None, seed: int | None = None, names: Iterable[str] = TINY_MODELS
) -> list[str]:
    """Names not (completely) built in ``model_dir``; with ``seed``, also
    those built from another seed."""
    root = Path(model_dir) if model_dir is not None else default_model_dir()
    out = []
    for name in names:
        info = read_info(root / name)
        if not is_built(root / name, name) or (seed is not None and info and info.seed != seed):
            out.append(name)
    return out


def ensure_models(
    model_dir: Path | None = None,
    seed: int = 0,
    names: Iterable[str] = TINY_MODELS,
    force: bool = False,
    progress: bool = False,
) -> ModelPaths:
    """Build whichever tiny models are missing from ``model_dir`` (default
    ``default_model_dir()``) and return their paths.  Models already there
    are kept whatever seed built them, unless ``force``."""
    root = Path(model_dir) if model_dir is not None else default_model_dir()
    names = list(names)
    todo = names if force else missing_models(root, None, names)
    if todo:
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(todo), desc="omnix models", unit="model")
        for name in todo:
            if bar is not None:
                bar.set_postfix_str(name)
            build_model(name, root, seed)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
    return ModelPaths.under(root)


def byte_tokenizer(max_length: int) -> tuple[Any, int]:
    """omnix's byte-level tokenizer as a diffusers pipeline's text encoders
    take it (standing in for CLIP's and T5's), and its vocabulary size."""
    from transformers import PreTrainedTokenizerFast

    from omnix.models.tokenizer import ENDOFTEXT, IM_END, build_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        n_text = build_tokenizer(Path(tmp))
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_file=str(Path(tmp) / "tokenizer.json"),
            pad_token=ENDOFTEXT,
            eos_token=IM_END,
            model_max_length=max_length,
        )
    return tokenizer, n_text
