"""The tiny Moshi ``omnix models init`` builds: the published transformers
layout (``kmhf/hf-moshiko``: Moshi's config with Mimi's inside, the text
tokenizer with Kyutai's special ids, the generation and feature extractor
configs), loaded by transformers with no missing or unexpected tensor,
byte-identical per seed, and audible.  (Its generation, held frame for
frame: tests/engines/test_duplex_model.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnix.models.moshi import (
    CODEBOOK_SIZE,
    FRAME_SAMPLES,
    NUM_CODEBOOKS,
    TEXT_BOS,
    TEXT_EOS,
    TEXT_EPAD,
    TEXT_PAD,
    write_folder,
)
from omnix.models.paths import folder_digest

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("moshi") / "moshi"
    write_folder(out, seed=0)
    return out


@pytest.fixture(scope="module")
def model(folder: Path):
    import torch
    from transformers import MoshiForConditionalGeneration

    torch.set_num_threads(1)
    model, info = MoshiForConditionalGeneration.from_pretrained(
        str(folder), output_loading_info=True
    )
    assert not any(info.values()), info
    return model.eval()


def test_the_folder_has_the_published_files(folder: Path) -> None:
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "preprocessor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
    ):
        assert (folder / name).is_file(), name


def test_the_config_is_moshi_over_mimi_at_the_published_rates(folder: Path) -> None:
    from transformers import AutoConfig

    raw = json.loads((folder / "config.json").read_text())
    assert raw["model_type"] == "moshi" and raw["architectures"] == [
        "MoshiForConditionalGeneration"
    ]
    assert raw["audio_encoder_config"]["model_type"] == "mimi"
    cfg = AutoConfig.from_pretrained(str(folder))
    mimi = cfg.audio_encoder_config
    assert (mimi.sampling_rate, mimi.frame_rate, mimi.frame_size) == (24000, 12.5, FRAME_SAMPLES)
    assert (cfg.audio_vocab_size, mimi.codebook_size) == (CODEBOOK_SIZE, CODEBOOK_SIZE)
    assert cfg.num_codebooks == NUM_CODEBOOKS < mimi.num_quantizers
    assert cfg.depth_decoder_config.num_codebooks == NUM_CODEBOOKS
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["depth_decoder_config"]["max_length"] == NUM_CODEBOOKS + 1


def test_the_tokenizer_has_kyutais_specials_and_round_trips(folder: Path) -> None:
    import sentencepiece as spm
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    specials = tok.convert_tokens_to_ids(["<unk>", "<s>", "</s>", "<pad>"])
    assert specials == [TEXT_EPAD, TEXT_BOS, TEXT_EOS, TEXT_PAD]
    assert len(tok) == AutoConfig.from_pretrained(str(folder)).vocab_size
    # The prompt style of transformers' own Moshi tests: padding, then the
    # end of padding before each word.
    ids = tok.encode("<pad><pad><unk> Hello,<pad><unk>", add_special_tokens=False)
    assert ids[:3] == [TEXT_PAD, TEXT_PAD, TEXT_EPAD] and ids[-2:] == [TEXT_PAD, TEXT_EPAD]
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    for text in ("Hello, how are you today?", "Numbers 42 and 2048.", "Grüße, 生活"):
        assert tok.encode(text, add_special_tokens=False) == sp.encode(text)
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_the_build_is_byte_identical_per_seed(folder: Path, tmp_path: Path) -> None:
    write_folder(tmp_path / "again", seed=0)
    assert folder_digest(tmp_path / "again") == folder_digest(folder)
    write_folder(tmp_path / "other", seed=1)
    assert (tmp_path / "other" / "model.safetensors").read_bytes() != (
        folder / "model.safetensors"
    ).read_bytes()
    assert (tmp_path / "other" / "tokenizer.json").read_bytes() == (
        folder / "tokenizer.json"
    ).read_bytes()


def test_it_speaks_audibly_and_hears_varied_codes(model) -> None:
    import math

    import torch

    out = model.generate(
        do_sample=False, depth_decoder_do_sample=False, return_audio_codes=True, max_new_tokens=25
    )
    audio = out.audio_sequences[0, 0]
    assert float(audio.abs().max()) > 0.1 and float(audio.pow(2).mean().sqrt()) > 0.01
    assert len(set(out.sequences[0, 1:].tolist())) > 5  # text varies
    assert len(set(out.audio_codes[0, 0].tolist())) > 5  # and so do the codes
    t = torch.arange(2 * 24000) / 24000
    chirp = 0.3 * torch.sin(2 * math.pi * (200 + 300 * t) * t)
    with torch.inference_mode():
        codes = model.audio_encoder.encode(chirp[None, None], num_quantizers=NUM_CODEBOOKS)[0]
    assert codes.shape == (1, NUM_CODEBOOKS, 25)
    assert len(set(codes[0, 0].tolist())) > 10  # user audio is heard frame by frame


def test_the_personaplex_folder_is_the_moshi_with_its_voice_prompts(
    folder: Path, tmp_path: Path
) -> None:
    """``personaplex`` (``omnix models init``): the tiny Moshi's files and
    weights (PersonaPlex fine-tunes Moshi's), and ``voices/NAME.wav``,
    two seconds of 24 kHz mono each, named as the published voices."""
    import soundfile as sf

    from omnix.models.build import build_model
    from omnix.models.paths import read_info
    from omnix.pipelines.persona_card import PersonaCard, read_persona_card

    built = build_model("personaplex", tmp_path, seed=0)
    info = read_info(built)
    assert info is not None and info.name == "personaplex"
    assert read_persona_card(built) == PersonaCard(voices=("NATF2", "NATM1"), role_text=True)
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (built / name).read_bytes() == (folder / name).read_bytes(), name
    for voice in ("NATF2", "NATM1"):
        got = sf.info(str(built / "voices" / f"{voice}.wav"))
        assert (got.samplerate, got.channels, got.frames) == (24000, 1, 48000)
    again = build_model("personaplex", tmp_path / "again", seed=0)
    assert folder_digest(again) == folder_digest(built)
