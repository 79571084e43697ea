"""Qwen3-TTS-12Hz-1.7B-CustomVoice at its published sizes, with random
weights made on a device (no download).

Owns: the published ``config.json`` numbers of the 1.7B talker and its
code predictor (``REAL_TALKER``, ``REAL_PREDICTOR``) and of the 12 Hz
tokenizer's decoder (``REAL_DECODER``), and ``real_folder``: a CustomVoice
folder in the published layout (``config.json``, ``generation_config.json``,
tokenizer files, ``model.safetensors`` with ``talker.*``,
``speech_tokenizer/``), built once under a cache directory
(``paths.built_once``) and loaded from there by the engines as any
checkpoint is.  The GPU TTS bench (``omnix bench tts --device cuda --sizes
real``) serves it.

Not published: the text tokenizer is omnix's tiny byte-level one (the
embedding keeps the published 151,936 rows; a bench's texts tokenize
longer than Qwen's tokenizer would make them), and the speech tokenizer
has no encoder (CustomVoice never encodes audio).  Weights: norms one,
biases zero, matrices N(0, 0.02), codebooks N(0, 1), made in the folder's
dtype on the device from one seed per component: weights made on a CUDA
device differ from a CPU's of the same seed, so the folder's name says
which made them.

Does not own the tiny checkpoints and their layout (``qwen3_tts.py``, whose
codec ids, speakers and languages these share) nor running the model
(``omnix.engines``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from omnix.models.paths import built_once
from omnix.models.qwen3_omni_real import REAL_PREDICTOR as OMNI_PREDICTOR
from omnix.models.qwen3_tts import (
    GENERATION_CONFIG,
    decoder_fields,
    model_config,
    speech_tokenizer_config,
)
from omnix.models.seeds import fill_random, made_on

NAME = "qwen3-tts-12hz-1.7b-custom-voice"
#: Qwen3-TTS-12Hz-1.7B-CustomVoice's ``talker_config``
REAL_TALKER: Final[dict[str, Any]] = {
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "text_hidden_size": 2048,
    "text_vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_scaling": {"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
}
#: its ``code_predictor_config``: Qwen3-Omni-30B-A3B's code predictor's sizes
REAL_PREDICTOR: Final[dict[str, Any]] = {**OMNI_PREDICTOR, "max_position_embeddings": 65536}
#: Qwen3-TTS-Tokenizer-12Hz's ``decoder_config``
REAL_DECODER: Final[dict[str, Any]] = {
    "codebook_dim": 512,
    "hidden_size": 512,
    "head_dim": 64,
    "latent_dim": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "intermediate_size": 1024,
    "num_hidden_layers": 8,
    "decoder_dim": 1536,
}


def real_config(ids: Any) -> dict[str, Any]:
    """The whole ``config.json`` (``ids``: ``qwen3_tts.TokenIds``)."""
    config = model_config(ids, "custom_voice")
    config["tts_model_size"] = "1b7"
    talker = config["talker_config"]
    talker.update(REAL_TALKER)
    talker["code_predictor_config"].update(REAL_PREDICTOR)
    return config


def real_decoder_fields() -> dict[str, Any]:
    return {**decoder_fields(), **REAL_DECODER}


def _std(name: str) -> float:
    return 1.0 if name.endswith("embedding_sum") else 0.02


def real_folder(
    root: Path, device: str, dtype: str = "bfloat16", seed: int = 0
) -> tuple[Path, dict[str, Any]]:
    """The folder under ``root`` (built first if missing, on ``device`` in
    ``dtype``) and its marker's facts: ``parameters`` (the talker's, with
    its code predictor), ``decoder_parameters``."""
    kind = "cuda" if device.startswith("cuda") else device
    folder = Path(root) / f"{NAME}-{kind}-{dtype}-seed{seed}"
    return built_once(folder, lambda tmp: _build(tmp, device, dtype, seed))


def _build(out: Path, device: str, dtype: str, seed: int) -> dict[str, Any]:
    from safetensors.torch import save_file

    from omnix.models.qwen3_tts import FEATURE_EXTRACTOR, build_tokenizer
    from omnix.models.qwen3_tts_modules import SpeechDecoder, TTSTalker

    ids = build_tokenizer(out)
    config = real_config(ids)
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", GENERATION_CONFIG)
    with made_on(device, dtype):
        talker = TTSTalker(config["talker_config"])
    fill_random(talker, seed, _std)
    _save(talker, "talker.", out / "model.safetensors", save_file)
    speech = out / "speech_tokenizer"
    speech.mkdir()
    tokenizer = speech_tokenizer_config()
    tokenizer["decoder_config"] = real_decoder_fields()
    del tokenizer["encoder_config"]
    _write_json(speech / "config.json", tokenizer)
    _write_json(speech / "preprocessor_config.json", FEATURE_EXTRACTOR)
    with made_on(device, dtype):
        decoder = SpeechDecoder(tokenizer["decoder_config"])
    fill_random(decoder, seed + 1, _std)
    _save(decoder, "decoder.", speech / "model.safetensors", save_file)
    return {
        "name": NAME,
        "seed": seed,
        "dtype": dtype,
        "parameters": sum(p.numel() for p in talker.parameters()),
        "decoder_parameters": sum(p.numel() for p in decoder.parameters()),
    }


def _save(module: Any, prefix: str, path: Path, save_file: Any) -> None:
    tensors = {prefix + k: v.detach().contiguous() for k, v in module.state_dict().items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
