"""Qwen3-TTS's talker backbone's decode step with the fewest Python calls
that give transformers' bits.

Owns ``TalkerBackbone``: one new position per row of a decoding batch
through transformers' ``Qwen3VLTextModel`` (Qwen3-TTS's talker backbone:
dense, interleaved MRoPE), as its ``forward`` runs it with sdpa attention:
the 4-D mask transformers' own ``create_causal_mask`` builds from the
batch's 2-D mask and cache, the model's own rotary embedding of the
MRoPE positions, then each layer's ops as direct torch calls on its
weights (``direct_layers.py``), its keys and values appended to the
``DynamicCache`` by the cache itself, attention as transformers' sdpa
integration calls it (keys repeated for grouped heads under a mask), and
the final norm.  A step of the tiny checkpoint's talker costs more in
module calls, output objects and attention dispatch than in arithmetic.
The same ops in the same order, so the same bits
(tests/engines/test_talker_backbone.py holds it against the model's own
forward).

Imported by the talker's engine only (torch and transformers at import).
Does not own prefill (the model's own forward), choosing codes nor the
batch's cache (``talker_model.py``); Qwen3-Omni's talker (mixture of
experts) runs its modules.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F
from transformers.integrations.sdpa_attention import repeat_kv, use_gqa_in_sdpa
from transformers.masking_utils import create_causal_mask

from omnix.engines.direct_layers import LayerWeights, Norms, finish, project, rotation


class TalkerBackbone:
    """The decode step of a ``Qwen3VLTextModel`` with sdpa attention."""

    def __init__(self, model: Any) -> None:
        cfg = model.config
        if cfg._attn_implementation != "sdpa" or getattr(cfg, "sliding_window", None):
            raise ValueError(
                "the talker's decode step runs sdpa attention with no sliding window; "
                f"this one has {cfg._attn_implementation!r} attention"
            )
        self.model = model
        first = model.layers[0].self_attn
        self.head_dim: int = first.head_dim
        self.scaling: float = first.scaling
        self.groups: int = first.num_key_value_groups
        self.q_heads: int = cfg.num_attention_heads
        self.layers = [
            LayerWeights.of(layer, cfg.num_attention_heads, cfg.num_key_value_heads)
            for layer in model.layers
        ]
        self.norm = (model.norm.weight, model.norm.variance_epsilon)
        self._norms = Norms(model.norm.weight.device)

    def step(
        self, cache: Any, mask: torch.Tensor, positions: torch.Tensor, inputs: torch.Tensor
    ) -> torch.Tensor:
        """``inputs`` ([B, 1, H]) after what ``cache`` (a ``DynamicCache``,
        grown by the step) holds, under the 2-D ``mask`` ([B, past + 1]) at
        ``positions`` ([4, B, 1]: the text position, then MRoPE's three);
        the new position's normed hidden state ([B, H])."""
        model = self.model
        batch = inputs.shape[0]
        attention_mask = create_causal_mask(
            config=model.config,
            inputs_embeds=inputs,
            attention_mask=mask,
            past_key_values=cache,
            position_ids=positions[0],
        )
        if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
            raise TypeError(f"sdpa attention takes a tensor mask, not {type(attention_mask)}")
        cos, sin = rotation(*model.rotary_emb(inputs, positions[1:]))
        heads = (batch, 1, -1, self.head_dim)
        norm = self._norms
        h = inputs.reshape(batch, -1)
        for i, w in enumerate(self.layers):
            qs, ks, vs = project(norm, w, h, heads, self.q_heads, cos, sin)
            ks, vs = cache.update(ks, vs, i)
            extra: dict[str, Any] = {}
            if self.groups > 1:
                if use_gqa_in_sdpa(attention_mask, ks, vs):
                    extra["enable_gqa"] = True
                else:
                    ks, vs = repeat_kv(ks, self.groups), repeat_kv(vs, self.groups)
            att = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=attention_mask, dropout_p=0.0, scale=self.scaling,
                is_causal=False, **extra,
            )  # fmt: skip
            h = finish(norm, w, h, att)
        out: torch.Tensor = norm(h, *self.norm)
        return out
