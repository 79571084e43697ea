"""The Qwen3-TTS talker's decode step as direct calls
(``omnix.engines.talker_backbone``): the same bits as its backbone's own
forward, on a batch whose rows have prompts of different lengths (the
cache left-padded, the mask masking the padding), step after step."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("transformers")


def test_the_talker_decode_step_is_the_models_forward_bit_for_bit(tiny_models) -> None:
    import torch

    from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker, SpeechRequest
    from omnix.engines.talker_model import BatchCache, Sampling

    talker = Qwen3TTSTalker.load(tiny_models.qwen3_tts_custom_voice)
    assert talker._decode is not None
    texts = ("Hi.", "A somewhat longer sentence to say.", "And a third one, in between.")
    batch = BatchCache(talker.talker.config.text_config)
    lengths = []
    for text in texts:
        req = SpeechRequest(text=text, speaker="vivian", non_streaming=True)
        cond = talker.prompt(req).prefill
        cache, slot, _, _ = talker.prefill(cond, Sampling(temperature=0.0))
        batch.add(cache, slot.length)
        lengths.append(slot.length)
    assert len(set(lengths)) > 1  # rows padded to the longest
    theirs = copy.deepcopy(batch)
    gen = torch.Generator().manual_seed(0)
    width = talker.talker.config.text_config.hidden_size
    for _step in range(4):
        inputs = torch.randn(len(texts), 1, width, generator=gen)
        pos = torch.tensor(batch.lengths)
        positions = torch.stack([pos, pos + 1, pos + 1, pos + 1])[:, :, None]
        with torch.no_grad():
            got = talker._decode.step(batch.cache, batch.mask(), positions, inputs)
            want = talker.talker.model(
                inputs_embeds=inputs,
                attention_mask=theirs.mask(),
                position_ids=positions,
                past_key_values=theirs.cache,
                use_cache=True,
            ).last_hidden_state[:, -1]
        assert torch.equal(got, want)
        for mine, other in zip(batch.cache.layers, theirs.cache.layers, strict=True):
            assert torch.equal(mine.keys, other.keys) and torch.equal(mine.values, other.values)
        batch.grew()
        theirs.grew()
