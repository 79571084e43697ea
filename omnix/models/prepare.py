"""Make the tiny models a pipeline refers to available to its workers.

Owns: ``prepare_models``, shared by ``omnix serve``, ``omnix generate`` and
the replay capture: find which built-in tiny models the pipeline's stages
name, build the missing ones (once, with a progress bar) and export
``OMNIX_MODEL_DIR`` so spawned workers resolve them there.  Building is
``build.py``'s; path resolution is ``paths.py``'s.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from omnix.pipelines.config import PipelineConfig, engine_model
from omnix.usage import UsageError

log = logging.getLogger(__name__)


def _tiny_models_needed(pipeline: PipelineConfig) -> list[str]:
    """The tiny model names the pipeline's stages refer to."""
    from omnix.models.paths import TINY_MODELS

    names = []
    for st in pipeline.stages:
        model = engine_model(st.engine)
        if model is not None and model in TINY_MODELS and model not in names:
            names.append(model)
    return names


def prepare_models(
    pipeline: PipelineConfig, model_dir: Path | None, build: bool = True
) -> Path | None:
    """Build the tiny models ``pipeline`` needs if missing; export
    ``OMNIX_MODEL_DIR`` so the workers resolve them there.  Returns the
    model dir (None when the pipeline needs no tiny model)."""
    names = _tiny_models_needed(pipeline)
    if not names:
        return None
    from omnix.models.paths import default_model_dir

    root = (model_dir or default_model_dir()).expanduser().resolve()
    os.environ["OMNIX_MODEL_DIR"] = str(root)
    from omnix.models.build import ensure_models, missing_models

    todo = missing_models(root, None, names)
    if todo:
        if not build:
            raise UsageError(
                f"tiny models {', '.join(todo)} are missing in {root}: run `omnix models init --dir {root}`"
            )
        log.info("building tiny models %s in %s (once)", ", ".join(todo), root)
        t0 = time.perf_counter()
        try:
            ensure_models(root, names=names, progress=sys.stderr.isatty())
        except OSError as exc:
            raise UsageError(
                f"cannot build the tiny models in {root} ({exc.strerror or exc}): "
                "give a folder you can write with --model-dir (or OMNIX_MODEL_DIR)"
            ) from None
        log.info("built %s in %.1f s", ", ".join(todo), time.perf_counter() - t0)
    return root
