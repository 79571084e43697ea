"""The pipeline a benchmark's flags name: loaded, and its models made ready.

Owns: turning ``--pipeline NAME|PATH`` into a ``PipelineConfig`` (a bad
name or file is the command line's one-line ``UsageError``, not a
traceback) and ``--model-dir`` into the tiny models a pipeline needs
(built where missing; ``OMNIX_MODEL_DIR`` exported for the workers and
servers a bench starts).  Does not own loading nor building
(``omnix.pipelines.validate``, ``omnix.models.prepare``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from omnix.usage import UsageError

if TYPE_CHECKING:
    from omnix.pipelines.config import PipelineConfig


def load_pipeline_arg(name_or_path: str) -> PipelineConfig:
    """A built-in pipeline by name or a pipeline file; a bad one as a ``UsageError``."""
    from omnix.pipelines.validate import PipelineError, load_pipeline

    try:
        return load_pipeline(name_or_path)
    except PipelineError as exc:
        raise UsageError(str(exc)) from None


def prepare_pipeline_models(pipeline: PipelineConfig, model_dir: str | None) -> None:
    """Builds what ``pipeline`` needs and is missing (seconds) under
    ``model_dir`` (default: ``$OMNIX_MODEL_DIR`` or the cache), and
    exports ``OMNIX_MODEL_DIR``, which workers and subprocesses inherit."""
    from omnix.models.prepare import prepare_models

    prepare_models(pipeline, Path(model_dir) if model_dir else None)
