"""Qwen3-Omni-30B-A3B's speech stages at their published sizes, with random
weights built in the process (no download, nothing written to disk).

Owns: the published checkpoint's ``config.json`` numbers for the talker
(backbone, code predictor), Code2Wav and the thinker values they read
(``REAL_*``, the one place omnix keeps them), ``real_speech_config`` (a
``Qwen3OmniMoeConfig`` with those sizes) and ``random_speech_modules``
(transformers' own talker, the thinker's token embedding and Code2Wav at
those sizes, initialised on a device from one seed).  The GPU bench
(``omnix bench speech --device cuda --sizes real``) measures them.

Does not own the tiny checkpoint (``qwen3_omni_speech.py``, whose codec
layout, speakers and code groups are the published ones and shared from
there), nor running the modules (``omnix.engines``).

transformers' config defaults are not the published model's (32 code
groups, top-8 routing, no shared expert, other codec ids): every value
that matters is set here.  Built from a config, transformers leaves the
talker's router at zero and its experts uninitialised (uniform routing,
or garbage): every tensor is filled here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omnix.models.qwen3_omni_speech import (
    CODEBOOK_SIZE,
    NUM_CODE_GROUPS,
    TALKER_VOCAB,
    codec_layout,
)
from omnix.models.seeds import fill_random

# -- the thinker's side the talker reads ---------------------------------------------
REAL_THINKER_HIDDEN = 2048
REAL_THINKER_VOCAB = 151936
REAL_ACCEPT_HIDDEN_LAYER = 24
#: Qwen's special token ids (the published tokenizer's).
REAL_IDS = {
    "im_start": 151644,
    "im_end": 151645,
    "endoftext": 151643,
    "user": 872,
    "assistant": 77091,
    "system": 8948,
    "newline": 198,
    "audio": 151675,
    "image": 151655,
    "video": 151656,
    "audio_start": 151669,
    "vision_start": 151652,
    "tts_pad": 151671,
    "tts_bos": 151672,
    "tts_eos": 151673,
}

# -- the talker ----------------------------------------------------------------------
REAL_TALKER = {
    "hidden_size": 1024,
    "intermediate_size": 2048,  # the text / hidden projections' inner width
    "num_hidden_layers": 20,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 384,
    "shared_expert_intermediate_size": 768,
    "mrope_section": (24, 20, 20),
    "max_position_embeddings": 65536,
}
REAL_PREDICTOR = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 5,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
}
REAL_CODE2WAV = {
    "hidden_size": 1024,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "intermediate_size": 3072,
    "decoder_dim": 1536,
}

_ROPE_THETA = 1_000_000.0


def real_speech_config() -> Any:
    """A ``Qwen3OmniMoeConfig`` whose talker and Code2Wav have the published
    sizes (the thinker's encoders and layers are left at transformers'
    defaults: nothing here builds or runs them)."""
    from transformers import Qwen3OmniMoeConfig

    ids = REAL_IDS
    mm = {
        "audio_token_id": ids["audio"],
        "image_token_id": ids["image"],
        "video_token_id": ids["video"],
        "vision_start_token_id": ids["vision_start"],
        "audio_start_token_id": ids["audio_start"],
    }
    t = REAL_TALKER
    text = {
        "vocab_size": TALKER_VOCAB,
        **{k: v for k, v in t.items() if k != "mrope_section"},
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": _ROPE_THETA,
            "mrope_section": list(t["mrope_section"]),  # type: ignore[call-overload]
            "interleaved": True,
            "mrope_interleaved": True,
        },
    }
    predictor = {
        "vocab_size": CODEBOOK_SIZE,
        **REAL_PREDICTOR,
        "max_position_embeddings": 64,
        "num_code_groups": NUM_CODE_GROUPS,
        "rope_parameters": {"rope_type": "default", "rope_theta": _ROPE_THETA},
    }
    talker = {
        "text_config": text,
        "code_predictor_config": predictor,
        "thinker_hidden_size": REAL_THINKER_HIDDEN,
        "accept_hidden_layer": REAL_ACCEPT_HIDDEN_LAYER,
        **codec_layout(),
        **mm,
    }
    code2wav = {
        "codebook_size": CODEBOOK_SIZE,
        **REAL_CODE2WAV,
        "num_quantizers": NUM_CODE_GROUPS,
        "sliding_window": 72,
        "max_position_embeddings": 8000,
    }
    thinker = {
        "text_config": {
            "vocab_size": REAL_THINKER_VOCAB,
            "hidden_size": REAL_THINKER_HIDDEN,
        },
        **mm,
        "user_token_id": ids["user"],
    }
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=code2wav,
        enable_audio_output=True,
        im_start_token_id=ids["im_start"],
        im_end_token_id=ids["im_end"],
        tts_pad_token_id=ids["tts_pad"],
        tts_bos_token_id=ids["tts_bos"],
        tts_eos_token_id=ids["tts_eos"],
        system_token_id=ids["system"],
        user_token_id=ids["user"],
        assistant_token_id=ids["assistant"],
    )


@dataclass
class SpeechModules:
    """transformers' speech modules at one size, on one device."""

    config: Any
    talker: Any  # Qwen3OmniMoeTalkerForConditionalGeneration
    thinker_embed: Any  # torch.nn.Embedding over the thinker's vocabulary
    code2wav: Any  # Qwen3OmniMoeCode2Wav (float32, as omnix's engine runs it)
    eos: tuple[int, ...]

    def parameters(self) -> int:
        mods = (self.talker, self.thinker_embed, self.code2wav)
        return sum(p.numel() for m in mods for p in m.parameters())


def random_speech_modules(
    config: Any, device: str, dtype: str = "bfloat16", seed: int = 0
) -> SpeechModules:
    """The talker (with its code predictor), the thinker's embedding and
    Code2Wav for ``config``, random weights from ``seed``, on ``device``."""
    import torch
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeCode2Wav,
        Qwen3OmniMoeTalkerForConditionalGeneration,
    )

    torch_dtype = getattr(torch, dtype)
    # Built on the device itself: its init is fast there, and the rotary
    # frequencies (buffers, not parameters) come out right.
    with torch.device(device):
        talker = Qwen3OmniMoeTalkerForConditionalGeneration._from_config(
            config.talker_config, dtype=torch_dtype, attn_implementation="sdpa"
        )
        code2wav = Qwen3OmniMoeCode2Wav._from_config(config.code2wav_config, dtype=torch.float32)
    fill_random(talker, seed)
    fill_random(code2wav, seed + 1)
    talker.eval()
    code2wav.eval()
    if not hasattr(talker.config, "audio_config"):
        talker.config.audio_config = config.thinker_config.audio_config
    vocab = config.thinker_config.text_config.vocab_size
    hidden = config.thinker_config.text_config.hidden_size
    embed = torch.nn.Embedding(vocab, hidden, device=device, dtype=torch_dtype)
    fill_random(embed, seed + 2)
    embed.requires_grad_(False)
    return SpeechModules(config, talker, embed, code2wav, (REAL_IDS["im_end"],))
