"""Builder of the tiny random-weight Qwen3-TTS CustomVoice, VoiceDesign and
Base checkpoints.

Owns: ``build_qwen3_tts_custom_voice``, ``build_qwen3_tts_voice_design`` and
``build_qwen3_tts_base`` (the ``qwen3_tts_custom_voice``,
``qwen3_tts_voice_design`` and ``qwen3_tts_base`` tiny models of ``omnix
models init``), their tiny sizes and their folders, laid out as the
published ``Qwen3-TTS-12Hz-*-CustomVoice`` / ``-VoiceDesign`` / ``-Base``
are: ``config.json``
(``model_type: qwen3_tts``), ``generation_config.json`` (the reference's
sampling defaults), the tokenizer files, ``model.safetensors``
(``talker.*``; Base also ``speaker_encoder.*``, its ECAPA-TDNN) and ``speech_tokenizer/`` (``config.json`` of the 12 Hz
tokenizer, ``preprocessor_config.json``, ``model.safetensors`` with the
Mimi-style ``encoder.*`` and the ``decoder.*``).  The reference package
(``qwen-tts``) loads it with no missing or unexpected key
(tests/engines/test_qwen3_tts.py).

Does not own the modules (``qwen3_tts_modules.py``, whose tensor names the
weights take) nor anything that runs the model (``omnix.engines``).

The codec layout is the published one (talker vocabulary 3072, codebooks of
2048, pad / bos / eos 2148 / 2149 / 2150, think markers 2154-2157, the
languages' and the nine speakers' codec ids), read by the engines from
``config.json`` only.

Audible: every table transformers' init would leave at zero (the
quantizers' codebooks) is random, and the decoder's last convolution is
scaled so the waveform peaks well above silence.  Deterministic: every
tensor comes from a generator seeded by ``derived_seed(seed, MODEL,
name)`` (MODEL the tiny model's name); JSON is written with sorted keys.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from omnix.models.paths import ModelInfo
from omnix.models.seeds import derived_seed, pad64

if TYPE_CHECKING:
    import torch

#: Tiny model name per variant (``tts_model_type``).
MODEL_NAMES = {
    "custom_voice": "qwen3_tts_custom_voice",
    "voice_design": "qwen3_tts_voice_design",
    "base": "qwen3_tts_base",
}

# -- the published codec layout ---------------------------------------------------
TALKER_VOCAB = 3072
CODEBOOK_SIZE = 2048
NUM_CODE_GROUPS = 16
CODEC_PAD = 2148
CODEC_BOS = 2149
CODEC_EOS = 2150
CODEC_THINK = 2154
CODEC_NOTHINK = 2155
CODEC_THINK_BOS = 2156
CODEC_THINK_EOS = 2157
LANGUAGES = {
    "chinese": 2055,
    "english": 2050,
    "german": 2053,
    "italian": 2070,
    "portuguese": 2071,
    "spanish": 2054,
    "japanese": 2058,
    "korean": 2064,
    "french": 2061,
    "russian": 2069,
    "beijing_dialect": 2074,
    "sichuan_dialect": 2062,
}
SPEAKERS = {
    "serena": 3066,
    "vivian": 3065,
    "uncle_fu": 3010,
    "ryan": 3061,
    "aiden": 2861,
    "ono_anna": 2873,
    "sohee": 2864,
    "eric": 2875,
    "dylan": 2878,
}
DIALECTS = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920

# -- tiny sizes -------------------------------------------------------------------
TALKER_HIDDEN = 64
TALKER_LAYERS = 2
TALKER_HEADS = 4
TALKER_KV_HEADS = 2
HEAD_DIM = 16
MROPE_SECTION = (4, 2, 2)  # head_dim / 2, as [24, 20, 20] is of 128
#: The text embedding is wider than the talker, as the 0.6B model's is.
TEXT_HIDDEN = 96
PREDICTOR_HIDDEN = 32  # narrower than the talker, as the 1.7B model's is
PREDICTOR_LAYERS = 2
DECODER_HIDDEN = 32
DECODER_LATENT = 32
DECODER_CODEBOOK_DIM = 32
DECODER_DIM = 32
ENCODER_HIDDEN = 32
#: The speaker encoder's ECAPA-TDNN, narrow (the published one is 512 wide,
#: 1536 at the aggregation); its vector is the talker's width.
SPEAKER_ENCODER: dict[str, Any] = {
    "enc_attention_channels": 16,
    "enc_channels": [32, 32, 32, 32, 96],
    "enc_dilations": [1, 2, 3, 4, 1],
    "enc_kernel_sizes": [5, 3, 3, 3, 1],
    "enc_res2net_scale": 8,
    "enc_se_channels": 16,
    "mel_dim": 128,
}

#: Random decoder weights give a waveform near 1e-3; its last convolution
#: is scaled so the audio is audible (the output is clamped to [-1, 1]).
DECODER_OUTPUT_GAIN = 1024.0
#: Random encoder weights leave the quantizers' inputs near zero, so every
#: frame of reference audio takes the same (least-norm) code; Base, which
#: encodes reference audio, scales the quantizers' input projections so its
#: reference codes vary frame to frame.  (The other variants never encode.)
ENCODER_QUANTIZER_GAIN = 300.0
_ENCODER_GAINS = {
    f"encoder.quantizer.{part}_residual_vector_quantizer.input_proj.weight": ENCODER_QUANTIZER_GAIN
    for part in ("semantic", "acoustic")
}
_WEIGHT_STD = 0.05
_HEAD_STD = 0.15
_CODEBOOK_STD = 1.0
_HEADS = ("talker.codec_head.weight",)


def _rope_scaling() -> dict[str, Any]:
    return {"interleaved": True, "mrope_section": list(MROPE_SECTION), "rope_type": "default"}


def talker_config(text_vocab: int, variant: str = "custom_voice") -> dict[str, Any]:
    """``talker_config``; only CustomVoice has named speakers."""
    speakers = dict(SPEAKERS) if variant == "custom_voice" else {}
    return {
        "vocab_size": TALKER_VOCAB,
        "hidden_size": TALKER_HIDDEN,
        "intermediate_size": 2 * TALKER_HIDDEN,
        "num_hidden_layers": TALKER_LAYERS,
        "num_attention_heads": TALKER_HEADS,
        "num_key_value_heads": TALKER_KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000,
        "rope_scaling": _rope_scaling(),
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "num_code_groups": NUM_CODE_GROUPS,
        "text_hidden_size": TEXT_HIDDEN,
        "text_vocab_size": text_vocab,
        "position_id_per_seconds": 13,
        "codec_eos_token_id": CODEC_EOS,
        "codec_think_id": CODEC_THINK,
        "codec_nothink_id": CODEC_NOTHINK,
        "codec_think_bos_id": CODEC_THINK_BOS,
        "codec_think_eos_id": CODEC_THINK_EOS,
        "codec_pad_id": CODEC_PAD,
        "codec_bos_id": CODEC_BOS,
        "codec_language_id": dict(LANGUAGES),
        "spk_id": speakers,
        "spk_is_dialect": {name: DIALECTS.get(name, False) for name in speakers},
        "code_predictor_config": {
            "vocab_size": CODEBOOK_SIZE,
            "hidden_size": PREDICTOR_HIDDEN,
            "intermediate_size": 2 * PREDICTOR_HIDDEN,
            "num_hidden_layers": PREDICTOR_LAYERS,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": HEAD_DIM,
            "hidden_act": "silu",
            "max_position_embeddings": 64,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1_000_000,
            "rope_scaling": None,
            "attention_bias": False,
            "use_sliding_window": False,
            "num_code_groups": NUM_CODE_GROUPS,
        },
    }


TTS_PAD = "<|tts_pad|>"
TTS_BOS = "<|tts_bos|>"
TTS_EOS = "<|tts_eos|>"


class TokenIds(msgspec.Struct, frozen=True):
    """The text tokenizer's ids that ``config.json`` names."""

    im_start: int
    im_end: int
    tts_pad: int
    tts_bos: int
    tts_eos: int
    assistant: int
    text_vocab: int  # embedding rows (the tokenizer's size rounded up to 64)


def build_tokenizer(out_dir: Path) -> TokenIds:
    """omnix's tiny byte-level BPE with the chat roles one token each and
    the three TTS specials appended, saved as a ``Qwen2Tokenizer`` whose
    ``tokenizer_config.json`` both transformers 4.57 (the reference's) and
    5.x read: the specials listed as ``additional_special_tokens``, as the
    published folders list them (5.x writes ``extra_special_tokens``, a list
    4.57 takes for a dict)."""
    from transformers import AutoTokenizer

    from omnix.models.qwen3_omni import ROLE_WORDS
    from omnix.models.tokenizer import (
        IM_END,
        IM_START,
        merge_whole_words,
        save_tokenizer,
        train_tokenizer,
    )

    vocab, merges = merge_whole_words(*train_tokenizer(), ROLE_WORDS)
    for token in (TTS_PAD, TTS_BOS, TTS_EOS):
        vocab[token] = len(vocab)
    save_tokenizer(out_dir, vocab, merges, model_max_length=4096)
    path = out_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["additional_special_tokens"] = cfg.pop("extra_special_tokens", [])
    _write_json(path, cfg)
    tok = AutoTokenizer.from_pretrained(str(out_dir))
    (assistant,) = tok.encode("assistant", add_special_tokens=False)
    return TokenIds(
        im_start=vocab[IM_START],
        im_end=vocab[IM_END],
        tts_pad=vocab[TTS_PAD],
        tts_bos=vocab[TTS_BOS],
        tts_eos=vocab[TTS_EOS],
        assistant=int(assistant),
        text_vocab=pad64(len(tok)),
    )


def model_config(ids: TokenIds, variant: str = "custom_voice") -> dict[str, Any]:
    """``config.json`` of the whole model (``ids``: the tokenizer's)."""
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": "tiny",
        "tts_model_type": variant,
        "im_start_token_id": ids.im_start,
        "im_end_token_id": ids.im_end,
        "tts_pad_token_id": ids.tts_pad,
        "tts_bos_token_id": ids.tts_bos,
        "tts_eos_token_id": ids.tts_eos,
        "assistant_token_id": ids.assistant,
        "speaker_encoder_config": _speaker_encoder_config(variant),
        "talker_config": talker_config(ids.text_vocab, variant),
    }


def _speaker_encoder_config(variant: str) -> dict[str, Any]:
    """No ``model_type``: the reference's speaker encoder config rejects it."""
    base = {"enc_dim": TALKER_HIDDEN, "sample_rate": SAMPLE_RATE}
    return {**SPEAKER_ENCODER, **base} if variant == "base" else base


#: The reference's sampling defaults, as the published folders carry them.
GENERATION_CONFIG: dict[str, Any] = {
    "do_sample": True,
    "max_new_tokens": 8192,
    "repetition_penalty": 1.05,
    "subtalker_dosample": True,
    "subtalker_temperature": 0.9,
    "subtalker_top_k": 50,
    "subtalker_top_p": 1.0,
    "temperature": 0.9,
    "top_k": 50,
    "top_p": 1.0,
}


def decoder_fields() -> dict[str, Any]:
    return {
        "codebook_size": CODEBOOK_SIZE,
        "codebook_dim": DECODER_CODEBOOK_DIM,
        "hidden_size": DECODER_HIDDEN,
        "latent_dim": DECODER_LATENT,
        "max_position_embeddings": 8000,
        "rope_theta": 10000,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "attention_bias": False,
        "sliding_window": 72,
        "intermediate_size": 2 * DECODER_HIDDEN,
        "hidden_act": "silu",
        "layer_scale_initial_scale": 0.01,
        "rms_norm_eps": 1e-5,
        "num_hidden_layers": 1,
        "num_quantizers": NUM_CODE_GROUPS,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "decoder_dim": DECODER_DIM,
        "attention_dropout": 0.0,
    }


def encoder_fields() -> dict[str, Any]:
    """The Mimi encoder's config (12.5 frames a second at 24 kHz)."""
    return {
        "sampling_rate": SAMPLE_RATE,
        "audio_channels": 1,
        "hidden_size": ENCODER_HIDDEN,
        "num_filters": 4,
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
        "codebook_dim": 16,
        "num_quantizers": NUM_CODE_GROUPS,
        "use_conv_shortcut": False,
        "vector_quantization_hidden_dimension": 16,
        "num_semantic_quantizers": 1,
        "upsample_groups": ENCODER_HIDDEN,
        "num_hidden_layers": 1,
        "intermediate_size": 2 * ENCODER_HIDDEN,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": HEAD_DIM,
        "hidden_act": "gelu",
        "max_position_embeddings": 8000,
        "norm_eps": 1e-5,
        "use_cache": False,
        "rope_theta": 10000.0,
        "sliding_window": 250,
        "attention_dropout": 0.0,
        "layer_scale_initial_scale": 0.01,
        "attention_bias": False,
        "model_type": "mimi",
    }


def speech_tokenizer_config() -> dict[str, Any]:
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_config": encoder_fields(),
        "decoder_config": decoder_fields(),
        "encoder_valid_num_quantizers": NUM_CODE_GROUPS,
        "input_sample_rate": SAMPLE_RATE,
        "output_sample_rate": SAMPLE_RATE,
        "decode_upsample_rate": SAMPLES_PER_FRAME,
        "encode_downsample_rate": SAMPLES_PER_FRAME,
    }


FEATURE_EXTRACTOR: dict[str, Any] = {
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": SAMPLE_RATE,
    "chunk_length_s": None,
    "overlap": None,
}


def _shapes(module: Any) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in module.state_dict().items()}


def _encoder_shapes() -> dict[str, tuple[int, ...]]:
    """The Mimi encoder's tensors (``qwen3_tts_encoder.SpeechEncoder``)."""
    import torch

    from omnix.models.qwen3_tts_encoder import SpeechEncoder

    with torch.device("meta"):
        return _shapes(SpeechEncoder(encoder_fields(), NUM_CODE_GROUPS, SAMPLES_PER_FRAME))


def _random(
    shapes: dict[str, tuple[int, ...]], seed: int, model: str, prefix: str, gains: dict[str, float]
) -> dict[str, torch.Tensor]:
    """Norms and other vectors ones, biases zeros, matrices N(0, std): the
    codebooks N(0, 1) (transformers' init leaves them zero: silence), the
    codec head N(0, 0.15) (varied greedy codes), the rest N(0, 0.05)."""
    import torch

    out: dict[str, torch.Tensor] = {}
    for short, shape in sorted(shapes.items()):
        name = prefix + short
        if name.endswith(".bias"):
            out[name] = torch.zeros(shape)
        elif len(shape) <= 1:
            out[name] = torch.ones(shape)
        else:
            gen = torch.Generator().manual_seed(derived_seed(seed, model, name))
            if name.endswith(("embedding_sum", "embed_sum")):
                std = _CODEBOOK_STD
            elif name in _HEADS:
                std = _HEAD_STD
            else:
                std = _WEIGHT_STD
            out[name] = torch.randn(shape, generator=gen) * std * gains.get(name, 1.0)
    return out


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_folder(out_dir: Path, seed: int = 0, variant: str = "custom_voice") -> TokenIds:
    """Write the tiny checkpoint of ``variant`` (a ``tts_model_type``) into
    ``out_dir``; return the tokenizer's special ids."""
    import torch
    from safetensors.torch import save_file

    from omnix.models.qwen3_tts_modules import SpeechDecoder, TTSTalker

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ids = build_tokenizer(out_dir)
    _check_prompt_tokens(out_dir)
    model = MODEL_NAMES[variant]
    config = model_config(ids, variant)
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", GENERATION_CONFIG)
    with torch.device("meta"):
        talker = TTSTalker(config["talker_config"])
        decoder = SpeechDecoder(decoder_fields())
    talker_weights = _random(_shapes(talker), seed, model, "talker.", {})
    if variant == "base":
        talker_weights |= _speaker_encoder_weights(config, seed, model)
    save_file(talker_weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})

    speech = out_dir / "speech_tokenizer"
    speech.mkdir()
    _write_json(speech / "config.json", speech_tokenizer_config())
    _write_json(speech / "preprocessor_config.json", FEATURE_EXTRACTOR)
    last_conv = f"decoder.decoder.{len(decoder.decoder) - 1}.conv.weight"
    weights = _random(_shapes(decoder), seed, model, "decoder.", {last_conv: DECODER_OUTPUT_GAIN})
    gains = _ENCODER_GAINS if variant == "base" else {}
    weights |= _random(_encoder_shapes(), seed, model, "encoder.", gains)
    save_file(weights, str(speech / "model.safetensors"), metadata={"format": "pt"})
    return ids


def _speaker_encoder_weights(
    config: dict[str, Any], seed: int, model: str
) -> dict[str, torch.Tensor]:
    import torch

    from omnix.models.qwen3_tts_speaker import SpeakerEncoderFields, speaker_encoder

    with torch.device("meta"):
        encoder = speaker_encoder(SpeakerEncoderFields.of(config["speaker_encoder_config"]))
    return _random(_shapes(encoder), seed, model, "speaker_encoder.", {})


def _check_prompt_tokens(folder: Path) -> None:
    """The reference slices the prompt at fixed offsets: ``<|im_start|>``,
    ``assistant``, ``\\n`` first (3 ids) and ``<|im_end|>\\n<|im_start|>assistant\\n``
    last (5 ids)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    head = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    tail = tok.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    if len(head) != 3 or len(tail) != 5:
        raise AssertionError(f"prompt framing is {len(head)} + {len(tail)} tokens, not 3 + 5")


def build_qwen3_tts_custom_voice(out: Path, seed: int) -> ModelInfo:
    """The ``qwen3_tts_custom_voice`` tiny model (``omnix models init``)."""
    ids = write_folder(out, seed, "custom_voice")
    return ModelInfo(
        name=MODEL_NAMES["custom_voice"], seed=seed, layout=msgspec.structs.asdict(ids)
    )


def build_qwen3_tts_voice_design(out: Path, seed: int) -> ModelInfo:
    """The ``qwen3_tts_voice_design`` tiny model: no named speakers; a voice
    comes from a description (the instruction)."""
    ids = write_folder(out, seed, "voice_design")
    return ModelInfo(
        name=MODEL_NAMES["voice_design"], seed=seed, layout=msgspec.structs.asdict(ids)
    )


def build_qwen3_tts_base(out: Path, seed: int) -> ModelInfo:
    """The ``qwen3_tts_base`` tiny model: no named speakers; a voice is
    cloned from reference audio (the speaker encoder's vector, and with its
    transcript the tokenizer's codes of it)."""
    ids = write_folder(out, seed, "base")
    return ModelInfo(name=MODEL_NAMES["base"], seed=seed, layout=msgspec.structs.asdict(ids))
