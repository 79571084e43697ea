"""The application factory: what it builds around an ``Omni``."""

from __future__ import annotations

from omnix.api import Omni
from omnix.http.app import _make_telemetry
from omnix.pipelines.config import CodecArgs, PipelineConfig, StageConfig
from omnix.testing.serving import InProcessRuntime


def test_metrics_count_audio_at_the_pipeline_codec_rate() -> None:
    # /metrics' audio seconds and real-time factor divide samples by the
    # rate of the stage that makes the pipeline's audio, not a default.
    codec = StageConfig(name="code2wav", engine=CodecArgs(model="c", sample_rate=16000))
    pipeline = PipelineConfig(name="p16k", stages=(codec,), outputs={"audio": "code2wav"})
    tel = _make_telemetry(Omni(pipeline, runtime_factory=InProcessRuntime))
    try:
        assert tel.pipeline == "p16k" and tel.projection.sample_rate == 16000
    finally:
        tel.shutdown()


TEXT = """
name = "text-only"
[[stages]]
name = "thinker"
engine = { kind = "scripted", chunks_per_piece = 3 }
[outputs]
text = "thinker"
"""


def test_openapi_publishes_only_what_the_pipeline_answers() -> None:
    from omnix.http.openapi import OpenApi
    from omnix.pipelines.validate import parse_pipeline

    api = OpenApi(parse_pipeline(TEXT), max_batch=7, metrics=False)
    doc = api.document()
    assert "/v1/chat/completions" in doc["paths"] and "/version" in doc["paths"]
    for path in ("/v1/audio/speech", "/v1/images/generations", "/metrics"):
        assert path not in doc["paths"]
    req = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert "audio" not in req  # no audio output: the field is refused
    assert req["modalities"]["anyOf"][0]["items"] == {"enum": ["text"]}
    assert req["model"]["enum"] == ["", "text-only"]
    batch = req["messages"]["anyOf"][1]
    assert batch["minItems"] == 1 and batch["maxItems"] == 7
    assert "security" not in doc  # no API key on this server


def test_x_request_id_names_every_route_s_requests() -> None:
    from omnix.http.audio.protocol import SpeechRequest
    from omnix.http.audio.speech import speech_plan
    from omnix.http.common.plan import CLIENT_REQUEST_ID, PlanContext
    from omnix.http.images.plan import image_plan
    from omnix.http.images.protocol import ImageRequest
    from omnix.pipelines.validate import parse_pipeline

    image = parse_pipeline(
        """
        name = "img"
        [[stages]]
        name = "image"
        engine = { kind = "scripted", output_modality = "image" }
        [outputs]
        image = "image"
        """
    )
    served = PlanContext(image, new_request_id=lambda: "fresh", new_seed=lambda: 1)
    token = CLIENT_REQUEST_ID.set("mine")
    try:
        plan = image_plan(ImageRequest(prompt="x", n=3), served)
        assert plan.request_ids == ("mine-0", "mine-1", "mine-2")
        plan = speech_plan(SpeechRequest(input="x"), served)
        assert plan.request_ids == ("mine",)
    finally:
        CLIENT_REQUEST_ID.reset(token)
    assert image_plan(ImageRequest(prompt="x"), served).request_ids == ("fresh",)
