"""What a model folder is served as (``omnix serve PATH``), and the TOML
``omnix pipelines show --model PATH`` prints for it, which loads back to
the very same pipeline.  The tiny folders ``omnix models init`` builds
stand for each kind: a Qwen2 chat model, a diffusers FluxPipeline, the
Qwen3-Omni thinker alone and the whole Qwen3-Omni."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omnix.pipelines.config import (
    Code2WavArgs,
    DiffusersArgs,
    DuplexArgs,
    TalkerArgs,
    VllmArgs,
    engine_kind,
)
from omnix.pipelines.folder import KINDS, FolderError, derive_pipeline
from omnix.pipelines.registry import builtin_names
from omnix.pipelines.toml_out import pipeline_toml
from omnix.pipelines.validate import load_pipeline, parse_pipeline

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]


def test_a_chat_model_is_one_vllm_stage_left_to_vllm(tiny_models):
    cfg = derive_pipeline(tiny_models.thinker, gpu=False)
    (stage,) = cfg.stages
    assert cfg.name == "thinker" and dict(cfg.outputs) == {"text": "llm"}
    eng = stage.engine
    assert isinstance(eng, VllmArgs) and eng.model == str(Path(tiny_models.thinker).resolve())
    # vllm serve's choices: vLLM's context, batch and memory share; the
    # checkpoint's own dtype; eager on CPU (inductor would compile first) ...
    assert (eng.max_model_len, eng.max_num_seqs, eng.gpu_memory_utilization) == (0, 0, 0)
    assert eng.dtype == "float32" and eng.enforce_eager and not eng.talker_context
    # ... and CUDA graphs on a GPU
    assert not derive_pipeline(tiny_models.thinker, gpu=True).stages[0].engine.enforce_eager


def test_a_diffusers_folder_is_one_text_to_image_stage(tiny_models):
    cfg = derive_pipeline(tiny_models.image, gpu=False)
    (stage,) = cfg.stages
    assert dict(cfg.outputs) == {"image": "image"} and isinstance(stage.engine, DiffusersArgs)
    # its VAE's sample size is the model's own resolution
    assert stage.engine.default_size == 64 and stage.engine.dtype == "float32"
    assert derive_pipeline(tiny_models.image, gpu=True).stages[0].engine.dtype == "bfloat16"


def test_a_qwen3_omni_thinker_folder_is_the_thinker_alone(tiny_models):
    cfg = derive_pipeline(tiny_models.omni_thinker, gpu=False)
    (stage,) = cfg.stages
    assert stage.name == "thinker" and dict(cfg.outputs) == {"text": "thinker"}
    assert isinstance(stage.engine, VllmArgs) and not stage.engine.talker_context
    # text, audio, image and video in
    m = stage.media
    assert m is not None and m.audio and m.image and m.video
    assert stage.engine.limit_mm_per_prompt == {"audio": 1, "image": 1, "video": 1}


def test_a_qwen3_omni_folder_reads_hermes_calls_and_thinks_only_when_it_does_not_speak(tiny_models):
    # As vLLM's recipes serve Qwen3-Omni: hermes-style calls with auto tool
    # choice; Qwen3's reasoning parser on the Thinking checkpoint (the
    # thinker alone), whose answers start with their reasoning.
    alone = derive_pipeline(tiny_models.omni_thinker, gpu=False).stages[0].engine
    whole = derive_pipeline(tiny_models.omni, gpu=False).stages[0].engine
    assert isinstance(alone, VllmArgs) and isinstance(whole, VllmArgs)
    assert (alone.tool_call_parser, alone.enable_auto_tool_choice) == ("hermes", True)
    assert (whole.tool_call_parser, whole.enable_auto_tool_choice) == ("hermes", True)
    assert (alone.reasoning_parser, whole.reasoning_parser) == ("qwen3", "")


def test_a_whole_qwen3_omni_folder_is_tiny_omnis_pipeline(tiny_models):
    cfg = derive_pipeline(tiny_models.omni, gpu=False)
    ref = load_pipeline("tiny-omni")
    # The same graph as the built-in: stages, engines, edges, outputs, media.
    assert [(s.name, engine_kind(s.engine)) for s in cfg.stages] == [
        (s.name, engine_kind(s.engine)) for s in ref.stages
    ]
    assert cfg.edges == ref.edges and dict(cfg.outputs) == dict(ref.outputs)
    thinker, talker, code2wav = cfg.stages
    # the same kinds of media (tiny-omni's video limits fit its 2,048 positions)
    m, tm = thinker.media, ref.stages[0].media
    assert m is not None and tm is not None
    assert (m.audio, m.image, m.video) == (tm.audio, tm.image, tm.video)
    assert isinstance(thinker.engine, VllmArgs) and thinker.engine.talker_context
    assert thinker.engine.enforce_eager  # on CPU: a fast start
    # the capture survives vLLM's compilation and graphs: a GPU keeps them
    assert not derive_pipeline(tiny_models.omni, gpu=True).stages[0].engine.enforce_eager
    assert thinker.engine.limit_mm_per_prompt == ref.stages[0].engine.limit_mm_per_prompt
    folder = str(Path(tiny_models.omni).resolve())
    assert isinstance(talker.engine, TalkerArgs) and talker.engine.model == folder
    assert isinstance(code2wav.engine, Code2WavArgs) and code2wav.engine.model == folder
    assert (code2wav.engine.chunk_frames, code2wav.engine.context_frames) == (25, 25)


def test_a_diffusers_video_folder_is_tiny_videos_stage(tiny_models):
    cfg = derive_pipeline(tiny_models.video, gpu=False)
    ref = load_pipeline("tiny-video")
    (stage,) = cfg.stages
    (ref_stage,) = ref.stages
    assert dict(cfg.outputs) == dict(ref.outputs) == {"video": "video"}
    eng = stage.engine
    assert isinstance(eng, DiffusersArgs) and eng.output_modality == "video"
    assert eng.model == str(Path(tiny_models.video).resolve())
    # a first frame in (Wan has image-to-video), a job restarted after a kill -9
    assert stage.media is not None and stage.media.image and stage.media.max_image_parts == 1
    assert stage.retry == ref_stage.retry is True
    assert "WanPipeline on diffusers (text, a first frame in, video out)" in cfg.description


def test_a_moshi_folder_is_one_duplex_stage_that_validates_and_round_trips(tmp_path):
    from omnix.models.moshi import write_folder
    from omnix.pipelines.validate import validate_pipeline

    folder = tmp_path / "moshi"
    write_folder(folder, seed=0)
    cfg = derive_pipeline(folder, gpu=False)
    validate_pipeline(cfg)
    (stage,) = cfg.stages
    assert stage.name == "duplex" and dict(cfg.outputs) == {"audio": "duplex"}
    eng = stage.engine
    assert isinstance(eng, DuplexArgs) and eng.model == str(folder.resolve())
    assert (eng.dtype, eng.tick_ms) == ("float32", 80.0)  # real time
    assert "Moshi full duplex" in cfg.description
    assert parse_pipeline(pipeline_toml(cfg), "toml", cfg.name) == cfg


def test_every_derived_and_built_in_pipeline_round_trips_through_toml(tiny_models):
    derived = [
        derive_pipeline(p, gpu=g)
        for p in (
            tiny_models.thinker,
            tiny_models.image,
            tiny_models.video,
            tiny_models.omni_thinker,
            tiny_models.omni,
        )
        for g in (False, True)
    ]
    for cfg in derived + [load_pipeline(n) for n in builtin_names()]:
        text = pipeline_toml(cfg, header="a header\non two lines")
        assert text.startswith("# a header\n# on two lines\n")
        assert parse_pipeline(text, "toml", cfg.name) == cfg, text


def test_toml_writes_engine_args_tables_and_odd_keys(tiny_models, tmp_path):
    cfg = derive_pipeline(tiny_models.thinker, gpu=False)
    st = cfg.stages[0]
    import msgspec

    eng = msgspec.structs.replace(
        st.engine,
        engine_args={
            "max_model_len": 256,
            "served_model_name": ["a", "b"],
            "hf_overrides": {"x.y": 1},
        },
        chat_template='{{ "quote\\" and \\u00e9" }}\n',
    )
    cfg = msgspec.structs.replace(
        cfg, stages=(msgspec.structs.replace(st, engine=eng, devices="0"),)
    )
    text = pipeline_toml(cfg)
    assert "[stages.engine.engine_args]" in text and 'devices = "0"' in text
    assert parse_pipeline(text, "toml") == cfg


def test_pipelines_show_model_prints_what_pipeline_file_serves(tiny_models, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "omnix.cli", "pipelines", "show", "--model", str(tiny_models.omni)],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=True,
    ).stdout  # fmt: skip
    assert out.startswith(f"# The pipeline `omnix serve {tiny_models.omni}` serves")
    saved = tmp_path / "omni.toml"
    saved.write_text(out)
    assert load_pipeline(saved) == derive_pipeline(tiny_models.omni, gpu=False)


# -- what is not served -------------------------------------------------------------------


def _folder(tmp_path: Path, name: str, **files: object) -> Path:
    d = tmp_path / name
    d.mkdir()
    for fname, content in files.items():
        (d / fname.replace("_json", ".json")).write_text(
            content if isinstance(content, str) else json.dumps(content)
        )
    return d


def test_a_missing_path_a_file_and_a_folder_without_a_config(tmp_path):
    with pytest.raises(FolderError, match="no such folder: give a local model folder"):
        derive_pipeline(tmp_path / "nope", gpu=False)
    (tmp_path / "x.toml").write_text("")
    with pytest.raises(FolderError, match=r"is a file, not a model folder.*--pipeline FILE"):
        derive_pipeline(tmp_path / "x.toml", gpu=False)
    with pytest.raises(FolderError, match=r"has no config.json .* and no model_index.json"):
        derive_pipeline(_folder(tmp_path, "empty"), gpu=False)
    with pytest.raises(FolderError, match=r"config.json: cannot read it as JSON"):
        derive_pipeline(_folder(tmp_path, "bad", config_json="{nope"), gpu=False)


def test_an_architecture_nothing_here_serves_lists_what_is(tmp_path):
    d = _folder(tmp_path, "m", config_json={"architectures": ["Qwen2ForCausalLMM"]})
    with pytest.raises(FolderError) as err:
        derive_pipeline(d, gpu=False)
    msg = str(err.value)
    assert "architecture Qwen2ForCausalLMM is not one omnix serves" in msg
    assert "near: Qwen2ForCausalLM" in msg
    for kind in KINDS:  # every row of the table is named
        assert kind.serves in msg
    assert "\n" not in msg


def test_a_diffusers_pipeline_omnix_does_not_run(tmp_path):
    d = _folder(tmp_path, "video", model_index_json={"_class_name": "StableVideoDiffusionPipeline"})
    with pytest.raises(FolderError, match="a diffusers StableVideoDiffusionPipeline is not one"):
        derive_pipeline(d, gpu=False)


def test_a_config_that_names_no_architecture(tmp_path):
    d = _folder(tmp_path, "codec", config_json={"omnix_model": "codec"})
    with pytest.raises(FolderError, match="names no architecture"):
        derive_pipeline(d, gpu=False)


def test_any_architecture_vllm_serves_is_a_text_stage(tmp_path):
    d = _folder(
        tmp_path, "llama", config_json={"architectures": ["LlamaForCausalLM"], "dtype": "bfloat16"}
    )
    cfg = derive_pipeline(d, gpu=True)
    (stage,) = cfg.stages
    assert cfg.name == "llama" and isinstance(stage.engine, VllmArgs)
    assert stage.engine.dtype == "bfloat16" and not stage.engine.enforce_eager
    assert "LlamaForCausalLM on vLLM" in cfg.description


# -- a Hugging Face id, from the local Hugging Face cache ---------------------------------------


def _show(model: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``omnix pipelines show --model MODEL`` as a user runs it, offline, with
    no Hugging Face setting of this machine's but ``env``'s."""
    mine = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    return subprocess.run(
        [sys.executable, "-m", "omnix.cli", "pipelines", "show", "--model", model],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
        env={**mine, "HF_HUB_OFFLINE": "1", **env},
    )  # fmt: skip


def test_a_hugging_face_id_is_its_snapshot_in_the_hub_cache(tiny_models, tmp_path):
    from tests.hf_layout import hub_cache

    snapshot = hub_cache(tmp_path / "hub", "tiny-org/omni", tiny_models.omni)
    shown = _show("tiny-org/omni", HF_HUB_CACHE=str(tmp_path / "hub"))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("# The pipeline `omnix serve tiny-org/omni` serves")
    saved = tmp_path / "omni.toml"
    saved.write_text(shown.stdout)
    cfg = load_pipeline(saved)
    # What the snapshot folder is served as, named after the id as vLLM names its model.
    assert cfg.name == "tiny-org/omni"
    assert cfg.stages == derive_pipeline(snapshot, gpu=False).stages
    assert {str(s.engine.model) for s in cfg.stages} == {str(snapshot.resolve())}
    # HF_HOME is honoured as the hub itself honours it (its hub/ folder).
    home = _show("tiny-org/omni", HF_HOME=str(tmp_path))
    assert home.returncode == 0, home.stderr
    assert home.stdout == shown.stdout


def test_an_id_not_in_the_cache_says_in_one_line_what_to_download(tmp_path):
    shown = _show("tiny-org/absent", HF_HUB_CACHE=str(tmp_path / "hub"))
    assert shown.returncode != 0 and shown.stdout == ""
    (line,) = shown.stderr.strip().splitlines()
    assert "tiny-org/absent is neither a local folder nor a model in the Hugging Face cache" in line
    assert str(tmp_path / "hub") in line and "`hf download tiny-org/absent`" in line


def test_a_local_folder_wins_over_an_id_of_the_same_spelling(tiny_models, tmp_path):
    from omnix.models.paths import resolve_model
    from omnix.pipelines.hf_cache import is_hf_id

    assert is_hf_id("Qwen/Qwen3-Omni-30B-A3B-Instruct") and is_hf_id("tiny-org/omni")
    assert not any(map(is_hf_id, ["/models/x", "./x", "~/x", "a/b/c", "a--b/c", "x", "a/.."]))
    (tmp_path / "tiny-org").mkdir()
    (tmp_path / "tiny-org" / "omni").symlink_to(tiny_models.omni)
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert resolve_model("tiny-org/omni") == Path("tiny-org/omni")
        assert derive_pipeline("tiny-org/omni", gpu=False).name == "omni"  # the folder's name
    finally:
        os.chdir(here)
