"""Classifier-free guidance in one forward: a step's two denoiser calls as one batch.

Owns ``Guidance`` (a call's conditioning: per transformer argument, the
prompt's rows and the negative prompt's) and ``PairedDenoiser``, the
stand-in for a pipeline's transformer during one call
(``paired_guidance``).  diffusers' Wan pipelines, and Flux's text-to-image
with true CFG, call the transformer twice a step: the conditional call
(the prompt's embeddings, under the cache context ``"cond"``) and then
the unconditional one (the negative prompt's, ``"uncond"``), on the same
latents.  On the conditional call the stand-in runs the real transformer
once on 2B rows (the call's per-row inputs twice over, each conditioning
argument's prompt and negative rows stacked) and returns the first B;
the next call gets the other B without a forward if it is the matching
unconditional call: the negative conditioning, every other argument the
same (the same tensor, or an equal one: Flux makes its timestep tensor
and text ids anew for each call).  Any other call is computed as it
comes (``alone`` counts those), so an unexpected call order costs speed,
never a wrong output.

The stand-in sits outside the transformer: diffusers' cache hooks on the
transformer's modules, and a compiled transformer, see one forward of 2B
rows under the ``"cond"`` context each step.  The engine encodes the
prompts itself (``diffusers_prompts.py``), so the stand-in knows both
conditionings before the first step; the pipeline passes them to the
transformer unchanged.

Does not own which families batch (``omnix.pipelines.diffusion_cache``),
the prompt encoding, or the call (``diffusers_engine.py``,
``diffusers_batch.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, NamedTuple

#: Per-row tensor arguments of Wan's transformer the two calls share
#: (``timestep`` is (B,) or, for Wan 2.2's per-token timesteps, (B, tokens)).
WAN_SHARED_ROWS = ("hidden_states", "timestep", "encoder_hidden_states_image")
#: Flux's: its text and image ids are per token, not per row, and stay as given.
FLUX_SHARED_ROWS = ("hidden_states", "timestep", "guidance")
#: The pipeline attributes that hold a denoiser (Wan 2.2's two experts).
DENOISERS = ("transformer", "transformer_2")


class Guidance(NamedTuple):
    """A call's conditioning as its two guidance forwards receive it."""

    #: transformer argument -> (the prompt's rows, the negative prompt's)
    conditions: dict[str, tuple[Any, Any]]
    #: the per-row arguments both forwards take alike (doubled in the pair)
    shared_rows: tuple[str, ...]


class PairedDenoiser:
    """One transformer, its guidance forwards paired into one (see module doc).

    Everything but calls and ``cache_context`` is the transformer's own."""

    def __init__(self, module: Any, guidance: Guidance) -> None:
        import torch

        self.module = module
        self._guidance = guidance
        self._both = {k: torch.cat([p, n]) for k, (p, n) in guidance.conditions.items()}
        self._rows = next(iter(guidance.conditions.values()))[0].shape[0]
        self._context: str | None = None
        #: (the unconditional call's arguments, its output rows)
        self._pending: tuple[dict[str, Any], Any] | None = None
        #: forwards of 2B rows; calls answered without one; calls computed alone
        self.paired = 0
        self.answered = 0
        self.alone = 0

    def __getattr__(self, name: str) -> Any:
        if name == "module":  # not yet set (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.module, name)

    @contextlib.contextmanager
    def cache_context(self, name: str, **kwargs: Any) -> Iterator[None]:
        """The transformer's own cache context, its name noted for pairing."""
        self._context = name
        try:
            with self.module.cache_context(name, **kwargs):
                yield
        finally:
            self._context = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        pending, self._pending = self._pending, None
        if pending is not None and not args and self._answers(pending[0], kwargs):
            self.answered += 1
            return (pending[1],)
        if not args and self._conditional(kwargs):
            return self._pair(kwargs)
        self.alone += 1
        return self.module(*args, **kwargs)

    def _conditional(self, kwargs: dict[str, Any]) -> bool:
        if self._context not in (None, "cond"):
            return False
        if any(kwargs.get(k) is not p for k, (p, _) in self._guidance.conditions.items()):
            return False
        hidden: Any = kwargs.get("hidden_states")
        return kwargs.get("return_dict") is False and getattr(hidden, "shape", ())[:1] == (
            self._rows,
        )

    def _pair(self, kwargs: dict[str, Any]) -> Any:
        import torch

        both = dict(kwargs)
        for name in self._guidance.shared_rows:
            value = kwargs.get(name)
            if isinstance(value, torch.Tensor):
                both[name] = torch.cat([value, value])
        both.update(self._both)
        out = self.module(**both)[0]
        negative = {k: n for k, (_, n) in self._guidance.conditions.items()}
        self._pending = ({**kwargs, **negative}, out[self._rows :])
        self.paired += 1
        return (out[: self._rows],)

    def _answers(self, expected: dict[str, Any], kwargs: dict[str, Any]) -> bool:
        """Is this the unconditional call the paired forward computed?"""
        if self._context not in (None, "uncond") or kwargs.keys() != expected.keys():
            return False
        return all(_same(kwargs[k], v) for k, v in expected.items())


def _same(a: Any, b: Any) -> bool:
    """The same object, equal tensors (shape, dtype, device and values), or
    equal plain values (``None``, flags, a dict of them)."""
    if a is b:
        return True
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and a.device == b.device
            and bool(torch.equal(a, b))
        )
    try:
        return bool(a == b)
    except Exception:  # an argument whose == is not a plain answer
        return False


@contextlib.contextmanager
def paired_guidance(pipe: Any, guidance: Guidance) -> Iterator[list[PairedDenoiser]]:
    """For one call of ``pipe``: its transformer(s) behind ``PairedDenoiser``
    stand-ins, the real ones back afterwards whatever happens.  Written to
    the instance's ``__dict__``: ``DiffusionPipeline.__setattr__`` would
    record the stand-in in the pipeline's config."""
    stand_ins = [
        (name, PairedDenoiser(module, guidance))
        for name in DENOISERS
        if (module := pipe.__dict__.get(name)) is not None
    ]
    for name, stand_in in stand_ins:
        pipe.__dict__[name] = stand_in
    try:
        yield [s for _, s in stand_ins]
    finally:
        for name, stand_in in stand_ins:
            pipe.__dict__[name] = stand_in.module
