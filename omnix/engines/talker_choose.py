"""Choosing codes from logits with static shapes, so a CUDA graph can hold it.

Owns: ``RowSampling`` (a batch's per-row temperature, top-k, top-p and
repetition penalty as tensors) and the two choosers a graphed talker step
runs on the device: ``choose_first`` (the codec head's logits: suppressed
ids, the repetition penalty over each row's earlier codes, then greedy or
sampled) and ``choose_residual`` (a code predictor group: greedy or sampled
with the reference's fixed top-k / top-p).

Sampling draws no random numbers here: each sampled row brings noise drawn
before the step from its request's own generator (exponential variates,
``noise``), and the draw is ``argmax(p / noise)``, which picks index ``i``
with probability ``p[i]`` (the exponential race; the Gumbel-max trick in
another form).  So the graph stays static while every request keeps its
own seeded stream.  Greedy rows (temperature 0) ignore their noise and
equal ``argmax`` of the same logits the eager path reads.

Does not own the eager path's draws (``talker_model._sample``, a
multinomial with the request's generator), nor which rows are active.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowSampling:
    """Per-row sampling of a batch (views of static buffers, ``[B]`` each)."""

    temperature: torch.Tensor  # float32; <= 0 means greedy
    top_k: torch.Tensor  # int64; <= 0 means all
    top_p: torch.Tensor  # float32; 1.0 means all
    penalty: torch.Tensor  # float32; 1.0 means none


def filtered_probs(
    scores: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """transformers' sampling warpers, row by row with per-row values:
    temperature, top-k, top-p (the smallest set whose mass exceeds it),
    softmax.  ``scores`` [B, V] float32."""
    vocab = scores.shape[-1]
    scores = scores / temperature.clamp_min(1e-5)[:, None]
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, torch.full_like(top_k, vocab))
    ranked = torch.sort(scores, dim=-1, descending=True).values
    kth = ranked.gather(1, (k - 1)[:, None])
    scores = scores.masked_fill(scores < kth, float("-inf"))
    ascending, order = torch.sort(scores, dim=-1, descending=False)
    mass = ascending.softmax(-1).cumsum(-1)
    remove = mass <= (1 - top_p)[:, None]
    remove[:, -1] = False
    scores = scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    return scores.softmax(-1)


def _pick(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    noise: torch.Tensor,
) -> torch.Tensor:
    greedy = torch.argmax(logits, dim=-1)
    probs = filtered_probs(logits, temperature, top_k, top_p)
    sampled = torch.argmax(probs / noise, dim=-1)
    return torch.where(temperature > 0, sampled, greedy)


def choose_first(
    logits: torch.Tensor,
    seen: torch.Tensor,
    suppressed: torch.Tensor,
    rows: RowSampling,
    noise: torch.Tensor,
) -> torch.Tensor:
    """First-group codes ([B]) from the codec head's ``logits`` ([B, V]):
    ``suppressed`` ids ([V] bool) never, each row's ``seen`` codes ([B, V]
    bool) penalised as ``_choose`` does, then greedy or sampled."""
    logits = logits.float().masked_fill(suppressed[None], float("-inf"))
    penalty = rows.penalty[:, None]
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    logits = torch.where(seen, penalised, logits)
    return _pick(logits, rows.temperature, rows.top_k, rows.top_p, noise)


def choose_residual(
    logits: torch.Tensor, rows: RowSampling, top_k: int, top_p: float, noise: torch.Tensor
) -> torch.Tensor:
    """A residual group's codes ([B]): greedy, or sampled with the row's
    temperature and the predictor's fixed ``top_k`` / ``top_p``.

    With the top-k fixed, the choice looks at the ``top_k`` best logits
    only (``torch.topk``, sorted): top-p over them, then the exponential
    race with each kept code's own noise.  That is ``filtered_probs`` over
    the whole vocabulary without its two sorts of it (a seventh of a
    predictor frame's GPU time), and picks the same code for the same
    noise, but where logits tie at the k-th value: there the whole
    vocabulary's top-k keeps every tied code, this one the first ``top_k``."""
    logits = logits.float()
    greedy = torch.argmax(logits, dim=-1)
    if not 0 < top_k < logits.shape[-1]:
        k = torch.full_like(rows.top_k, top_k)
        p = torch.full_like(rows.top_p, top_p)
        return _pick(logits, rows.temperature, k, p, noise)
    values, index = torch.topk(logits, top_k, dim=-1)
    scores = values / rows.temperature.clamp_min(1e-5)[:, None]
    # transformers' top-p: drop the least likely codes while the mass of
    # each and all below it is <= 1 - top_p (the most likely always stays).
    below = scores.softmax(-1).flip(-1).cumsum(-1).flip(-1)
    remove = below <= 1 - top_p
    remove[:, 0] = False
    probs = scores.masked_fill(remove, float("-inf")).softmax(-1)
    pick = torch.argmax(probs / noise.gather(1, index), dim=-1)
    sampled = index.gather(1, pick[:, None])[:, 0]
    return torch.where(rows.temperature > 0, sampled, greedy)
