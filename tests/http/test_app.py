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
