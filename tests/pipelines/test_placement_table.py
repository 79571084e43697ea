"""A stage's ``placement`` table (``--placement ray``): what it decodes to,
what one replica asks of a node, and the errors validation gives."""

from __future__ import annotations

import pytest

from omnix.pipelines.config import Placement
from omnix.pipelines.placement import replica_demand
from omnix.pipelines.validate import PipelineError, parse_pipeline

BASE = """
name = "p"
[[stages]]
name = "thinker"
engine = {{ kind = "vllm", model = "thinker"{engine} }}
{placement}
[outputs]
text = "thinker"
"""


def parse(placement: str, engine: str = ""):
    return parse_pipeline(BASE.format(placement=placement, engine=engine))


def problems(placement: str, engine: str = "") -> str:
    with pytest.raises(PipelineError) as exc:
        parse(placement, engine)
    return str(exc.value)


def test_the_table_and_what_one_replica_reserves():
    cfg = parse(
        'placement = { num_cpus = 2, num_gpus = 1, resources = { tts_node = 1 }, strategy = "SPREAD" }'
    )
    st = cfg.stages[0]
    assert st.placement == Placement(
        num_cpus=2, num_gpus=1, resources={"tts_node": 1}, strategy="SPREAD"
    )
    assert replica_demand(st) == {"CPU": 2, "GPU": 1, "tts_node": 1}
    # No table: one CPU anywhere, packed, restarted without end.
    plain = parse("").stages[0]
    assert plain.placement is None and replica_demand(plain) == {"CPU": 1.0}


@pytest.mark.parametrize(
    ("table", "engine", "said"),
    [
        ("placement = { num_cpus = -1 }", "", "placement.num_cpus must be >= 0, got -1"),
        ("placement = { resources = { GPU = 1 } }", "", "one of Ray's own resources"),
        ("placement = { resources = { lab = -2 } }", "", "placement.resources.lab must be >= 0"),
        ("placement = { num_gpus = 1.5 }", "", "not a fraction of several"),
        ("placement = { max_restarts = -2 }", "", "max_restarts must be -1"),
        (
            "placement = { num_gpus = 1 }",
            ", engine_args = { tensor_parallel_size = 2 }",
            "takes 2 GPUs: give num_gpus = 2",
        ),
    ],
)
def test_bad_tables_are_named(table, engine, said):
    text = problems(table, engine)
    assert "stage 'thinker': placement" in text and said in text, text


def test_an_unknown_key_or_strategy_is_refused_by_the_decoder():
    assert "nodes" in problems("placement = { nodes = 2 }")
    assert "STRICT_PACK" in problems('placement = { strategy = "STRICT_PACK" }')
