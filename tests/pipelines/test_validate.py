"""Each invalid pipeline config fails before anything starts, with its own
clear error; each invalid request override is refused by name."""

from __future__ import annotations

import pytest

from omnix.events.types import RequestSpec, StageParams
from omnix.pipelines.plan import PipelineGraph, RequestError, merge_params, validate_request
from omnix.pipelines.registry import builtin_names
from omnix.pipelines.validate import PipelineError, load_pipeline, parse_pipeline

GOOD = """
name = "p"
[[stages]]
name = "a"
engine = { kind = "scripted" }
[[stages]]
name = "b"
engine = { kind = "scripted", output_modality = "audio" }
[[edges]]
source = "a"
target = "b"
[outputs]
text = "a"
audio = "b"
"""


def test_a_good_config_loads():
    cfg = parse_pipeline(GOOD)
    assert [s.name for s in cfg.stages] == ["a", "b"]


@pytest.mark.parametrize("name", ["tiny-text", "tiny-omni", "tiny-tts", "tiny-image", "tiny-asr"])
def test_every_builtin_pipeline_validates(name):
    assert name in builtin_names()
    assert load_pipeline(name).name == name


BAD = {
    "unknown edge target": (
        GOOD.replace('target = "b"', 'target = "zz"'),
        "unknown target stage 'zz'",
    ),
    "unknown edge source": (
        GOOD.replace('source = "a"', 'source = "zz"'),
        "unknown source stage 'zz'",
    ),
    "cycle": (
        GOOD + '[[edges]]\nsource = "b"\ntarget = "a"\n',
        "cycle: a -> b -> a",
    ),
    "final modality nobody produces": (
        GOOD.replace('audio = "b"', 'image = "b"'),
        "stage 'b' produces audio, not image",
    ),
    "output from an unknown stage": (
        GOOD.replace('audio = "b"', 'audio = "nope"'),
        "outputs.audio = 'nope': no such stage",
    ),
    "unknown engine kind": (
        GOOD.replace('kind = "scripted" }', 'kind = "tensorrt" }'),
        "engine kinds: scripted, vllm, diffusers, codec",
    ),
    "unknown stage field": (
        GOOD.replace('name = "a"\n', 'name = "a"\nreplicaz = 2\n'),
        "unknown field `replicaz`",
    ),
    "unknown engine argument": (
        GOOD.replace('kind = "scripted" }', 'kind = "scripted", chunkz = 3 }'),
        "unknown field `chunkz`",
    ),
    "duplicate stage": (
        GOOD.replace('name = "b"', 'name = "a"'),
        "stage 'a' is declared twice",
    ),
    "streaming fan-in": (
        GOOD.replace(
            "[outputs]",
            '[[stages]]\nname = "c"\nengine = { kind = "scripted" }\n'
            '[[edges]]\nsource = "c"\ntarget = "b"\nforward = "chunk"\n[outputs]',
        ),
        "fan-in waits for every input to finish",
    ),
    "no outputs": (GOOD.split("[outputs]")[0], "no [outputs]"),
    "zero replicas": (
        GOOD.replace('name = "a"\n', 'name = "a"\nreplicas = 0\n'),
        "replicas must be >= 1",
    ),
    "not toml": ("name = [", "not valid TOML"),
    "negative max_retries": (
        GOOD.replace('name = "a"\n', 'name = "a"\nmax_retries = -1\n'),
        "max_retries must be >= 0",
    ),
}


def test_retry_defaults_to_the_engines_ability_to_continue():
    def stage(engine: str, extra: str = "") -> bool:
        cfg = parse_pipeline(
            f'name = "p"\n[[stages]]\nname = "a"\nengine = {engine}\n{extra}[outputs]\nimage = "a"\n'
            if "diffusers" in engine
            else f'name = "p"\n[[stages]]\nname = "a"\nengine = {engine}\n{extra}[outputs]\ntext = "a"\n'
        )
        st = cfg.stage("a")
        assert st.max_retries == 2
        return st.retries

    assert stage('{ kind = "scripted" }')
    assert stage('{ kind = "vllm", model = "m" }')
    assert not stage('{ kind = "diffusers", model = "m" }')
    assert stage('{ kind = "diffusers", model = "m" }', "retry = true\n")
    assert not stage('{ kind = "scripted" }', "retry = false\n")


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_invalid_config_gets_its_own_clear_error(case):
    text, expected = BAD[case]
    with pytest.raises(PipelineError) as err:
        parse_pipeline(text)
    assert expected in str(err.value), str(err.value)


def test_unknown_pipeline_name_lists_the_builtins():
    with pytest.raises(PipelineError, match="built-in: tiny-asr, tiny-image, tiny-omni"):
        load_pipeline("tiny-nothing")


def graph():
    return PipelineGraph(parse_pipeline(GOOD))


@pytest.mark.parametrize(
    ("spec", "param", "text"),
    [
        (RequestSpec(prompt="x", outputs=("image",)), "modalities", "cannot produce 'image'"),
        (RequestSpec(prompt=""), "messages", "no input"),
        (
            RequestSpec(prompt="x", stage_params={"zz": StageParams()}),
            "sampling_params_list",
            "unknown stage 'zz'",
        ),
        (
            RequestSpec(prompt="x", stage_params={"a": StageParams(temperature=9.0)}),
            "temperature",
            "between 0 and 2",
        ),
        (
            RequestSpec(prompt="x", stage_params={"a": StageParams(max_tokens=0)}),
            "max_tokens",
            "positive",
        ),
        (
            RequestSpec(prompt="x", stage_params={"a": StageParams(width=13)}),
            "width",
            "multiple of 8",
        ),
        (RequestSpec(prompt="x", deadline_ms=-1), "deadline_ms", ">= 0"),
    ],
)
def test_bad_request_overrides_are_refused_by_name(spec, param, text):
    with pytest.raises(RequestError) as err:
        validate_request(graph(), spec)
    assert err.value.param == param and text in err.value.message


def test_request_overrides_win_over_stage_defaults():
    merged = merge_params(StageParams(temperature=0.5, max_tokens=10), StageParams(max_tokens=3))
    assert merged == StageParams(temperature=0.5, max_tokens=3)


def test_needed_stages_follow_the_requested_outputs():
    g = graph()
    assert g.needed_stages(("text",)) == ("a",)
    assert g.needed_stages(("audio",)) == ("a", "b")


MEDIA_ON_A = GOOD.replace(
    'engine = { kind = "scripted" }',
    'engine = { kind = "scripted" }\nmedia = { audio = true, image = true }',
    1,
)


def test_a_source_stage_declares_the_media_the_pipeline_takes():
    assert parse_pipeline(GOOD).input_media is None
    media = parse_pipeline(MEDIA_ON_A).input_media
    assert media is not None and media.audio and media.image and media.sample_rate == 16_000
    assert load_pipeline("tiny-omni").input_media is not None
    assert load_pipeline("tiny-text").input_media is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            GOOD.replace(
                'output_modality = "audio" }',
                'output_modality = "audio" }\nmedia = { audio = true }',
            ),
            "only a source stage",
        ),
        (
            MEDIA_ON_A.replace("image = true }", "image = true, max_pixels = 0 }"),
            "max_pixels must be positive",
        ),
        (
            MEDIA_ON_A.replace(
                'engine = { kind = "scripted" }',
                'engine = { kind = "vllm", model = "m", input_mode = "token_ids" }',
            ),
            'needs input_mode = "chat"',
        ),
        (
            MEDIA_ON_A.replace(
                'engine = { kind = "scripted" }',
                'engine = { kind = "vllm", model = "m", limit_mm_per_prompt = { audio = 1, image = 0 } }',
            ),
            "max_image_parts = 1 but the engine's limit_mm_per_prompt.image is 0",
        ),
    ],
)
def test_bad_media_declarations_are_refused_by_name(text, says):
    with pytest.raises(PipelineError, match=says):
        parse_pipeline(text)
