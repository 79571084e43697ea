"""Deterministic sizes and seeds for the tiny random-weight models.

Owns: ``derived_seed`` (one 63-bit seed per model and tensor, independent
of build order, so equal seeds give byte-identical folders) and ``pad64``
(vocabulary sizes padded as the engines' kernels like them).  Does not own
any model's shapes or files (``build.py``, ``qwen3_omni.py``).
"""

from __future__ import annotations

import hashlib


def derived_seed(seed: int, *names: str) -> int:
    """A 63-bit seed for one model / tensor, independent of build order."""
    digest = hashlib.sha256(":".join([str(seed), *names]).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def pad64(n: int) -> int:
    """``n`` rounded up to a multiple of 64."""
    return (n + 63) // 64 * 64
