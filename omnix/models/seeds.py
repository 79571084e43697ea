"""Deterministic sizes and seeds for the tiny random-weight models.

Owns: ``derived_seed`` (one 63-bit seed per model and tensor, independent
of build order, so equal seeds give byte-identical folders) and ``pad64``
(vocabulary sizes padded as the engines' kernels like them), and
``made_on`` and ``fill_random`` (a module built at a published size on
its own device and filled there in place, where the init of billions of
parameters takes seconds).  Does not own any model's shapes or files
(``build.py``, ``qwen3_omni.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from typing import Any


def derived_seed(seed: int, *names: str) -> int:
    """A 63-bit seed for one model / tensor, independent of build order."""
    digest = hashlib.sha256(":".join([str(seed), *names]).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def pad64(n: int) -> int:
    """``n`` rounded up to a multiple of 64."""
    return (n + 63) // 64 * 64


def fill_random(module: Any, seed: int, std: float | Callable[[str], float] = 0.02) -> None:
    """Every parameter of ``module`` in place: norms (vectors) one, biases
    zero, the rest N(0, std), ``std`` a number or a function of the
    parameter's name, from one generator on the parameters' device."""
    import torch

    gen: torch.Generator | None = None
    with torch.no_grad():
        for name, p in module.named_parameters():
            if gen is None:
                gen = torch.Generator(device=p.device).manual_seed(seed)
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, std(name) if callable(std) else std, generator=gen)


@contextlib.contextmanager
def made_on(device: str, dtype: str) -> Iterator[None]:
    """Modules built inside are made on ``device`` in ``dtype``.  The
    default dtype is torch's, process-wide: one thread builds at a time
    (each stage loads in a worker process of its own)."""
    import torch

    before = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(before)
