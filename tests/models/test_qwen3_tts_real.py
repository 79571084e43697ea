"""Qwen3-TTS-12Hz-1.7B-CustomVoice's published sizes (the GPU TTS bench's
model): the modules built from them have the published parameter counts
and the tensor shapes the published checkpoint holds.  Built on the meta
device: no memory, no weights."""

from __future__ import annotations

import pytest

from omnix.models.qwen3_tts import TokenIds
from omnix.models.qwen3_tts_real import real_config, real_decoder_fields

torch = pytest.importorskip("torch")

IDS = TokenIds(
    im_start=151644,
    im_end=151645,
    tts_pad=151671,
    tts_bos=151672,
    tts_eos=151673,
    assistant=77091,
    text_vocab=151936,
)


def test_the_talker_at_the_published_sizes_has_1_7_billion_parameters() -> None:
    from omnix.models.qwen3_tts_modules import TTSTalker

    config = real_config(IDS)
    with torch.device("meta"):
        talker = TTSTalker(config["talker_config"])
    n = sum(p.numel() for p in talker.parameters())
    assert 1.8e9 < n < 2.0e9, n  # "1.7B": the talker, its text embedding and code predictor
    state = talker.state_dict()
    assert state["model.text_embedding.weight"].shape == (151936, 2048)
    assert state["model.layers.27.self_attn.k_proj.weight"].shape == (8 * 128, 2048)
    assert state["code_predictor.small_to_mtp_projection.weight"].shape == (1024, 2048)
    assert state["code_predictor.model.codec_embedding.14.weight"].shape == (2048, 2048)
    assert config["talker_config"]["spk_id"]["vivian"] == 3065


def test_the_decoders_heads_are_64_wide_not_its_width_over_their_number() -> None:
    from omnix.models.qwen3_tts_modules import SpeechDecoder

    with torch.device("meta"):
        decoder = SpeechDecoder(real_decoder_fields())
    state = decoder.state_dict()
    q = next(v for k, v in state.items() if k.endswith("layers.0.self_attn.q_proj.weight"))
    assert q.shape == (16 * 64, 512)
    assert state["quantizer.rvq_first.vq.layers.0._codebook.embedding_sum"].shape == (2048, 256)
