"""A diffusion stage's ``cache``, ``compile`` and ``cfg_batch`` settings:
none by default, a table decodes into its kind's typed Struct with
diffusers' option names, and each bad setting is one problem naming what
works (the kinds, a kind's options, the kinds a pipeline family runs, the
families whose guidance omnix batches)."""

from __future__ import annotations

import json

import pytest

from omnix.pipelines.config import DiffusersArgs
from omnix.pipelines.diffusion_cache import (
    CACHE_KINDS,
    FirstBlockCache,
    PyramidAttentionBroadcast,
    TaylorSeerCache,
    cfg_batches,
    family_problem,
    parse_cache_spec,
    parse_cfg_batch_spec,
    parse_compile_spec,
)
from omnix.pipelines.validate import PipelineError, parse_pipeline


def _toml(engine_extra: str, model: str = "image") -> str:
    return (
        'name = "p"\n[[stages]]\nname = "image"\n'
        f'engine = {{ kind = "diffusers", model = "{model}"{engine_extra} }}\n'
        '[outputs]\nimage = "image"\n'
    )


def _problems(text: str) -> list[str]:
    with pytest.raises(PipelineError) as bad:
        parse_pipeline(text)
    return bad.value.problems


def test_no_cache_by_default_and_a_table_decodes_into_its_kind() -> None:
    eng = parse_pipeline(_toml("")).stages[0].engine
    assert isinstance(eng, DiffusersArgs) and eng.cache is None and eng.compile == "off"
    eng = parse_pipeline(_toml(', cache = { kind = "first_block", threshold = 0.1 }'))
    assert eng.stages[0].engine.cache == FirstBlockCache(threshold=0.1)
    text = (
        ', cache = { kind = "pyramid_attention_broadcast", '
        'spatial_attention_timestep_skip_range = [0, 1000] }, compile = "blocks"'
    )
    eng = parse_pipeline(_toml(text)).stages[0].engine
    assert eng.cache == PyramidAttentionBroadcast(spatial_attention_timestep_skip_range=(0, 1000))
    assert eng.compile == "blocks"


def test_an_unknown_kind_is_one_problem_naming_the_kinds() -> None:
    (line,) = _problems(_toml(', cache = { kind = "teacache" }'))
    assert "'teacache'" in line and "engine.cache.kind" in line
    assert all(kind in line for kind in CACHE_KINDS)
    assert "engine kinds" not in line  # the cache's kinds, not the engine's


def test_an_option_diffusers_does_not_have_is_one_problem_naming_the_options() -> None:
    (line,) = _problems(_toml(', cache = { kind = "first_block", treshold = 0.1 }'))
    assert "unknown field `treshold`" in line and "first_block: threshold" in line


def test_a_setting_out_of_range_and_compile_model_with_a_cache_are_refused() -> None:
    (line,) = _problems(_toml(', cache = { kind = "taylorseer", cache_interval = 0 }'))
    assert line == "stage 'image': engine.cache.cache_interval must be >= 1, got 0"
    (line,) = _problems(_toml(', cache = { kind = "first_block" }, compile = "model"'))
    assert "use compile = 'blocks'" in line


def test_a_family_the_hooks_do_not_run_on_names_where_they_do(tmp_path) -> None:
    folder = tmp_path / "sd"
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    (line,) = _problems(_toml(', cache = { kind = "first_block" }', model=str(folder)))
    assert line.startswith("stage 'image': engine.cache: ")
    assert "StableDiffusionPipeline" in line and "FluxPipeline" in line and "WanPipeline" in line
    parse_pipeline(_toml("", model=str(folder)))  # uncached it is fine
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    parse_pipeline(_toml(', cache = { kind = "first_block" }', model=str(folder)))
    (line,) = _problems(_toml(', cache = { kind = "taylorseer" }', model=str(folder)))
    assert line == (
        "stage 'image': engine.cache: taylorseer does not run on WanPipeline; the kinds that "
        "do: first_block, pyramid_attention_broadcast"
    )
    assert family_problem(TaylorSeerCache(), "FluxKontextPipeline") is None


def test_the_command_line_spec() -> None:
    assert parse_cache_spec("first_block") == (None, FirstBlockCache())
    assert parse_cache_spec("image:first_block,threshold=0.2") == (
        "image",
        FirstBlockCache(threshold=0.2),
    )
    stage, cache = parse_cache_spec(
        "pyramid_attention_broadcast,spatial_attention_timestep_skip_range=[0, 1000]"
    )
    assert stage is None and cache == PyramidAttentionBroadcast(
        spatial_attention_timestep_skip_range=(0, 1000)
    )
    assert parse_cache_spec("video:none") == ("video", None)
    with pytest.raises(ValueError, match=r"not a cache kind \(kinds: first_block"):
        parse_cache_spec("fbc")
    with pytest.raises(ValueError, match="unknown field `x`"):
        parse_cache_spec("first_block,x=1")


def test_cfg_batch_is_unset_by_default_and_on_where_omnix_batches_the_family() -> None:
    eng = parse_pipeline(_toml("")).stages[0].engine
    assert isinstance(eng, DiffusersArgs) and eng.cfg_batch is None
    assert parse_pipeline(_toml(", cfg_batch = false")).stages[0].engine.cfg_batch is False
    assert cfg_batches(None, "WanPipeline") and cfg_batches(None, "FluxPipeline")
    assert not cfg_batches(None, "StableDiffusion3Pipeline")
    assert not cfg_batches(False, "WanPipeline")


def test_cfg_batch_true_on_a_family_omnix_does_not_batch_is_one_problem(tmp_path) -> None:
    folder = tmp_path / "sd3"
    folder.mkdir()
    (folder / "model_index.json").write_text(
        json.dumps({"_class_name": "StableDiffusion3Pipeline"})
    )
    (line,) = _problems(_toml(", cfg_batch = true", model=str(folder)))
    assert line == (
        "stage 'image': engine.cfg_batch: omnix batches the two guidance forwards of "
        "FluxPipeline, WanPipeline only, not StableDiffusion3Pipeline's; remove cfg_batch "
        "(or set it false)"
    )
    parse_pipeline(_toml(", cfg_batch = false", model=str(folder)))
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    parse_pipeline(_toml(", cfg_batch = true", model=str(folder)))


def test_the_cfg_batch_command_line_spec() -> None:
    assert parse_cfg_batch_spec("on") == (None, True)
    assert parse_cfg_batch_spec("video:off") == ("video", False)
    with pytest.raises(ValueError, match=r"give \[STAGE:\]on or \[STAGE:\]off"):
        parse_cfg_batch_spec("video:maybe")


def test_cfg_batch_is_in_the_recorded_pipeline_and_its_toml() -> None:
    import msgspec

    from omnix.pipelines.config import PipelineConfig
    from omnix.pipelines.toml_out import pipeline_toml

    cfg = parse_pipeline(_toml(", cfg_batch = false"))
    # a trace records its pipeline as msgpack; --log-dir as pipeline.json
    again = msgspec.msgpack.decode(msgspec.msgpack.encode(cfg), type=PipelineConfig)
    assert again.stages[0].engine.cfg_batch is False
    assert parse_pipeline(pipeline_toml(cfg)).stages[0].engine.cfg_batch is False
    assert "cfg_batch" not in pipeline_toml(parse_pipeline(_toml("")))  # unset stays unset


def test_the_compile_command_line_spec() -> None:
    assert parse_compile_spec("blocks") == (None, "blocks")
    assert parse_compile_spec("video:off") == ("video", "off")
    assert parse_compile_spec("image:MODEL") == ("image", "model")
    with pytest.raises(
        ValueError, match=r"give \[STAGE:\]off, \[STAGE:\]blocks or \[STAGE:\]model"
    ):
        parse_compile_spec("image:fast")
