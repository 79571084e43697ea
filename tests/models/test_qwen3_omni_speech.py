"""The tiny whole Qwen3-Omni (``omni``): the published checkpoint's layout
at tiny width, loaded by transformers with nothing missing, deterministic
per seed, its chat roles one token each and its waveform audible."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnix.models.build import build_model
from omnix.models.paths import ModelPaths, folder_digest
from omnix.models.qwen3_omni_speech import read_speakers


def test_the_whole_omni_builds_the_same_folder_for_a_seed(
    tiny_models: ModelPaths, tmp_path: Path
) -> None:
    again = build_model("omni", tmp_path / "a", seed=0)
    other = build_model("omni", tmp_path / "b", seed=1)
    assert folder_digest(again) == folder_digest(Path(tiny_models.omni))
    assert folder_digest(other) != folder_digest(Path(tiny_models.omni))


def test_the_codec_layout_is_the_published_checkpoints(tiny_models: ModelPaths) -> None:
    cfg = json.loads((Path(tiny_models.omni) / "config.json").read_text())
    assert cfg["enable_audio_output"] is True
    talker = cfg["talker_config"]
    assert talker["text_config"]["vocab_size"] == 3072
    assert talker["code_predictor_config"]["vocab_size"] == 2048
    assert cfg["code2wav_config"]["codebook_size"] == 2048
    assert (talker["codec_pad_id"], talker["codec_bos_id"], talker["codec_eos_token_id"]) == (
        2148,
        2149,
        2150,
    )
    assert (talker["codec_nothink_id"], talker["codec_think_bos_id"]) == (2155, 2156)
    assert talker["codec_think_eos_id"] == 2157
    assert talker["speaker_id"] == {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
    groups = talker["num_code_groups"]
    assert groups == talker["code_predictor_config"]["num_code_groups"]
    assert groups == cfg["code2wav_config"]["num_quantizers"]
    assert talker["code_predictor_config"]["hidden_size"] == talker["text_config"]["hidden_size"]
    assert read_speakers(Path(tiny_models.omni)) == ("chelsie", "ethan", "aiden")


def test_transformers_loads_every_weight_and_the_roles_are_one_token(
    tiny_models: ModelPaths,
) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    model, info = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        tiny_models.omni, output_loading_info=True, dtype=torch.float32
    )
    assert {k: v for k, v in info.items() if v} == {}
    names = set(_names(Path(tiny_models.omni)))
    assert any(n.startswith("talker.code_predictor.lm_head.") for n in names)
    assert "talker.model.layers.0.mlp.experts.0.gate_proj.weight" in names  # hub layout
    assert any(n.startswith("code2wav.decoder.") for n in names)
    tok = AutoTokenizer.from_pretrained(tiny_models.omni)
    for role in ("system", "user", "assistant"):
        assert len(tok.encode(f"<|im_start|>{role}\n", add_special_tokens=False)) == 3
    cfg = model.config
    assert tok.convert_tokens_to_ids("assistant") == cfg.assistant_token_id


def test_its_code2wav_is_audible(tiny_models: ModelPaths) -> None:
    torch = pytest.importorskip("torch")
    from omnix.engines.code2wav_engine import load_code2wav

    model = load_code2wav(Path(tiny_models.omni), "cpu")
    codes = torch.randint(0, 2048, (1, 16, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        wav = model(codes)[0, 0]
    # 1920 samples (80 ms at 24 kHz) a frame, less the causal edge it trims
    assert 29 * 1920 < wav.shape[0] <= 30 * 1920
    assert 0.05 < float(wav.abs().max()) <= 1.0


def _names(folder: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return list(f.keys())
