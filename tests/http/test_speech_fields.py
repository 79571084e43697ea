"""What the model card says ``POST /v1/audio/speech`` takes (``SpeechFields``)
is what the route takes: on each Qwen3-TTS variant, a body with the fields
marked required is planned, one without a required field or with a
refused one is a 400 naming it, and ``language`` takes the languages
listed; on a pipeline without a Qwen3-TTS talker every field is refused.
Planned without an engine: the checkpoint's ``config.json`` is all the
card and the checks read (and on Base its speaker encoder, which makes
the clip's speaker vector the request records)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path

import msgspec
import numpy as np
import pytest
import soundfile as sf

from omnix.http.audio.cloning import Cloning
from omnix.http.audio.protocol import SpeechFields, SpeechRequest
from omnix.http.audio.speech import speech_plan
from omnix.http.audio.speech_tts import speech_fields
from omnix.http.common.plan import PlanContext
from omnix.http.core.errors import ApiError
from omnix.pipelines.folder import derive_pipeline
from omnix.pipelines.validate import parse_pipeline

LANGUAGES = {"english": 2050, "chinese": 2055, "beijing_dialect": 2074, "german": 2053}


def _folder(tmp_path: Path, variant: str, base: Path) -> Path:
    """A Qwen3-TTS folder as far as the card reads it: its ``config.json``
    (Base: and the speaker encoder of the tiny Base folder ``base``)."""
    folder = tmp_path / variant
    folder.mkdir()
    speaker_encoder = {"sample_rate": 24000}
    if variant == "base":
        speaker_encoder = json.loads((base / "config.json").read_text())["speaker_encoder_config"]
        (folder / "model.safetensors").symlink_to(base / "model.safetensors")
    config = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tts_model_type": variant,
        "talker_config": {
            "spk_id": {"Ryan": 3001, "Aiden": 3000} if variant == "custom_voice" else {},
            "codec_language_id": LANGUAGES,
        },
        "speaker_encoder_config": speaker_encoder,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _served(folder: Path) -> PlanContext:
    pipeline = derive_pipeline(folder, gpu=False)
    return PlanContext(pipeline, new_request_id=lambda: "req-1", new_seed=lambda: 7)


def _wav_url(rate: int) -> str:
    buf = io.BytesIO()
    t = np.arange(rate // 2) / rate
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 220 * t), rate, subtype="PCM_16", format="WAV")
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


#: A value for each field the card describes.
VALUES = {
    "instructions": "A warm, low voice.",
    "ref_audio": _wav_url(24000),
    "ref_text": "What the clip says.",
}


def _plan(served: PlanContext, **fields: object) -> None:
    """The speech route's plan of a body of ``fields``, its clip resolved
    first as the route resolves it."""
    body = msgspec.convert({"input": "Hello.", **fields}, SpeechRequest)
    cloning = Cloning(served, None, frozenset())
    try:
        reference = asyncio.run(cloning.reference(body))
    finally:
        cloning.close()
    speech_plan(body, served, reference=reference)


def _refused(served: PlanContext, param: str, **fields: object) -> None:
    with pytest.raises(ApiError) as err:
        _plan(served, **fields)
    assert err.value.status == 400 and err.value.param == param, err.value


def _planned(served: PlanContext, **fields: object) -> None:
    _plan(served, **fields)


WANT = {
    "custom_voice": SpeechFields(
        task_type="CustomVoice",
        instructions="optional",
        languages=["auto", "chinese", "english", "german"],
    ),
    "voice_design": SpeechFields(
        task_type="VoiceDesign",
        instructions="required",
        languages=["auto", "chinese", "english", "german"],
    ),
    "base": SpeechFields(
        task_type="Base",
        languages=["auto", "chinese", "english", "german"],
        ref_audio="required",
        ref_audio_rate=24000,
        ref_text="optional",
    ),
}


@pytest.mark.parametrize("variant", list(WANT))
def test_the_card_says_what_each_variant_takes_as_the_route_checks_it(
    tmp_path, tiny_models, variant
):
    served = _served(_folder(tmp_path, variant, Path(tiny_models.qwen3_tts_base)))
    fields = speech_fields(served)
    assert fields == WANT[variant]
    takes = {f: getattr(fields, f) for f in VALUES}
    required = {f: VALUES[f] for f, how in takes.items() if how == "required"}
    everything = {f: VALUES[f] for f, how in takes.items() if how != "refused"}
    _planned(served, task_type=fields.task_type, **required)
    _planned(served, task_type=fields.task_type, **everything)
    for lang in fields.languages:
        _planned(served, language=lang, **required)
    _refused(served, "language", language="klingon", **required)
    for f in required:
        _refused(served, f, **{k: v for k, v in required.items() if k != f})
    for f, how in takes.items():
        if how == "refused":
            _refused(served, f, **{**required, f: VALUES[f]})
    if fields.ref_audio != "refused":
        _planned(served, **{**required, "ref_audio": _wav_url(16000)})  # resampled
        not_audio = "data:audio/wav;base64," + base64.b64encode(b"no audio here").decode()
        _refused(served, "ref_audio", **{**required, "ref_audio": not_audio})


def test_a_pipeline_without_a_qwen3_tts_talker_takes_none_of_them():
    tts = parse_pipeline(
        """
name = "plain-tts"
[[stages]]
name = "code2wav"
engine = { kind = "scripted", output_modality = "audio" }
[outputs]
audio = "code2wav"
"""
    )
    served = PlanContext(tts, new_request_id=lambda: "req-1", new_seed=lambda: 7)
    assert speech_fields(served) == SpeechFields()
    _planned(served)
    for f, value in {**VALUES, "language": "english"}.items():
        _refused(served, f, **{f: value})
