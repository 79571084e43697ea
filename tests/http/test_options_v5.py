"""The strings schema v5 recorded and the typed options recorded now say
the same thing: for each request below, ``fixtures/options_v5.json`` holds
the ``RequestSpec.options`` the HTTP layer of schema v5 wrote (captured
from it), and the typed form they read as (``options.from_legacy``) is
what the planners write today.  So a v5 log renders as it did."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from omnix.events.options import from_legacy
from omnix.events.types import BlobRef, MediaPart
from omnix.http.audio.protocol import SpeechRequest, TranscriptionForm
from omnix.http.audio.speech import speech_plan
from omnix.http.audio.transcribe import transcription_plan
from omnix.http.chat.plan import chat_plan
from omnix.http.chat.protocol import ChatCompletionRequest
from omnix.http.common.plan import Plan, PlanContext
from omnix.http.completions.plan import completion_plan
from omnix.http.completions.protocol import CompletionRequest
from omnix.http.images.plan import image_plan
from omnix.http.images.protocol import ImageRequest
from omnix.pipelines.validate import load_pipeline, parse_pipeline
from omnix.testing.pipelines import standin_omni

V5 = json.loads((Path(__file__).parent / "fixtures" / "options_v5.json").read_text())
USER = [{"role": "user", "content": "hi"}]


def served(name: str) -> PlanContext:
    ids = iter(range(100))
    pipeline = load_pipeline(name)
    if name == "tiny-omni":
        # The v5 strings were written for tiny-omni's stand-in speech stages,
        # which took any voice (the fixture's "v1"); Qwen3-Omni's talker now
        # refuses one its checkpoint lacks.  The same stages, stand-ins.
        pipeline = msgspec.structs.replace(standin_omni(), name=name)
    return PlanContext(pipeline, new_request_id=lambda: f"r{next(ids)}", new_seed=lambda: 5)


class _Tok:
    def __len__(self) -> int:
        return 100

    def decode(self, ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids)


def _dec(t: type, body: dict[str, Any]) -> Any:
    return msgspec.json.decode(json.dumps(body), type=t)


def _transcription(fmt: Any, lang: str | None, temp: float | None, stream: bool) -> Plan:
    form = TranscriptionForm(
        response_format=fmt,
        language=lang,
        temperature=temp,
        stream=stream,
    )
    part = MediaPart(kind="audio", blob=BlobRef("ab" * 16, 4, "<f4", (1,)), rate=16000)
    return transcription_plan(form, served("tiny-asr"), part, ())


def _images_url() -> Plan:
    img = parse_pipeline(
        'name = "img"\n[[stages]]\nname = "image"\n'
        'engine = { kind = "diffusers", model = "/nonexistent/x" }\n[outputs]\nimage = "image"\n'
    )
    s = PlanContext(img, new_request_id=lambda: "r0", new_seed=lambda: 5)
    body = {"prompt": "cat", "response_format": "url", "output_format": "jpeg"}
    return image_plan(_dec(ImageRequest, body), s, files_url="http://h/v1/files/")


def _chat(body: dict[str, Any]) -> Plan:
    return chat_plan(_dec(ChatCompletionRequest, {"messages": USER, **body}), served("tiny-omni"))


def _completions(body: dict[str, Any], tok: Any = None) -> Plan:
    return completion_plan(_dec(CompletionRequest, body), served("tiny-text"), tokenizer=tok)


PLANS = {
    "chat": lambda: _chat({}),
    "chat_stream_usage_resumable_logprobs": lambda: _chat(
        {
            "stream": True,
            "stream_options": {"include_usage": True, "resumable": True},
            "logprobs": True,
        }
    ),
    "chat_audio": lambda: _chat(
        {"modalities": ["text", "audio"], "audio": {"format": "pcm16", "voice": "v1"}}
    ),
    "chat_audio_stream_default": lambda: _chat({"modalities": ["text", "audio"], "stream": True}),
    "chat_n2_stream": lambda: _chat({"n": 2, "stream": True}),
    "chat_batch": lambda: chat_plan(
        _dec(ChatCompletionRequest, {"messages": [USER, USER]}), served("tiny-omni")
    ),
    "completions": lambda: _completions(
        {"prompt": "a", "echo": True, "stream": True, "stream_options": {"include_usage": True}}
    ),
    "completions_ids_logprobs": lambda: _completions({"prompt": [3, 4], "logprobs": 2}, _Tok()),
    "completions_batch_ids": lambda: _completions({"prompt": [[3], [4, 5]]}, _Tok()),
    "completions_n3": lambda: _completions({"prompt": "x", "n": 3}),
    "speech": lambda: speech_plan(_dec(SpeechRequest, {"input": "hi"}), served("tiny-tts")),
    "speech_sse": lambda: speech_plan(
        _dec(
            SpeechRequest, {"input": "hi", "stream": True, "response_format": "pcm", "voice": "x"}
        ),
        served("tiny-tts"),
    ),
    "speech_audio": lambda: speech_plan(
        _dec(SpeechRequest, {"input": "hi", "stream_format": "audio", "response_format": "wav"}),
        served("tiny-tts"),
    ),
    "images": lambda: image_plan(
        _dec(ImageRequest, {"prompt": "cat", "n": 2}), served("tiny-image")
    ),
    "images_url": _images_url,
    "transcription_json_None_None_False": lambda: _transcription("json", None, None, False),
    "transcription_verbose_json_fr_0.5_False": lambda: _transcription(
        "verbose_json", "fr", 0.5, False
    ),
    "transcription_json_None_None_True": lambda: _transcription("json", None, None, True),
    "transcription_text_en_None_False": lambda: _transcription("text", "en", None, False),
}


def test_every_recorded_case_is_planned_here() -> None:
    assert set(PLANS) == set(V5)


@pytest.mark.parametrize("case", sorted(V5))
def test_the_v5_strings_read_as_what_is_written_now(case: str) -> None:
    plan = PLANS[case]()
    assert [rid for rid, _ in plan.specs] == [rid for rid, _, _ in V5[case]]
    for (rid, spec), (_, api, old) in zip(plan.specs, V5[case], strict=True):
        assert spec.api == api
        assert spec.options == {}, "new specs record only the typed form"
        assert from_legacy(api, old) == (spec.response, spec.raw_prompt), rid
