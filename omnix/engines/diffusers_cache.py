"""A diffusion stage's denoiser as its settings make it: step cache, compilation.

Owns ``Denoiser``: turning a stage's ``cache`` (``omnix.pipelines.
diffusion_cache``) into diffusers' own hook config and enabling it on the
pipeline's transformer (``CacheMixin.enable_cache``), compiling the
transformer (``compile``: ``compile_repeated_blocks`` or the whole
module), and, before every pipeline call, the hooks' state reset and the
pipeline whose timestep a timestep-ranged cache reads.  The hooks sit on
the transformer, which the sibling pipelines of edits and image-to-video
share (``from_pipe``), so every task of the stage runs cached.

Why a reset per call: diffusers resets the hooks' state only at the end
of a call that returns, and a call stopped by an abort (or an error)
leaves the last step's cached residuals for the next call, of another
batch size or seed.

Does not own which kinds a family takes or the settings' checks
(``omnix.pipelines.diffusion_cache``), nor making calls (``diffusers_batch.py``).
"""

from __future__ import annotations

from typing import Any

from omnix.pipelines.diffusion_cache import (
    CompileMode,
    FirstBlockCache,
    PyramidAttentionBroadcast,
    StepCache,
    TaylorSeerCache,
    cache_kind,
)


class Denoiser:
    """The stage's cache and compile settings on one loaded pipeline."""

    def __init__(self, cache: StepCache | None, compile_mode: CompileMode) -> None:
        self.cache = cache
        self.compile_mode = compile_mode
        self._running: Any = None
        self._transformer: Any = None

    def apply(self, pipe: Any, pipeline_name: str) -> None:
        """Enable the cache, then compile (in the pipeline thread, after load).
        Raises ``ValueError`` when the pipeline has no transformer the hooks take."""
        transformer = getattr(pipe, "transformer", None)
        if self.cache is not None:
            if transformer is None or not hasattr(transformer, "enable_cache"):
                raise ValueError(
                    f"engine.cache: {pipeline_name}'s denoiser takes no diffusers cache hooks "
                    f"({type(transformer).__name__}); remove the cache table"
                )
            transformer.enable_cache(self._config())
            self._transformer = transformer
        if self.compile_mode == "blocks":
            if transformer is None or not getattr(transformer, "_repeated_blocks", None):
                raise ValueError(
                    f"engine.compile = 'blocks': {pipeline_name}'s denoiser names no repeated "
                    "blocks to compile; use compile = 'model' (without a cache) or 'off'"
                )
            transformer.compile_repeated_blocks()
        elif self.compile_mode == "model":
            denoiser = transformer if transformer is not None else getattr(pipe, "unet", None)
            if denoiser is None:
                raise ValueError(f"engine.compile: {pipeline_name} has no denoiser module")
            denoiser.compile()

    def before_call(self, pipe: Any) -> None:
        """In the pipeline thread, before ``pipe`` runs: a clean cache state."""
        self._running = pipe
        if self._transformer is not None:
            self._transformer._reset_stateful_cache()

    def _timestep(self) -> Any:
        return self._running.current_timestep

    def _config(self) -> Any:
        import torch
        from diffusers.hooks import (
            FirstBlockCacheConfig,
            PyramidAttentionBroadcastConfig,
            TaylorSeerCacheConfig,
        )

        c = self.cache
        match c:
            case FirstBlockCache():
                return FirstBlockCacheConfig(threshold=c.threshold)
            case TaylorSeerCache():
                return TaylorSeerCacheConfig(
                    cache_interval=c.cache_interval,
                    disable_cache_before_step=c.disable_cache_before_step,
                    disable_cache_after_step=c.disable_cache_after_step,
                    max_order=c.max_order,
                    taylor_factors_dtype=getattr(torch, c.taylor_factors_dtype),
                    use_lite_mode=c.use_lite_mode,
                )
            case PyramidAttentionBroadcast():
                return PyramidAttentionBroadcastConfig(
                    spatial_attention_block_skip_range=c.spatial_attention_block_skip_range,
                    temporal_attention_block_skip_range=c.temporal_attention_block_skip_range,
                    cross_attention_block_skip_range=c.cross_attention_block_skip_range,
                    spatial_attention_timestep_skip_range=c.spatial_attention_timestep_skip_range,
                    temporal_attention_timestep_skip_range=c.temporal_attention_timestep_skip_range,
                    cross_attention_timestep_skip_range=c.cross_attention_timestep_skip_range,
                    current_timestep_callback=self._timestep,
                )
        raise ValueError(f"unknown cache {c!r}")


def describe(cache: StepCache | None, compile_mode: CompileMode) -> dict[str, str]:
    """The settings as ``EngineInfo.settings`` reports them."""
    out = {"cache": cache_kind(cache) if cache is not None else "none", "compile": compile_mode}
    return out
