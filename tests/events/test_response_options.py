"""Schema v6: a request's response options are typed (``options.py``), and
the strings schema v5 and older recorded read into the typed form.

The HTTP side (that the typed form the adapters write now is what the old
strings of the same request read as) is tests/http/test_options_v5.py.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from omnix.events.codec import decode_event, decode_events, encode_event
from omnix.events.options import (
    ChatOptions,
    CompletionOptions,
    Group,
    ImageOptions,
    RawPrompt,
    SpeechOptions,
    TranscriptionOptions,
    from_legacy,
    group_of,
)
from omnix.events.types import Admitted, Rejected, RequestSpec
from omnix.trace import read_trace

REPLAY = Path(__file__).resolve().parents[2] / "replay"


class _SpecV5(msgspec.Struct, array_like=True):
    """``RequestSpec`` as schema v5 encoded it: no ``response``, no ``raw_prompt``."""

    prompt: str = ""
    messages: tuple[object, ...] = ()
    outputs: tuple[str, ...] = ("text",)
    stage_params: dict[str, object] = {}
    seed: int = 0
    deadline_ms: int = 0
    api: str = ""
    model: str = ""
    traceparent: str = ""
    options: dict[str, str] = {}


class _AdmittedV5(msgspec.Struct, array_like=True, tag="admitted"):
    pos: int
    ts_ns: int
    request_id: str
    pipeline: str
    spec: _SpecV5


def _v5_record(spec: _SpecV5) -> bytes:
    ev = _AdmittedV5(pos=3, ts_ns=10, request_id="r", pipeline="p", spec=spec)
    return bytes([5]) + msgspec.msgpack.encode(ev)


CHAT_V5 = {
    "render": "3",
    "stream": "1",
    "include_usage": "1",
    "usage_stage": "thinker",
    "text_stage": "thinker",
    "audio_stage": "code2wav",
    "audio_format": "pcm",
    "voice": "alloy",
    "sample_rate": "16000",
    "sse_ids": "1",
    "choices": "1",
    "group_stream": "1",
    "group": "g",
    "group_index": "1",
    "group_size": "2",
}


def test_a_v5_admission_decodes_into_the_typed_form() -> None:
    ev = decode_event(_v5_record(_SpecV5(prompt="hi", api="chat.completions", options=CHAT_V5)))
    assert isinstance(ev, Admitted)
    assert ev.spec.response == ChatOptions(
        render=3,
        stream=True,
        include_usage=True,
        usage_stage="thinker",
        text_stage="thinker",
        audio_stage="code2wav",
        audio_format="pcm",
        sample_rate=16000,
        voice="alloy",
        resumable=True,
        group=Group(id="g", index=1, size=2, samples=True, streamed=True),
    )
    assert ev.spec.raw_prompt is None
    # The strings stay as recorded, and the event round-trips as it is.
    assert ev.spec.options == CHAT_V5
    assert decode_event(encode_event(ev)) == ev


def test_a_v5_completion_prompt_reads_as_a_raw_prompt() -> None:
    old = {"render": "3", "stream": "0", "raw_prompt": "1", "prompt_token_ids": "[5,6]"}
    ev = decode_event(_v5_record(_SpecV5(prompt="<5><6>", api="completions", options=old)))
    assert isinstance(ev, Admitted)
    assert ev.spec.raw_prompt == RawPrompt(token_ids=(5, 6))
    assert ev.spec.response == CompletionOptions(render=3)
    text = from_legacy("completions", {"raw_prompt": "1"})
    assert text == (CompletionOptions(), RawPrompt())


def test_every_api_s_old_strings_have_a_typed_reading() -> None:
    assert from_legacy("audio.speech", {"stream": "1", "stream_format": "sse"})[0] == (
        SpeechOptions(stream=True, stream_format="sse")
    )
    images = {"response_format": "url", "files_url": "http://h/", "group": "g", "group_size": "3"}
    assert from_legacy("images.generations", images)[0] == ImageOptions(
        response_format="url", files_url="http://h/", group=Group(id="g", index=0, size=3)
    )
    speech = {"language": "french", "temperature": "0.5", "response_format": "verbose_json"}
    assert from_legacy("audio.transcriptions", speech)[0] == TranscriptionOptions(
        language="french", temperature=0.5, response_format="verbose_json"
    )
    # Render version 1 recorded no version; an API omnix does not render
    # has no typed options.
    assert from_legacy("chat.completions", {"stream": "1"})[0] == ChatOptions(stream=True)
    assert from_legacy("bench", {"x": "1"}) == (None, None)


def test_values_omnix_never_wrote_read_as_defaults_never_raise() -> None:
    junk = {
        "render": "x",
        "stream": "true",
        "sample_rate": "fast",
        "group_size": "many",
        "audio_format": "ogg",
        "temperature": "warm",
        "stream_format": "zip",
        "response_format": "?",
        "raw_prompt": "1",
        "prompt_token_ids": "[1, 2.5]",
    }
    for api in ("chat.completions", "audio.speech", "audio.transcriptions", "images.generations"):
        response, raw = from_legacy(api, junk)
        assert response is not None and response.render == 1 and not response.stream
        assert raw == RawPrompt()
    assert from_legacy("chat.completions", junk)[0] == ChatOptions()


def test_a_new_spec_records_only_the_typed_form() -> None:
    spec = RequestSpec(prompt="hi", api="chat.completions", response=ChatOptions(stream=True))
    assert spec.options == {}
    adm = Admitted(request_id="r", pipeline="p", spec=spec)
    assert decode_event(encode_event(adm)) == adm
    assert group_of(spec.response) is None
    batch = ImageOptions(group=Group(id="g", index=0, size=2))
    assert group_of(batch) == Group(id="g", index=0, size=2)


def test_the_replay_corpus_reads_into_the_typed_form() -> None:
    """The committed traces (schema v5) of HTTP requests: their admissions
    read as chat options, their strings untouched."""
    seen = 0
    for path in sorted(REPLAY.glob("*.trace")):
        trace = read_trace(path)
        for ev in trace.events:
            if type(ev) is Admitted or type(ev) is Rejected:
                if ev.spec.options:
                    assert ev.spec.response == from_legacy(ev.spec.api, ev.spec.options)[0]
                    assert isinstance(ev.spec.response, ChatOptions)
                    seen += 1
    assert seen > 0
    again = decode_events(
        bytes([5]) + msgspec.msgpack.encode([_AdmittedV5(1, 2, "r", "p", _SpecV5())])
    )
    assert isinstance(again[0], Admitted) and again[0].spec.response is None
