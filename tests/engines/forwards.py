"""What the guidance-batching tests count: the rows of each forward of a
diffusion engine's real transformer (a forward pre-hook on it)."""

from __future__ import annotations

from typing import Any


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
