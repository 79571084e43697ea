"""What ``omnix bench failover`` kills, for both of its backends.

Owns: the bench's one-stage text pipeline (``bench_pipeline``: the tiny
thinker on vLLM, greedy, or ``--pipeline``'s one text stage), its prompt
and its progress lines on stderr.  The local backend (``failover.py``)
and the replicated log's (``failover_nats.py``) both run it.
"""

from __future__ import annotations

import argparse
import sys

import msgspec

from omnix.bench.pipeline_arg import load_pipeline_arg
from omnix.events.types import StageParams
from omnix.pipelines.config import PipelineConfig, StageConfig, VllmArgs
from omnix.pipelines.validate import validate_pipeline
from omnix.usage import UsageError

PROMPT = "Tell me a story about a cat."


def log_line(msg: str) -> None:
    print(f"[bench failover] {msg}", file=sys.stderr, flush=True)


def bench_pipeline(args: argparse.Namespace, max_tokens: int, replicas: int = 2) -> PipelineConfig:
    """The one text stage the bench kills: the tiny thinker on vLLM
    (greedy), or ``--pipeline``'s, with ``replicas`` and retry."""
    if args.pipeline is None:
        stage = StageConfig(
            name="thinker",
            engine=VllmArgs(model="thinker", kv_cache_gib=0.25),
            sampling=StageParams(temperature=0.0, max_tokens=max_tokens),
        )
        cfg = PipelineConfig(name="bench-failover", stages=(stage,), outputs={"text": "thinker"})
    else:
        cfg = load_pipeline_arg(args.pipeline)
        if len(cfg.stages) != 1 or list(cfg.outputs) != ["text"]:
            raise UsageError(
                f"--pipeline {args.pipeline}: give a pipeline of one stage with a text output "
                f"(it has stages {', '.join(st.name for st in cfg.stages)} and outputs "
                f"{', '.join(cfg.outputs)})"
            )
        stage = cfg.stages[0]
        sampling = msgspec.structs.replace(stage.sampling, max_tokens=max_tokens)
        stage = msgspec.structs.replace(stage, sampling=sampling)
    stage = msgspec.structs.replace(stage, replicas=replicas, retry=True if replicas > 1 else None)
    name = cfg.name if replicas > 1 else f"{cfg.name}-restart"
    cfg = msgspec.structs.replace(cfg, name=name, stages=(stage,))
    validate_pipeline(cfg)
    return cfg
