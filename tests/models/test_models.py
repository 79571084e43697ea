"""``omnix models``: deterministic builds, the cache, name resolution, the
tokenizer (through the loader vLLM uses) and the models' shapes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from omnix.models.build import (
    CODEC_BOS,
    CODEC_EOS,
    CODEC_SIZE,
    NUM_CODEBOOKS,
    TEXT_OFFSET,
    build_model,
    ensure_models,
    missing_models,
)
from omnix.models.paths import (
    TINY_MODELS,
    ModelPaths,
    default_model_dir,
    folder_digest,
    read_info,
    resolve_model,
)

pytestmark = pytest.mark.engines


def test_init_cli_is_deterministic_and_seeded(
    tmp_path: Path, tiny_models: ModelPaths, capsys
) -> None:
    from omnix.cli import main

    assert main(["models", "init", "--dir", str(tmp_path / "a"), "--seed", "0"]) == 0
    out = capsys.readouterr().out
    for name in TINY_MODELS:
        assert name in out
    a = {n: folder_digest(tmp_path / "a" / n) for n in TINY_MODELS}
    # Same seed, another folder, another code path (ensure_models): same bytes.
    ensure_models(tmp_path / "b", seed=0)
    b = {n: folder_digest(tmp_path / "b" / n) for n in TINY_MODELS}
    assert a == b
    # Another seed changes every model's weights.
    ensure_models(tmp_path / "c", seed=1, names=("thinker", "code2wav"))
    for name in ("thinker", "code2wav"):
        assert folder_digest(tmp_path / "c" / name) != a[name]
        assert read_info(tmp_path / "c" / name).seed == 1
    # The second init finds everything and builds nothing.
    assert main(["models", "init", "--dir", str(tmp_path / "a")]) == 0
    assert "all models present" in capsys.readouterr().out


def test_ensure_models_builds_only_what_is_missing(tmp_path: Path) -> None:
    root = tmp_path / "m"
    ensure_models(root, names=("thinker", "code2wav"))
    before = (root / "thinker" / "model.safetensors").stat().st_mtime_ns
    # An interrupted build leaves no marker: that folder counts as missing.
    (root / "code2wav" / "omnix.json").unlink()
    assert missing_models(root, names=("thinker", "code2wav")) == ["code2wav"]
    paths = ensure_models(root, names=("thinker", "code2wav"))
    assert (root / "thinker" / "model.safetensors").stat().st_mtime_ns == before
    assert read_info(paths.path("code2wav")).name == "code2wav"
    assert not [p for p in root.iterdir() if p.name.startswith(".")], "temporary build folders left"
    # --force rebuilds in place, byte-identical.
    digest = folder_digest(root / "code2wav")
    build_model("code2wav", root, seed=0)
    assert folder_digest(root / "code2wav") == digest


def test_resolve_model(tmp_path: Path, tiny_models: ModelPaths, monkeypatch) -> None:
    root = Path(tiny_models.root)
    assert resolve_model("thinker", root) == root / "thinker"
    monkeypatch.setenv("OMNIX_MODEL_DIR", str(root))
    assert default_model_dir() == root
    assert resolve_model("image") == root / "image"
    # A local folder is used as is.
    local = tmp_path / "my-model"
    local.mkdir()
    assert resolve_model(str(local)) == local
    with pytest.raises(FileNotFoundError, match="omnix models init"):
        resolve_model("talker", tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="not found"):
        resolve_model(str(tmp_path / "nope"))
    monkeypatch.delenv("OMNIX_MODEL_DIR")
    assert default_model_dir() == Path.home() / ".cache" / "omnix" / "models"


def test_tokenizer_roundtrips_through_vllms_loader(tiny_models: ModelPaths) -> None:
    from tokenizers import Tokenizer
    from vllm.tokenizers import get_tokenizer

    from omnix.models.corpus import ROUNDTRIP_SAMPLES
    from omnix.models.tokenizer import check_roundtrip

    folder = tiny_models.path("thinker")
    check_roundtrip(folder)
    tok = get_tokenizer(str(folder))  # what vLLM's engine loads for this folder
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    # transformers rebuilt it as a Qwen2Tokenizer (model_type qwen2) and the
    # ids still agree with tokenizer.json: the point of training natively.
    assert "Qwen2Tokenizer" in [c.__name__ for c in type(tok).__mro__]
    for text in ROUNDTRIP_SAMPLES:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == raw.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids) == text
    # ChatML template, special tokens as single ids.
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(prompt, add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert tok.eos_token == "<|im_end|>"


def test_model_configs(tiny_models: ModelPaths) -> None:
    thinker = json.loads((tiny_models.path("thinker") / "config.json").read_text())
    assert thinker["model_type"] == "qwen2"
    assert (
        thinker["hidden_size"] // thinker["num_attention_heads"] == 64
    )  # a CPU-supported head size
    text_vocab = read_info(tiny_models.path("thinker")).layout["text_vocab"]
    assert thinker["vocab_size"] >= text_vocab
    talker = json.loads((tiny_models.path("talker") / "config.json").read_text())
    layout = read_info(tiny_models.path("talker")).layout
    # The talker reads every id either thinker can emit: the omni thinker's
    # whole head (trained vocabulary, multimodal specials, padding rows).
    omni = json.loads((tiny_models.path("omni_thinker") / "config.json").read_text())
    omni_vocab = omni["thinker_config"]["text_config"]["vocab_size"]
    assert omni_vocab >= text_vocab
    assert layout == {
        "text_offset": TEXT_OFFSET,
        "text_vocab": omni_vocab,
        "codec_offset": 0,
        "codec_size": CODEC_SIZE,
        "codec_eos": CODEC_EOS,
        "codec_bos": CODEC_BOS,
        "num_codebooks": NUM_CODEBOOKS,
    }
    assert talker["vocab_size"] >= TEXT_OFFSET + omni_vocab
    assert CODEC_BOS < TEXT_OFFSET
    # The talker has no tokenizer of its own (vLLM runs it on ids) but keeps
    # the omni thinker's for text-only input pieces.
    assert not (tiny_models.path("talker") / "tokenizer.json").exists()
    assert (tiny_models.path("talker") / "text_tokenizer" / "tokenizer.json").read_bytes() == (
        tiny_models.path("omni_thinker") / "tokenizer.json"
    ).read_bytes()
    codec = json.loads((tiny_models.path("code2wav") / "config.json").read_text())
    assert (codec["num_codebooks"], codec["codebook_size"]) == (NUM_CODEBOOKS, CODEC_SIZE)
    assert (
        json.loads((tiny_models.path("image") / "model_index.json").read_text())["_class_name"]
        == "FluxPipeline"
    )


def test_model_dir_env_is_where_the_session_built(tiny_models: ModelPaths) -> None:
    assert os.environ["OMNIX_MODEL_DIR"] == tiny_models.root
