"""A diffusion stage's denoiser as its settings make it: step cache, compilation, CFG batching.

Owns ``Denoiser``: turning a stage's ``cache`` (``omnix.pipelines.
diffusion_cache``) into diffusers' own hook config and enabling it on the
pipeline's transformer (``CacheMixin.enable_cache``), compiling the
transformer (``compile``: ``compile_repeated_blocks`` or the whole
module), whether its guidance forwards run as one batch (``cfg_batch``,
on the family loaded), and, before every pipeline call, the hooks' state
reset and the pipeline whose timestep a timestep-ranged cache reads;
each call runs inside ``call_context``: the cache context a pipeline
does not name itself, and the paired guidance (``diffusers_cfg.py``).
The hooks sit on the transformer, which the sibling pipelines of edits
and image-to-video share (``from_pipe``), so every task of the stage
runs cached.

Why a reset per call: diffusers resets the hooks' state only at the end
of a call that returns, and a call stopped by an abort (or an error)
leaves the last step's cached residuals for the next call, of another
batch size or seed.

``compile_problem``: the one line for a compile mode on a device that
cannot compile (checked when the engine starts, before loading).

Does not own which kinds a family takes or the settings' checks
(``omnix.pipelines.diffusion_cache``), nor making calls (``diffusers_batch.py``).
"""

from __future__ import annotations

import contextlib
from typing import Any

from omnix.engines.diffusers_cfg import Guidance, paired_guidance
from omnix.pipelines.diffusion_cache import (
    CompileMode,
    FirstBlockCache,
    PyramidAttentionBroadcast,
    StepCache,
    TaylorSeerCache,
    cache_kind,
    cfg_batch_problem,
    cfg_batches,
)

#: Pipelines that name their denoiser calls to the hooks themselves
#: (``transformer.cache_context("cond")``, ``"uncond"``), in diffusers 0.42.
#: Flux's image-to-image, inpaint and Kontext classes do not: the engine
#: names their one forward a step ``"cond"`` (first-block cache keeps its
#: state per name and refuses a call without one).
NAMES_ITS_CALLS = frozenset({"FluxPipeline", "WanPipeline", "WanImageToVideoPipeline"})


def compile_problem(mode: CompileMode, device: str) -> str | None:
    """The one line for ``compile`` on a device where torch.compile cannot
    run (inductor makes Triton kernels on CUDA and C++ on a CPU); None
    when it can, or with compile off."""
    if mode == "off":
        return None
    import importlib.util
    import os
    import shutil

    kind = device.partition(":")[0]
    fix = "set compile = 'off' (or --compile off)"
    if kind == "cuda":
        if importlib.util.find_spec("triton") is None:
            return f"engine.compile = {mode!r}: torch.compile on {device} needs Triton; {fix}"
        return None
    if kind == "cpu":
        compilers = (os.environ.get("CXX", ""), "g++", "c++", "clang++")
        if not any(c and shutil.which(c) for c in compilers):
            return (
                f"engine.compile = {mode!r}: torch.compile on the CPU needs a C++ compiler "
                f"(g++, clang++ or $CXX) on PATH; {fix}"
            )
        return None
    return f"engine.compile = {mode!r}: omnix compiles the denoiser on cuda and cpu, not {device}; {fix}"


class Denoiser:
    """The stage's cache, compile and CFG batching settings on one loaded pipeline."""

    def __init__(
        self, cache: StepCache | None, compile_mode: CompileMode, cfg_batch: bool | None = None
    ) -> None:
        self.cache = cache
        self.compile_mode = compile_mode
        self.cfg_batch = cfg_batch
        #: the setting on the family loaded (``apply``)
        self.batch_guidance = False
        self._running: Any = None
        self._transformer: Any = None

    def apply(self, pipe: Any, pipeline_name: str) -> None:
        """Enable the cache, then compile (in the pipeline thread, after load).
        Raises ``ValueError`` when the pipeline has no transformer the hooks
        take, or is no family whose guidance omnix batches and ``cfg_batch``
        says true."""
        refused = cfg_batch_problem(self.cfg_batch, pipeline_name)
        if refused is not None:
            raise ValueError(refused)
        self.batch_guidance = cfg_batches(self.cfg_batch, pipeline_name)
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

    def before_call(self, pipe: Any, kwargs: dict[str, Any]) -> None:
        """In the pipeline thread, before ``pipe`` runs: a clean cache state.
        Raises ``ValueError`` for true classifier-free guidance on a
        pipeline that does not tell the hooks its two forwards apart."""
        self._running = pipe
        if self._transformer is None:
            return
        self._transformer._reset_stateful_cache()
        name = type(pipe).__name__
        if name not in NAMES_ITS_CALLS and kwargs.get("negative_prompt") is not None:
            raise ValueError(
                f"negative_prompt is not honoured with engine.cache on a "
                f"{name}: it runs the guidance forward without telling the cache "
                "it from the other; send the edit without it, or serve the stage uncached"
            )

    def call_context(
        self, pipe: Any, guidance: Guidance | None = None
    ) -> contextlib.AbstractContextManager[Any]:
        """What a call of ``pipe`` runs inside: a named cache context where
        the pipeline sets none itself; with guidance batching on and the
        call's conditioning given (``diffusers_prompts.call_guidance``),
        its transformer behind the paired stand-in."""
        stack = contextlib.ExitStack()
        if self._transformer is not None and type(pipe).__name__ not in NAMES_ITS_CALLS:
            stack.enter_context(self._transformer.cache_context("cond"))
        if self.batch_guidance and guidance is not None:
            stack.enter_context(paired_guidance(pipe, guidance))
        return stack

    def settings(self) -> dict[str, str]:
        """The settings as ``EngineInfo.settings`` reports them (after ``apply``)."""
        cache = self.cache
        return {
            "cache": cache_kind(cache) if cache is not None else "none",
            "compile": self.compile_mode,
            "cfg_batch": "on" if self.batch_guidance else "off",
        }

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
