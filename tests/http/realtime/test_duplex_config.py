"""A full-duplex session's configuration as vLLM-Omni's clients write it:
the beta and GA spellings of the audio formats alike, 24 kHz only, the
PersonaPlex preset's float input; each thing the model cannot do refused
naming its field; what omnix does nothing with echoed.  And a server whose
pipeline is no full-duplex model answers ``?duplex=1`` with the
turn-based API, as vLLM-Omni's does (no ``capabilities``)."""

from __future__ import annotations

import pytest

from omnix.http.realtime.duplex.config import DuplexConfig
from omnix.http.realtime.duplex.protocol import DuplexError
from omnix.http.realtime.duplex.render import SEQ_STRIDE, frames_through
from omnix.pipelines.persona_card import PersonaCard

from .conftest import client_for, next_event

BASE = DuplexConfig(model="moshi")
NAMES = ("moshi",)


def test_the_beta_and_ga_spellings_set_the_formats() -> None:
    beta = BASE.update(
        {"input_audio_format": "pcm_s16le", "output_audio_format": "pcm_f32le"}, NAMES
    )
    assert (beta.input_format, beta.output_format) == ("pcm16", "pcm_f32le")
    ga = BASE.update({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}}, NAMES)
    assert ga.input_format == "pcm16" and ga.output_format == "pcm16"
    preset = BASE.update(
        {
            "input_audio_format": "pcm_f32le",
            "sample_rate_hz": 24000,
            "audio": {"input": {"sample_rate_hz": 24000}, "output": {"sample_rate_hz": 24000}},
            "turn_detection": None,
            "temperature": 0.7,
            "overlap_policy": "listen_only",
            "extra_body": {"auto_response": True},
        },
        NAMES,
    )
    assert preset.temperature == 0.7 and preset.input_format == "pcm_f32le"
    shown = preset.shown("duplex-1")
    assert (
        shown["overlap_policy"] == "listen_only" and shown["capabilities"]["chunk_period_ms"] == 80
    )


@pytest.mark.parametrize(
    ("obj", "param"),
    [
        ({"sample_rate_hz": 16000}, "session.sample_rate_hz"),
        ({"audio": {"output": {"sample_rate_hz": 48000}}}, "session.audio.output.sample_rate_hz"),
        (
            {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
            "session.audio.input.format.rate",
        ),
        ({"input_audio_format": "g711_ulaw"}, "session.input_audio_format"),
        ({"voice": "NATF2.pt"}, "session.voice"),
        ({"instructions": "You are a pirate."}, "session.instructions"),
        ({"ref_audio": "data:audio/wav;base64,AAAA"}, "session.ref_audio"),
        ({"turn_detection": {"type": "server_vad"}}, "session.turn_detection"),
        ({"modalities": ["text"]}, "session.modalities"),
        ({"model": "gpt-4o-realtime"}, "session.model"),
        ({"temperature": -1}, "session.temperature"),
    ],
)
def test_what_the_model_cannot_do_is_refused_naming_the_field(obj, param) -> None:
    with pytest.raises(DuplexError) as err:
        BASE.update(obj, NAMES)
    assert err.value.param == param


PERSONAPLEX = PersonaCard(voices=("NATF2", "NATM1"), embeddings=("VARF0",), role_text=True)


def test_a_personaplex_checkpoint_takes_its_voices_by_either_name_and_a_role_text() -> None:
    cfg = BASE.update(
        {"voice": "NATF2.pt", "instructions": "You are a wise and friendly teacher."},
        NAMES,
        PERSONAPLEX,
    )
    assert cfg.voice == "NATF2" and cfg.instructions == "You are a wise and friendly teacher."
    ga = BASE.update({"audio": {"output": {"voice": "NATM1"}}}, NAMES, PERSONAPLEX)
    assert ga.voice == "NATM1"
    shown = cfg.shown("duplex-1")
    assert shown["voice"] == "NATF2" and shown["instructions"].startswith("You are")
    # "default" (or "") is the model's own voice; an update without one keeps it.
    assert cfg.update({"voice": "default"}, NAMES, PERSONAPLEX).voice == ""
    assert cfg.update({"temperature": 0.5}, NAMES, PERSONAPLEX).voice == "NATF2"


@pytest.mark.parametrize(
    ("obj", "param", "says"),
    [
        ({"voice": "NATF9.pt"}, "session.voice", "NATF2, NATM1"),
        ({"voice": "VARF0.pt"}, "session.voice", "voices/VARF0.wav"),
        ({"voice": 7}, "session.voice", "a string"),
        ({"instructions": "x" * 1001}, "session.instructions", "at most 1000"),
        ({"instructions": ["You are"]}, "session.instructions", "a string"),
    ],
)
def test_a_persona_the_checkpoint_lacks_is_refused_naming_it(obj, param, says) -> None:
    with pytest.raises(DuplexError) as err:
        BASE.update(obj, NAMES, PERSONAPLEX)
    assert err.value.param == param and says in err.value.message


def test_the_frames_a_seq_covers() -> None:
    # Frame 0's audio delta follows the six events that open the response.
    assert frames_through(0) == 0
    assert frames_through(SEQ_STRIDE + 5) == 0
    assert frames_through(SEQ_STRIDE + 6) == 1
    assert frames_through(2 * SEQ_STRIDE) == 2
    assert frames_through(5 * SEQ_STRIDE + 1) == 5


@pytest.mark.asyncio(loop_scope="session")
async def test_duplex_on_a_turn_based_server_is_the_turn_based_api(rt_server) -> None:
    client = client_for(rt_server)
    async with client.realtime.connect(model="rt-omni", extra_query={"duplex": "1"}) as conn:
        created = await next_event(conn, "session.created")
    assert created.session.id.startswith("sess_")
    assert "capabilities" not in created.session.model_dump()
