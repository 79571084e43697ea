"""Asking vLLM whether it takes a pipeline's vLLM stages, before any starts.

Owns ``vllm_problems``: for each vLLM stage, its model folder resolved and
its ``AsyncEngineArgs`` (``vllm_setup.engine_args``, exactly what the
worker will build) turned into vLLM's config by vLLM itself
(``create_engine_config``: what ``vllm serve`` does in its front end
before it starts an engine), so a value vLLM refuses is reported with
vLLM's own message, in one line, while nothing has started.  It runs in
the server's process: vLLM's platform code sets environment variables
for the engine it expects to start there, so the environment is put back
afterwards (workers inherit the server's).  Reads the model's config
files; loads no weights.  Does not own what a stage may say
(``omnix.pipelines.validate``) nor building the engine (``vllm_setup``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from omnix.engines.vllm_setup import engine_args
from omnix.models.paths import resolve_model, stay_offline
from omnix.pipelines.config import PipelineConfig, VllmArgs
from omnix.pipelines.vllm_args import one_line

log = logging.getLogger("omnix.engines.vllm_check")


def vllm_problems(pipeline: PipelineConfig) -> list[str]:
    """One line for each vLLM stage vLLM would not start, naming the stage."""
    problems = []
    for st in pipeline.stages:
        if not isinstance(st.engine, VllmArgs):
            continue
        try:
            folder = resolve_model(st.engine.model)
        except FileNotFoundError as exc:
            problems.append(f"stage {st.name!r}: {exc}")
            continue
        with _quiet_environment():
            try:
                args = engine_args(st.engine, folder)
                if "VLLM_LOGGING_LEVEL" not in os.environ:
                    # vLLM configures its logging as for an engine starting
                    # here; the notes it makes of the model are the worker's.
                    args.log_level = "ERROR"
                args.create_engine_config()
            except Exception as exc:  # vLLM's own refusal, whatever its type
                problems.append(f"stage {st.name!r}: vLLM refuses it: {one_line(exc)}")
    return problems


@contextlib.contextmanager
def _quiet_environment() -> Iterator[None]:
    """The process environment as it was, afterwards; the hub unreachable
    (a folder is read, never downloaded) and transformers' warnings about
    the model's config (the worker repeats them) kept out of the
    server's output meanwhile."""
    saved = dict(os.environ)
    stay_offline()
    quiet = logging.getLogger("transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        quiet.setLevel(level)
        os.environ.clear()
        os.environ.update(saved)
