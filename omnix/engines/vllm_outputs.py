"""A vLLM stage's outputs: vLLM's DELTA outputs as omnix's values.

Owns: ``codec_frames`` (codec codes of a delta, whole frames only, the rest
carried to the next delta), ``token_logprobs`` (vLLM's per-step logprobs as
``TokenLogprob``s, floored as vLLM's OpenAI server floors them) and
``finish_reason`` (vLLM's finish reason in omnix's words).

Does not own the request's loop (``vllm_loop.py``) nor what a finish
means for the request (the loop: an ``error`` or an ``abort`` vLLM made on
its own ends it with an exception).
"""

from __future__ import annotations

from typing import Any

from omnix.engines.vllm_setup import VocabLayout
from omnix.events.types import TokenLogprob

#: vLLM's OpenAI server writes no logprob below this (JSON has no -inf).
_MIN_LOGPROB = -9999.0


def codec_frames(
    carry: list[int], ids: tuple[int, ...], layout: VocabLayout
) -> tuple[tuple[int, ...], list[int]]:
    """Codes of ``ids`` (layout offsets removed, EOS dropped), whole
    frames only; the rest is carried to the next delta."""
    lo = layout.codec_offset
    hi = lo + layout.codec_size
    codes = carry + [t - lo for t in ids if lo <= t < hi]
    whole = len(codes) // layout.num_codebooks * layout.num_codebooks
    return tuple(codes[:whole]), codes[whole:]


def token_logprobs(steps: Any, ids: tuple[int, ...], top: int) -> tuple[TokenLogprob, ...]:
    """vLLM's per-step logprobs of a delta (a dict from token id to
    ``Logprob`` per generated token) as ``TokenLogprob``s: the sampled
    token's text and logprob, and the ``top`` most likely alternatives by
    rank."""
    if not steps:
        return ()
    out = []
    for tid, step in zip(ids, steps, strict=False):
        chosen = step.get(tid)
        alts = sorted(
            ((lp.rank if lp.rank is not None else 1 << 30, t, lp) for t, lp in step.items()),
            key=lambda x: (x[0], x[1]),
        )[:top]
        out.append(
            TokenLogprob(
                token=_token_text(chosen, tid),
                logprob=max(float(chosen.logprob), _MIN_LOGPROB) if chosen is not None else 0.0,
                top=tuple(
                    (_token_text(lp, t), max(float(lp.logprob), _MIN_LOGPROB)) for _, t, lp in alts
                ),
            )
        )
    return tuple(out)


def _token_text(lp: Any, tid: int) -> str:
    text = getattr(lp, "decoded_token", None)
    return text if isinstance(text, str) else f"token_id:{tid}"


def finish_reason(reason: str | None) -> str:
    if reason == "abort":
        return "aborted"
    return reason or "stop"
