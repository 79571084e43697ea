"""The code predictor's backbone, run with the fewest Python calls that give
transformers' bits.

Owns ``PredictorBackbone``: the ops of
``Qwen3OmniMoeTalkerCodePredictorModel.forward`` with its sdpa attention
(RMS norms, projections, the q/k norms, rotary embedding, the key/value
cache grown by concatenation as ``DynamicCache`` grows it, scaled dot-product
attention causal on a prefill, the MLP), each a direct torch call on the
module's own weights.  A frame runs the backbone 15 times over one or two
positions of a 64-wide model on the tiny checkpoint: transformers' module
calls, cache object, mask builder and attention dispatch cost more than
the arithmetic there.  The same ops in the same order, so the same bits
(tests/engines/test_code_predictor.py holds it against the modules' own forward,
the oracle tests against transformers' generate).

Imported by the talker's engine only (torch and transformers at import).
Does not own choosing codes or the talker's backbone
(``omnix.engines.talker_model``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F
from transformers.integrations.sdpa_attention import repeat_kv, use_gqa_in_sdpa


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's weights and constants."""

    in_norm: Any
    post_norm: Any
    q_norm: Any
    k_norm: Any
    q: tuple[Any, Any]
    k: tuple[Any, Any]
    v: tuple[Any, Any]
    o: tuple[Any, Any]
    gate: Any
    up: Any
    down: Any
    act: Any
    eps: float
    head_eps: float


def _weights(linear: Any) -> tuple[Any, Any]:
    return linear.weight, linear.bias


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
        self.layers = [self._layer(layer) for layer in model.layers[: cfg.num_hidden_layers]]
        self.norm = (model.norm.weight, model.norm.variance_epsilon)
        self._rope: dict[tuple[int, int], tuple[Any, Any]] = {}
        self._kv: list[tuple[Any, Any] | None] = []
        self._past = 0

    @staticmethod
    def _layer(layer: Any) -> _Layer:
        a, mlp = layer.self_attn, layer.mlp
        return _Layer(
            in_norm=layer.input_layernorm.weight,
            post_norm=layer.post_attention_layernorm.weight,
            q_norm=a.q_norm.weight,
            k_norm=a.k_norm.weight,
            q=_weights(a.q_proj),
            k=_weights(a.k_proj),
            v=_weights(a.v_proj),
            o=_weights(a.o_proj),
            gate=mlp.gate_proj.weight,
            up=mlp.up_proj.weight,
            down=mlp.down_proj.weight,
            act=mlp.act_fn,
            eps=layer.input_layernorm.variance_epsilon,
            head_eps=a.q_norm.variance_epsilon,
        )

    def start(self) -> None:
        """Forget the cache: the next ``forward`` is a frame's prefill."""
        self._kv = [None] * len(self.layers)
        self._past = 0

    def _rotary(self, inputs: torch.Tensor, q: int) -> tuple[Any, Any]:
        """cos and sin for positions ``past .. past+q`` from the model's own
        rotary embedding, kept per (past, q): a frame asks the same 15."""
        key = (self._past, q)
        if key not in self._rope:
            positions = torch.arange(self._past, self._past + q, device=inputs.device)[None]
            cos, sin = self.model.rotary_emb(inputs, positions)
            self._rope[key] = (cos.unsqueeze(1), sin.unsqueeze(1))
        return self._rope[key]

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The backbone on ``inputs`` ([B, q, H]) after what the cache holds;
        the last position's normed hidden state ([B, H])."""
        batch, q = inputs.shape[0], inputs.shape[1]
        cos, sin = self._rotary(inputs, q)
        heads = (batch, q, -1, self.head_dim)
        h = inputs
        for i, w in enumerate(self.layers):
            x = _rms(h, w.in_norm, w.eps)
            qs = _rms(F.linear(x, *w.q).view(heads), w.q_norm, w.head_eps).transpose(1, 2)
            ks = _rms(F.linear(x, *w.k).view(heads), w.k_norm, w.head_eps).transpose(1, 2)
            vs = F.linear(x, *w.v).view(heads).transpose(1, 2)
            qs = (qs * cos) + (_rotate_half(qs) * sin)
            ks = (ks * cos) + (_rotate_half(ks) * sin)
            held = self._kv[i]
            if held is not None:
                ks = torch.cat([held[0], ks], dim=-2)
                vs = torch.cat([held[1], vs], dim=-2)
            self._kv[i] = (ks, vs)
            extra: dict[str, Any] = {}
            if self.groups > 1:
                if use_gqa_in_sdpa(None, ks, vs):
                    extra["enable_gqa"] = True
                else:
                    ks, vs = repeat_kv(ks, self.groups), repeat_kv(vs, self.groups)
            att = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=None, dropout_p=0.0, scale=self.scaling, is_causal=q > 1,
                **extra,
            )  # fmt: skip
            att = att.transpose(1, 2).contiguous().reshape(batch, q, -1).contiguous()
            h = h + F.linear(att, *w.o)
            x = _rms(h, w.post_norm, w.eps)
            h = h + F.linear(w.act(F.linear(x, w.gate)) * F.linear(x, w.up), w.down)
        self._past += q
        out: torch.Tensor = _rms(h[:, -1], *self.norm)
        return out


def _rms(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen3-Omni RMSNorm, op for op (its casts, which are
    no-ops in float32, left out there)."""
    dtype = h.dtype
    x = h if dtype == torch.float32 else h.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    out: torch.Tensor = weight * (x if dtype == torch.float32 else x.to(dtype))
    return out


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
