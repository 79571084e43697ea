"""The tiny Qwen3-TTS CustomVoice checkpoint ``omnix models init`` builds:
the published folder layout and codec ids, and audible.  (Byte-identical
per seed: tests/models/test_models.py, over every tiny model; loaded by the
reference with no missing or unexpected tensor:
tests/engines/test_qwen3_tts.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnix.models.qwen3_tts import write_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("qwen3-tts") / "custom_voice"
    write_folder(out, seed=0)
    return out


def test_the_folder_has_the_published_files(folder: Path) -> None:
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "speech_tokenizer/config.json",
        "speech_tokenizer/preprocessor_config.json",
        "speech_tokenizer/model.safetensors",
    ):
        assert (folder / name).is_file(), name


def test_the_config_keeps_the_published_codec_ids(folder: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    talker = cfg["talker_config"]
    assert (cfg["model_type"], cfg["tts_model_type"]) == ("qwen3_tts", "custom_voice")
    assert (talker["vocab_size"], talker["code_predictor_config"]["vocab_size"]) == (3072, 2048)
    assert (talker["codec_pad_id"], talker["codec_bos_id"], talker["codec_eos_token_id"]) == (
        2148,
        2149,
        2150,
    )
    assert talker["num_code_groups"] == 16
    assert talker["spk_id"]["vivian"] == 3065 and talker["codec_language_id"]["english"] == 2050
    assert talker["spk_is_dialect"]["eric"] == "sichuan_dialect"
    speech = json.loads((folder / "speech_tokenizer" / "config.json").read_text())
    assert speech["model_type"] == "qwen3_tts_tokenizer_12hz"
    assert speech["decode_upsample_rate"] == 1920 and speech["output_sample_rate"] == 24000


def test_the_prompt_framing_is_as_many_tokens_as_the_reference_slices(folder: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    cfg = json.loads((folder / "config.json").read_text())
    head = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert len(head) == 3 and head[0] == cfg["im_start_token_id"]
    assert len(tok.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)) == 5


def test_the_codebooks_are_filled_and_the_decoder_is_audible(folder: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from omnix.engines.speech_decoder import SpeechCodec

    weights = load_file(str(folder / "speech_tokenizer" / "model.safetensors"))
    books = [v for k, v in weights.items() if k.endswith(("embedding_sum", "embed_sum"))]
    assert books and all(float(b.abs().min()) >= 0 and float(b.abs().max()) > 0.5 for b in books)
    codes = torch.randint(0, 2048, (12, 16), generator=torch.Generator().manual_seed(1))
    wav = SpeechCodec.load(folder).decode(codes)
    assert wav.shape == (12 * 1920,)
    assert 0.1 < float(wav.abs().max()) <= 1.0


def test_the_base_folder_has_a_speaker_encoder_and_no_named_speakers(tmp_path: Path) -> None:
    """Base: ``speaker_encoder.*`` beside ``talker.*`` (its vector the
    talker's width), a ``speaker_encoder_config`` without the ``model_type``
    the reference's config rejects, and no ``spk_id``."""
    from safetensors import safe_open

    out = tmp_path / "base"
    write_folder(out, seed=0, variant="base")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tts_model_type"] == "base" and cfg["talker_config"]["spk_id"] == {}
    speaker = cfg["speaker_encoder_config"]
    assert "model_type" not in speaker
    assert speaker["enc_dim"] == cfg["talker_config"]["hidden_size"]
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert "speaker_encoder.fc.weight" in names and "talker.codec_head.weight" in names
