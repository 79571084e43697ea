"""What the guidance-batching tests count and compare: the rows of each
forward of a diffusion engine's real transformer (a forward pre-hook on
it), and outputs within a rounding step of each other."""

from __future__ import annotations

from typing import Any

import numpy as np

#: one of 255: the rounding of a value to uint8 tipped by float rounding
MAX_PIXEL_DIFF = 1


def within_a_rounding_step(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape
    assert int(np.abs(a - b).max()) <= MAX_PIXEL_DIFF, int(np.abs(a - b).max())


class Forwards:
    """The real transformer's forwards: the rows of each."""

    def __init__(self, engine: Any) -> None:
        self.rows: list[int] = []
        self._hook = engine.pipe.transformer.register_forward_pre_hook(self._seen, with_kwargs=True)

    def _seen(self, module, args, kwargs) -> None:
        self.rows.append(int(kwargs["hidden_states"].shape[0]))

    def take(self) -> list[int]:
        rows, self.rows = self.rows, []
        return rows

    def remove(self) -> None:
        self._hook.remove()
