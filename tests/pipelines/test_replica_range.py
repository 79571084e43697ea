"""``replicas = {min, max}``: a stage that scales, checked before start;
a fixed count stays an int; the TOML a config is written as loads back."""

from __future__ import annotations

import pytest

from omnix.pipelines.config import ReplicaRange
from omnix.pipelines.toml_out import pipeline_toml
from omnix.pipelines.validate import PipelineError, parse_pipeline

BASE = """
name = "p"
[outputs]
text = "s"
[[stages]]
name = "s"
"""
SCRIPTED = 'engine = { kind = "scripted" }\n'
VLLM = 'engine = { kind = "vllm", model = "m", gpu_memory_utilization = 0.4 }\n'


def load(line: str, engine: str = SCRIPTED):
    return parse_pipeline(BASE + engine + line + "\n")


def test_a_range_starts_with_min_and_a_count_stays_fixed():
    st = load("replicas = { min = 2, max = 4 }").stages[0]
    assert st.replicas == ReplicaRange(min=2, max=4)
    assert (st.min_replicas, st.max_replicas, st.scaling) == (2, 4, st.replicas)
    fixed = load("replicas = 3").stages[0]
    assert (fixed.min_replicas, fixed.max_replicas, fixed.scaling) == (3, 3, None)
    cfg = load("replicas = { max = 4, up_after = 5, down_after_s = 12.5 }")
    assert parse_pipeline(pipeline_toml(cfg)) == cfg


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("replicas = { min = 0, max = 2 }", "replicas.min must be >= 1, got 0"),
        ("replicas = { min = 3, max = 2 }", "replicas.max (2) must be >= replicas.min (3)"),
        ("replicas = { min = 1 }", "missing required field `max`"),
        ("replicas = { max = 2, up_after = 0 }", "replicas.up_after must be >= 1"),
        ("replicas = { max = 2, up_queue = 0 }", "replicas.up_queue must be >= 1"),
        ("replicas = { max = 2, down_after_s = -1 }", "replicas.down_after_s must be >= 0"),
        ("replicas = { max = 2, every = 1 }", "unknown field `every`"),
        ("replicas = 0", "replicas must be >= 1, got 0"),
    ],
)
def test_a_bad_range_is_refused_naming_the_stage(line, says):
    with pytest.raises(PipelineError) as err:
        load(line)
    assert says in str(err.value)


def test_vllm_replicas_may_not_overfill_a_shared_gpu():
    ok = load('replicas = { max = 4 }\ndevices = "0,1"', VLLM)  # 2 a GPU: 0.8
    assert ok.stages[0].max_replicas == 4
    with pytest.raises(PipelineError, match=r"puts 3 vLLM replicas on one GPU.*\(1.2 > 1\)"):
        load('replicas = { max = 5 }\ndevices = "0,1"', VLLM)
