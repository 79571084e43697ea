"""A vLLM stage's ``engine_args``: vLLM's own engine arguments by vLLM's
names, checked against the installed vLLM when the pipeline is validated
(an unknown key or a wrong type names the stage and the key), meeting the
stage's typed fields (omnix's defaults) in one place where the table wins;
and a stage's ``devices``, placed replica by replica."""

from __future__ import annotations

import logging

import pytest

from omnix.pipelines.config import StageConfig, TalkerArgs, VllmArgs
from omnix.pipelines.devices import device_problems, parse_devices, replica_devices
from omnix.pipelines.validate import PipelineError, parse_pipeline
from omnix.pipelines.vllm_args import convert, engine_actions, vllm_kwargs
from omnix.stages.errors import RuntimeConfigError
from omnix.stages.gpus import gpu_plan

pytest.importorskip("vllm")


def _stage(engine_args: str = "", more: str = "", stage: str = "") -> str:
    """A one-stage pipeline: ``stage`` lines in its table, ``more`` lines
    in its engine's, ``engine_args`` lines in its engine_args table."""
    table = f"[stages.engine.engine_args]\n{engine_args}" if engine_args else ""
    return f"""
name = "p"
[outputs]
text = "thinker"
[[stages]]
name = "thinker"
{stage}
[stages.engine]
kind = "vllm"
model = "thinker"
{more}
{table}
"""


@pytest.mark.parametrize(
    ("key", "value", "want"),
    [
        ("max_model_len", 256, 256),
        ("max_model_len", "8k", 8000),  # vLLM's human-readable numbers
        ("max_model_len", "auto", -1),
        ("dtype", "bfloat16", "bfloat16"),
        ("enforce_eager", False, False),
        ("gpu_memory_utilization", 1, 1.0),
        ("tensor_parallel_size", 2, 2),
        ("served_model_name", "a", ["a"]),  # nargs +: one or several
        ("served_model_name", ["a", "b"], ["a", "b"]),
        ("limit_mm_per_prompt", {"image": 2}, {"image": 2}),  # a JSON-valued flag
        ("kv_cache_memory_bytes", "1G", 1 << 30),
        ("quantization", "fp8", "fp8"),
    ],
)
def test_a_value_is_what_vllms_command_line_gives(key, value, want):
    assert convert(key, value) == want


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ("max_modl_len = 256", "engine_args.max_modl_len is not one of vLLM"),
        ("max_modl_len = 256", "did you mean max_model_len?"),
        ("model = '/x'", "engine_args.model is not taken here: the stage's engine.model"),
        ("dtype = 'fp7'", "engine_args.dtype = 'fp7': 'fp7' is not one of auto, bfloat16"),
        ("dtype = 16", "--dtype takes text, not the number 16"),
        ("enforce_eager = 'yes'", "--enforce-eager is a switch: give true or false"),
        ("tensor_parallel_size = 'two'", "engine_args.tensor_parallel_size = 'two'"),
        ("tensor_parallel_size = 1.5", "engine_args.tensor_parallel_size = 1.5"),
        ("max_num_seqs = [1, 2]", "--max-num-seqs takes one value, not a list"),
        ("seed = true", "--seed takes a value, not true"),
    ],
)
def test_a_bad_key_or_value_names_the_stage_and_the_key(table, says):
    with pytest.raises(PipelineError) as err:
        parse_pipeline(_stage(table))
    (problem,) = err.value.problems
    assert problem.startswith("stage 'thinker': engine_args.")
    assert says in problem


def test_talker_context_keeps_its_capture_and_piecewise_graphs():
    bad = (
        "worker_extension_cls = 'x.Y'\nhf_overrides = { architectures = ['X'] }\n"
        "compilation_config = { cudagraph_mode = 'FULL_AND_PIECEWISE' }"
    )
    with pytest.raises(PipelineError) as err:
        parse_pipeline(_stage(bad, "talker_context = true"))
    problems = err.value.problems
    assert any("engine_args.worker_extension_cls" in p for p in problems)
    assert any("engine_args.hf_overrides" in p for p in problems)
    assert any("cudagraph_mode 'FULL_AND_PIECEWISE'" in p for p in problems)
    # compiled, with piecewise graphs: the capture survives both
    fine = "enforce_eager = false\ncompilation_config = { cudagraph_mode = 'PIECEWISE' }"
    parse_pipeline(_stage(fine, "talker_context = true"))


def test_typed_fields_are_defaults_the_table_overrides():
    eng = (
        parse_pipeline(_stage("max_model_len = 256\ndtype = 'bfloat16'\nseed = 3")).stages[0].engine
    )
    assert isinstance(eng, VllmArgs)
    kw = vllm_kwargs(eng)
    assert kw["max_model_len"] == 256 and kw["dtype"] == "bfloat16" and kw["seed"] == 3
    assert kw["max_num_seqs"] == 32 and kw["enforce_eager"] is True  # omnix's defaults
    # 0 (and dtype auto) leave a field to vLLM's own default
    left = vllm_kwargs(
        VllmArgs(model="m", dtype="auto", max_model_len=0, max_num_seqs=0, gpu_memory_utilization=0)
    )
    assert not {"dtype", "max_model_len", "max_num_seqs", "gpu_memory_utilization"} & set(left)


def test_vllms_engine_args_take_omnix_defaults_then_the_stage(tmp_path):
    from omnix.engines.vllm_setup import engine_args

    folder = tmp_path / "m"
    folder.mkdir()
    args = VllmArgs(
        model=str(folder),
        kv_cache_gib=0.25,
        engine_args={"kv_cache_memory_bytes": "64M", "disable_log_stats": False, "seed": 9},
    )
    ea = engine_args(args, folder)
    assert ea.kv_cache_memory_bytes == 64 << 20 and ea.disable_log_stats is False  # the table wins
    assert ea.seed == 9 and ea.max_model_len == 512  # the stage's own, then omnix's typed default
    assert ea.structured_outputs_config.backend == "guidance"  # omnix's default, kept


def test_invalid_typed_fields():
    with pytest.raises(PipelineError) as err:
        parse_pipeline(_stage(more="max_model_len = -1\ngpu_memory_utilization = 1.5"))
    assert any("max_model_len must be >= 0" in p for p in err.value.problems)
    assert any("gpu_memory_utilization must be from 0" in p for p in err.value.problems)


def test_a_chat_template_that_cannot_be_opened():
    with pytest.raises(PipelineError, match=r"chat_template: .*looks like a file path"):
        parse_pipeline(_stage(more="chat_template = '/no/such/template.jinja'"))


def test_every_flag_vllm_serve_has_is_known():
    names = {s for a in engine_actions().values() for s in a.option_strings}
    for flag in (
        "--dtype", "--max-model-len", "--tensor-parallel-size", "--pipeline-parallel-size",
        "--quantization", "--gpu-memory-utilization", "--enforce-eager",
        "--enable-prefix-caching", "--max-num-seqs", "--max-num-batched-tokens",
        "--trust-remote-code", "--seed", "--served-model-name",
    ):  # fmt: skip
        assert flag in names


# -- devices --------------------------------------------------------------------------------


def test_devices_read_and_spread_over_replicas():
    assert parse_devices("") == () and parse_devices(" 0, 2 ") == (0, 2)
    for bad in ("a", "0;1", "0,,1", "-1", "0,0"):
        with pytest.raises(ValueError, match="devices"):
            parse_devices(bad)
    tp2 = parse_pipeline(
        _stage("tensor_parallel_size = 2", stage='replicas = 2\ndevices = "0,1,2,3"')
    ).stages[0]
    assert [replica_devices(tp2, r) for r in range(2)] == [(0, 1), (2, 3)]
    shared = StageConfig(
        name="talker", engine=VllmArgs(model="m"), replicas=3, devices="5,6"
    )  # more replicas than devices: they share, round robin
    assert [replica_devices(shared, r) for r in range(3)] == [(5,), (6,), (5,)]


def test_device_problems():
    with pytest.raises(PipelineError, match="cannot be split into replicas of 2"):
        parse_pipeline(_stage("tensor_parallel_size = 2", stage='devices = "0,1,2"'))
    with pytest.raises(PipelineError, match="not a list of GPU numbers"):
        parse_pipeline(_stage(stage='devices = "gpu0"'))
    on2 = StageConfig(name="talker", engine=TalkerArgs(model="omni", device="cuda:1"), devices="2")
    (problem,) = device_problems(on2)
    assert "renumbered from 0" in problem


PLACED = """
name = "placed"
[[stages]]
name = "thinker"
devices = "0,1"
engine = { kind = "vllm", model = "thinker", engine_args = { tensor_parallel_size = 2 } }
[[stages]]
name = "code2wav"
devices = "2"
replicas = 2
engine = { kind = "codec", model = "code2wav" }
[[edges]]
source = "thinker"
target = "code2wav"
[outputs]
text = "thinker"
audio = "code2wav"
"""


def test_gpu_plan_maps_devices_through_what_the_server_sees(caplog):
    cfg = parse_pipeline(PLACED)
    every = {"thinker", "code2wav"}
    want = {"thinker/0": "0,1", "code2wav/0": "2", "code2wav/1": "2"}
    assert gpu_plan(cfg, every, ["0", "1", "2"]) == want
    # the server's own CUDA_VISIBLE_DEVICES=4,5,6: a stage's device 0 is GPU 4
    assert gpu_plan(cfg, every, ["4", "5", "6"]) == {
        "thinker/0": "4,5",
        "code2wav/0": "6",
        "code2wav/1": "6",
    }
    assert gpu_plan(cfg, {"thinker"}, ["0", "1", "2"]) == {"thinker/0": "0,1"}  # spawned only
    with pytest.raises(
        RuntimeConfigError,
        match=r"stage 'code2wav': devices '2' names GPU 2, but this server sees 2",
    ):
        gpu_plan(cfg, every, ["0", "1"])
    with caplog.at_level(logging.INFO, logger="omnix.runtime"):
        assert gpu_plan(cfg, every, []) == {}  # no GPU: ignored, and said so
    assert "stage 'thinker': devices '0,1' ignored: this machine has no GPU" in caplog.text


def test_a_spawned_worker_sees_its_devices():
    from omnix.stages.spawner import Spawner

    sp = Spawner(
        python="python", worker_token=None, worker_env={}, worker_cpus={}, cpu_plan=None,
        worker_gpus={"thinker/1": "2,3"}, forward_worker_output=False,
        on_exit=lambda p: None, closed=lambda: False,
    )  # fmt: skip
    assert sp.spawn_env("thinker", 1)["CUDA_VISIBLE_DEVICES"] == "2,3"
