"""The code predictor's backbone (``omnix.engines.code_predictor``): the
same bits as transformers' modules, on the tiny whole Qwen3-Omni."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")


@pytest.mark.parametrize("batch", [1, 3])
def test_the_predictor_backbone_is_the_modules_forward_bit_for_bit(tiny_models, batch) -> None:
    """``PredictorBackbone`` (direct torch calls) against the code
    predictor's own ``forward`` with its ``DynamicCache``: a frame's
    prefill of two positions, then one position at a time, equal bits."""
    import torch
    from transformers import DynamicCache

    from omnix.engines.talker_model import TalkerModel

    model = TalkerModel.load(tiny_models.omni)
    predictor = model.talker.code_predictor.model
    backbone = model._predictor
    gen = torch.Generator().manual_seed(batch)
    width = predictor.config.hidden_size
    for _frame in range(2):  # the second frame starts from an empty cache again
        backbone.start()
        cache = DynamicCache(config=predictor.config)
        inputs = torch.randn(batch, 2, width, generator=gen)
        with torch.inference_mode():
            for _step in range(model.layout.num_code_groups - 1):
                want = predictor(inputs_embeds=inputs, past_key_values=cache, use_cache=True)
                got = backbone.forward(inputs)
                assert torch.equal(got, want.last_hidden_state[:, -1])
                inputs = torch.randn(batch, 1, width, generator=gen)
