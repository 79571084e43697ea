"""A Qwen3 decoder layer's ops as direct torch calls that give transformers' bits.

Owns: ``LayerWeights`` (one layer's weights, read once off its modules),
``Norms`` (transformers' RMSNorm), ``rotation`` (the rotary tables) and
``project`` / ``finish`` (a layer's attention inputs, and its output
projection and MLP), which the talker's and the code predictor's
backbones (``talker_backbone.py``, ``code_predictor.py``) run on their own
caches and attention.  At the tiny checkpoints' widths each torch call
costs more than its arithmetic, so where fewer calls give the same bits
these make fewer:

- positions are rows (``[B*q, H]``) and projections ``mm`` by the
  transposed weight: what ``linear`` does with a bias-free weight, through
  views this skips;
- the query and key heads are normed and rotated as one tensor (each head
  row is normed alone, with its own norm's weight, whatever rows lie
  beside it; rotation is elementwise);
- rotation is ``x * cos + roll(x) * sin'`` with ``sin'`` the sine with its
  first half negated: ``rotate_half(x) * sin`` element for element, as
  negating a factor negates an IEEE product exactly;
- on the CPU, a norm's square is ``x * x`` (what ATen's CPU ``pow(x, 2)``
  computes) and its mean the sum divided by the count in place (what
  ATen's CPU ``mean`` computes), the count and epsilon float32 tensors made
  once (a Python number is wrapped in a tensor and cast at every call);
  CUDA's ``mean`` scales inside its reduction, so there it keeps ``mean``.

The same values in the same order (tests/engines/test_code_predictor.py
and test_talker_backbone.py hold both backbones to their modules' forward,
bit for bit).  Torch at import: the engines import it where used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F


def _transposed(linear: Any) -> Any:
    if linear.bias is not None:
        raise ValueError("these layers' projections have no bias (attention_bias false)")
    return linear.weight.t()


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's weights (projections transposed: views, what
    ``linear`` multiplies by) and constants."""

    in_norm: Any
    post_norm: Any
    #: the q norm's weight for each query head, then the k norm's for each key head
    qk_norm: Any
    q: Any
    k: Any
    v: Any
    o: Any
    gate: Any
    up: Any
    down: Any
    act: Any
    eps: float
    head_eps: float

    @classmethod
    def of(cls, layer: Any, q_heads: int, kv_heads: int) -> LayerWeights:
        a, mlp = layer.self_attn, layer.mlp
        qk_norm = torch.stack([a.q_norm.weight] * q_heads + [a.k_norm.weight] * kv_heads)
        act = F.silu if isinstance(mlp.act_fn, torch.nn.SiLU) else mlp.act_fn
        return cls(
            in_norm=layer.input_layernorm.weight,
            post_norm=layer.post_attention_layernorm.weight,
            qk_norm=qk_norm,
            q=_transposed(a.q_proj),
            k=_transposed(a.k_proj),
            v=_transposed(a.v_proj),
            o=_transposed(a.o_proj),
            gate=_transposed(mlp.gate_proj),
            up=_transposed(mlp.up_proj),
            down=_transposed(mlp.down_proj),
            act=act,
            eps=layer.input_layernorm.variance_epsilon,
            head_eps=a.q_norm.variance_epsilon,
        )


class Norms:
    """transformers' RMSNorm (its casts, no-ops in float32, left out there)
    on one device."""

    def __init__(self, device: torch.device) -> None:
        self.cpu = device.type == "cpu"
        self._consts: dict[float, torch.Tensor] = {}

    def __call__(self, h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if not self.cpu or h.dtype != torch.float32:
            return _rms(h, weight, eps)
        return _rms_cpu(h, weight, self._const(eps, h), self._const(float(h.shape[-1]), h))

    def _const(self, value: float, like: torch.Tensor) -> torch.Tensor:
        t = self._consts.get(value)
        if t is None:
            t = self._consts[value] = torch.tensor(value, dtype=like.dtype, device=like.device)
        return t


def rotation(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A rotary embedding's ``cos`` and ``sin`` ([B, q, head_dim]) as
    ``project`` takes them: a head axis added, the sine's first half negated."""
    half = sin.shape[-1] // 2
    signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return cos.unsqueeze(1), signed.unsqueeze(1)


def project(
    norm: Norms,
    w: LayerWeights,
    h: torch.Tensor,
    heads: tuple[int, int, int, int],
    q_heads: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer's queries, keys and values ([B, heads, q, head_dim]) of the
    rows ``h`` ([B*q, H]; ``heads``: (B, q, -1, head_dim)), normed and
    rotated (``cos`` and ``sin``: ``rotation``'s)."""
    mm = torch.mm
    x = norm(h, w.in_norm, w.eps)
    qk = torch.cat((mm(x, w.q), mm(x, w.k)), dim=1).view(heads)
    qk = norm(qk, w.qk_norm, w.head_eps).transpose(1, 2)
    qk = qk * cos + qk.roll(qk.shape[-1] // 2, -1) * sin
    v = mm(x, w.v).view(heads).transpose(1, 2)
    return qk[:, :q_heads], qk[:, q_heads:], v


def finish(norm: Norms, w: LayerWeights, h: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    """The layer's output rows: ``h`` plus the attention output ``att``
    ([B, heads, q, head_dim]) projected, then plus the MLP of that."""
    mm = torch.mm
    h = h + mm(att.transpose(1, 2).reshape(h.shape[0], -1), w.o)
    x = norm(h, w.post_norm, w.eps)
    out: torch.Tensor = h + mm(w.act(mm(x, w.gate)) * mm(x, w.up), w.down)
    return out


def _rms(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = h.dtype
    x = h if dtype == torch.float32 else h.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    out: torch.Tensor = weight * (x if dtype == torch.float32 else x.to(dtype))
    return out


def _rms_cpu(
    h: torch.Tensor, weight: torch.Tensor, eps: torch.Tensor, count: torch.Tensor
) -> torch.Tensor:
    """``_rms`` of float32 ``h`` on the CPU, as ATen computes it there
    (``eps`` and ``count``, the last dimension's size: 0-d float32 tensors)."""
    variance = (h * h).sum(-1, keepdim=True)
    variance.div_(count).add_(eps).rsqrt_()
    out: torch.Tensor = weight * (h * variance)
    return out
