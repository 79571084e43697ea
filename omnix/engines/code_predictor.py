"""The code predictor's backbone, run with the fewest Python calls that give
transformers' bits.

Owns ``PredictorBackbone``: the ops of
``Qwen3OmniMoeTalkerCodePredictorModel.forward`` with its sdpa attention
(RMS norms, projections, the q/k norms, rotary embedding, the key/value
cache grown by concatenation as ``DynamicCache`` grows it, scaled dot-product
attention causal on a prefill, the MLP), each a direct torch call on the
module's own weights (``direct_layers.py``: the layer's ops, and why they
are fewer than the modules').  A frame runs the backbone 15 times over one
or two positions of a 64-wide model on the tiny checkpoint: transformers'
module calls, cache object, mask builder and attention dispatch cost more
than the arithmetic there.  The same ops in the same order, so the same
bits (tests/engines/test_code_predictor.py holds it against the modules'
own forward, the oracle tests against transformers' generate).

Imported by the talker's engine only (torch and transformers at import).
Does not own choosing codes or the talker's backbone
(``omnix.engines.talker_model``, ``talker_backbone.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F
from transformers.integrations.sdpa_attention import repeat_kv, use_gqa_in_sdpa

from omnix.engines.direct_layers import LayerWeights, Norms, finish, project, rotation


class PredictorBackbone:
    """The code predictor's decoder stack over a cache of its own (one
    frame's: started empty by ``start``)."""

    def __init__(self, model: Any) -> None:
        cfg = model.config
        if cfg._attn_implementation != "sdpa" or getattr(cfg, "sliding_window", None):
            raise ValueError(
                "the code predictor runs with sdpa attention and no sliding window; "
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
            for layer in model.layers[: cfg.num_hidden_layers]
        ]
        self.norm = (model.norm.weight, model.norm.variance_epsilon)
        self._norms = Norms(model.norm.weight.device)
        self._gqa: bool | None = None  # sdpa's own grouping (else keys repeated), once known
        self._rope: dict[tuple[int, int], tuple[Any, Any]] = {}
        self._kv: list[tuple[Any, Any] | None] = []
        self._past = 0

    def start(self) -> None:
        """Forget the cache: the next ``forward`` is a frame's prefill."""
        self._kv = [None] * len(self.layers)
        self._past = 0

    def _rotary(self, inputs: torch.Tensor, q: int) -> tuple[Any, Any]:
        """``rotation`` for positions ``past .. past+q`` from the model's own
        rotary embedding, kept per (past, q): a frame asks the same 15."""
        key = (self._past, q)
        if key not in self._rope:
            positions = torch.arange(self._past, self._past + q, device=inputs.device)[None]
            self._rope[key] = rotation(*self.model.rotary_emb(inputs, positions))
        return self._rope[key]

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The backbone on ``inputs`` ([B, q, H]) after what the cache holds;
        the last position's normed hidden state ([B, H])."""
        batch, q = inputs.shape[0], inputs.shape[1]
        cos, sin = self._rotary(inputs, q)
        heads = (batch, q, -1, self.head_dim)
        norm = self._norms
        h = inputs.reshape(batch * q, -1)
        for i, w in enumerate(self.layers):
            qs, ks, vs = project(norm, w, h, heads, self.q_heads, cos, sin)
            held = self._kv[i]
            if held is not None:
                ks = torch.cat([held[0], ks], dim=-2)
                vs = torch.cat([held[1], vs], dim=-2)
            self._kv[i] = (ks, vs)
            extra: dict[str, Any] = {}
            if self.groups > 1:
                if self._gqa is None:
                    self._gqa = bool(use_gqa_in_sdpa(None, ks, vs))
                if self._gqa:
                    extra["enable_gqa"] = True
                else:
                    ks, vs = repeat_kv(ks, self.groups), repeat_kv(vs, self.groups)
            att = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=None, dropout_p=0.0, scale=self.scaling, is_causal=q > 1,
                **extra,
            )  # fmt: skip
            h = finish(norm, w, h, att)
        self._past += q
        out: torch.Tensor = norm(h.view(batch, q, -1)[:, -1], *self.norm)
        return out
