"""A full-duplex session's configuration: what ``session.update`` sets, checked.

Owns ``DuplexConfig`` (the audio the client sends and is sent, the persona
it asked for, the sampling temperature), ``DuplexConfig.update`` (a
``session.update``'s session object read as vLLM-Omni's clients write it:
the beta spellings ``input_audio_format`` / ``output_audio_format`` /
``sample_rate_hz`` and the GA ``audio.input`` / ``audio.output`` objects
alike; anything the model cannot do refused as a ``DuplexError`` naming
the field; fields that ask for nothing omnix does, ``overlap_policy`` and
the like, echoed and ignored), ``CAPABILITIES`` (what ``session.created``
tells a client it may use) and the session object the server sends back
(``shown``).

The model hears and speaks 24 kHz mono PCM, 80 ms a frame: the wire
formats are 16-bit (``pcm16``, its aliases ``pcm_s16le`` and ``s16le``)
or 32-bit float (``pcm_f32le``) PCM at that rate; another rate or an 8 kHz
G.711 format is refused, never resampled.  A voice or role text the
checkpoint lacks is refused by name (a Moshi checkpoint has neither; a
PersonaPlex-style one has the voices in its ``voices/`` and takes a role
text: ``omnix.pipelines.persona_card``).

Does not own the events (``protocol.py``) nor what opening a session
does (``session.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Final

from omnix.events.options import DuplexFormat
from omnix.http.realtime.duplex.protocol import DuplexError
from omnix.pipelines.persona_card import PersonaCard, voice_stem

#: The model's rate (Mimi's); the only one the wire takes.
SAMPLE_RATE: Final = 24000
#: Samples of one 80 ms frame at ``SAMPLE_RATE``.
FRAME_SAMPLES: Final = 1920
FRAME_MS: Final = 80
#: The longest role text (UTF-8 bytes: each may be a token, each token one
#: frame of the model's 3,000 before the conversation starts).
MAX_INSTRUCTIONS_BYTES: Final = 1000

_FORMATS: Final[dict[str, DuplexFormat]] = {
    "pcm16": "pcm16",
    "pcm_s16le": "pcm16",
    "s16le": "pcm16",
    "pcm_f32le": "pcm_f32le",
}
#: GA ``audio.*.format.type`` names.
_GA_FORMATS: Final[dict[str, DuplexFormat]] = {"audio/pcm": "pcm16"}

#: What a session may use (vLLM-Omni's ``capabilities`` object): the model
#: owns turn-taking; one 80 ms frame a unit; no barge-in, truncation or
#: text input; several sessions per replica; a session comes back after a
#: dropped connection (``session.resume``).
CAPABILITIES: Final[dict[str, Any]] = {
    "implementation_level": "model_native_duplex",
    "supports_model_native_turn_policy": True,
    "supports_input_append": True,
    "supports_independent_io_streams": True,
    "supports_barge_in": False,
    "supports_audio_truncate": False,
    "supports_playback_ack": True,
    "supports_session_resume": True,
    "supports_multi_session": True,
    "supports_multi_session_same_replica": True,
    "supports_realtime_endpoint": True,
    "chunk_period_ms": FRAME_MS,
    "input_modes": ["append_audio_chunk"],
    "signal_sources": ["model_native"],
    "response_lifecycle": "continuous_stream",
}


def wire_format(name: object, param: str) -> DuplexFormat:
    """A wire format's name (``pcm16``, ``pcm_f32le``...) as omnix's."""
    fmt = _FORMATS.get(name) if isinstance(name, str) else None
    if fmt is None:
        raise DuplexError(
            "unsupported_audio_format",
            f"{param} {name!r} is not a format this model takes: send 24 kHz mono PCM as "
            f"{' or '.join(repr(f) for f in _FORMATS)}.",
            param,
        )
    return fmt


def check_rate(rate: object, param: str) -> None:
    if rate is None:
        return
    if not isinstance(rate, int) or isinstance(rate, bool) or rate != SAMPLE_RATE:
        raise DuplexError(
            "unsupported_audio_format",
            f"{param} is {rate!r}: this model hears and speaks {SAMPLE_RATE} Hz only "
            f"(Mimi's rate); resample to {SAMPLE_RATE} before sending.",
            param,
        )


@dataclass(frozen=True)
class DuplexConfig:
    """One session's configuration (defaults: 16-bit PCM both ways, as
    OpenAI's and vLLM-Omni's; PersonaPlex's clients send float)."""

    model: str
    input_format: DuplexFormat = "pcm16"
    output_format: DuplexFormat = "pcm16"
    voice: str = ""
    instructions: str = ""
    temperature: float | None = None
    #: what the client set that omnix echoes and does nothing with
    echoed: tuple[tuple[str, Any], ...] = ()

    def update(
        self, obj: dict[str, Any], names: tuple[str, ...], persona: PersonaCard = PersonaCard()
    ) -> DuplexConfig:
        """This configuration with ``session.update``'s ``obj`` applied
        (``names``: the model names the server answers to; ``persona``:
        what its checkpoint takes); a ``DuplexError`` names the first field
        it cannot take."""
        cfg = self
        model = obj.get("model")
        if model is not None and model not in names:
            raise DuplexError(
                "model_not_found",
                f"session.model {model!r} is not served here; this server serves "
                f"{' or '.join(repr(n) for n in names)}.",
                "session.model",
            )
        for key in ("modalities", "output_modalities"):
            mods = obj.get(key)
            if mods is not None and (
                not isinstance(mods, list) or "audio" not in mods or set(mods) - {"audio", "text"}
            ):
                raise DuplexError(
                    "unsupported_modalities",
                    f"session.{key} {mods!r}: a full-duplex model always speaks and writes its "
                    'text beside it; send ["audio", "text"].',
                    f"session.{key}",
                )
        audio = obj.get("audio")
        audio_in = audio.get("input") if isinstance(audio, dict) else None
        audio_out = audio.get("output") if isinstance(audio, dict) else None
        for key in ("input_audio_format", "output_audio_format"):
            if obj.get(key) is not None:
                fmt = wire_format(obj[key], f"session.{key}")
                cfg = (
                    replace(cfg, input_format=fmt)
                    if key == "input_audio_format"
                    else replace(cfg, output_format=fmt)
                )
        check_rate(obj.get("sample_rate_hz"), "session.sample_rate_hz")
        for side, part in (("input", audio_in), ("output", audio_out)):
            if not isinstance(part, dict):
                continue
            where = f"session.audio.{side}"
            check_rate(part.get("sample_rate_hz"), f"{where}.sample_rate_hz")
            fmt_obj = part.get("format")
            if fmt_obj is None:
                continue
            if isinstance(fmt_obj, dict):
                kind = fmt_obj.get("type")
                ga = _GA_FORMATS.get(kind) if isinstance(kind, str) else None
                fmt = ga if ga is not None else wire_format(kind, f"{where}.format.type")
                check_rate(fmt_obj.get("rate"), f"{where}.format.rate")
            else:
                fmt = wire_format(fmt_obj, f"{where}.format")
            if side == "input":
                cfg = replace(cfg, input_format=fmt)
            else:
                cfg = replace(cfg, output_format=fmt)
        voice = obj.get("voice")
        if isinstance(audio_out, dict) and audio_out.get("voice") is not None:
            voice = audio_out["voice"]
        if voice is not None:
            cfg = replace(cfg, voice=_voice(voice, persona))
        instructions = obj.get("instructions")
        if instructions is not None:
            cfg = replace(cfg, instructions=_instructions(instructions, persona))
        if obj.get("ref_audio") not in (None, ""):
            raise DuplexError(
                "unsupported_ref_audio",
                "session.ref_audio: this model clones no voice; leave ref_audio unset.",
                "session.ref_audio",
            )
        turns = obj.get("turn_detection")
        if isinstance(audio_in, dict) and "turn_detection" in audio_in:
            turns = audio_in["turn_detection"]
        if turns is not None:
            raise DuplexError(
                "unsupported_turn_detection",
                "session.turn_detection: the model decides when to speak and listen itself; "
                "send turn_detection: null.",
                "session.turn_detection",
            )
        if "temperature" in obj and obj["temperature"] is not None:
            t = obj["temperature"]
            if not isinstance(t, int | float) or isinstance(t, bool) or not 0 <= t < math.inf:
                raise DuplexError(
                    "invalid_value",
                    f"session.temperature {t!r} must be a number >= 0 (0: greedy).",
                    "session.temperature",
                )
            cfg = replace(cfg, temperature=float(t))
        kept = dict(cfg.echoed)
        for key in ("overlap_policy", "playback_commit_policy", "idle_timeout_s", "extra_body"):
            if key in obj:
                kept[key] = obj[key]
        return replace(cfg, echoed=tuple(sorted(kept.items())))

    def shown(self, sid: str, state: str = "open") -> dict[str, Any]:
        """The session object ``session.created`` / ``.updated`` carry."""
        rate = SAMPLE_RATE
        return {
            "object": "realtime.session",
            "type": "realtime",
            "id": sid,
            "session_id": sid,
            "model": self.model,
            "state": state,
            "turn_state": "idle",
            "epoch": 0,
            "turn_id": 0,
            "modalities": ["audio", "text"],
            "output_modalities": ["audio", "text"],
            "instructions": self.instructions or None,
            "voice": self.voice or None,
            "input_audio_format": self.input_format,
            "output_audio_format": self.output_format,
            "response_format": self.output_format,
            "audio": {
                "input": {"format": _ga(self.input_format, rate), "sample_rate_hz": rate},
                "output": {"format": _ga(self.output_format, rate), "sample_rate_hz": rate},
            },
            "temperature": self.temperature,
            "turn_detection": None,
            "capabilities": dict(CAPABILITIES),
            **dict(self.echoed),
        }


def _voice(voice: object, persona: PersonaCard) -> str:
    """``session.voice`` as the card names it ("" none: unset or
    ``default``, the model's own voice)."""
    param = "session.voice"
    if not isinstance(voice, str):
        raise DuplexError(
            "invalid_value", f"{param} must be a voice's name (a string), got {voice!r}.", param
        )
    if voice in ("", "default"):
        return ""
    stem = voice_stem(voice)
    if stem in persona.voices:
        return stem
    if stem in persona.embeddings:
        raise DuplexError(
            "unknown_voice",
            f"{param} {voice!r} is PersonaPlex's precomputed embedding (voices/{stem}.pt), which "
            f"omnix does not read; its audio as voices/{stem}.wav (24 kHz mono) would be taken. "
            f"This checkpoint's voices: {', '.join(persona.voices) or 'none'}.",
            param,
        )
    if not persona.voices:
        raise DuplexError(
            "unknown_voice",
            f"{param} {voice!r} is not a voice of this checkpoint: it has no voice prompts (a "
            "Moshi checkpoint speaks in its own voice); leave voice unset.",
            param,
        )
    raise DuplexError(
        "unknown_voice",
        f"{param} {voice!r} is not a voice of this checkpoint; it has "
        f"{', '.join(persona.voices)} (or leave voice unset: the model's own).",
        param,
    )


def _instructions(text: object, persona: PersonaCard) -> str:
    """``session.instructions``: the role text ("" none)."""
    param = "session.instructions"
    if not isinstance(text, str):
        raise DuplexError(
            "invalid_value", f"{param} must be the role's text (a string), got {text!r}.", param
        )
    if not text.strip():
        return ""
    if not persona.role_text:
        raise DuplexError(
            "unknown_persona",
            f"{param}: this checkpoint takes no role text (a Moshi checkpoint has no persona "
            "prompt; a PersonaPlex one, with its voices/, does); leave instructions unset.",
            param,
        )
    if len(text.encode()) > MAX_INSTRUCTIONS_BYTES:
        raise DuplexError(
            "invalid_value",
            f"{param} is {len(text.encode())} bytes; at most {MAX_INSTRUCTIONS_BYTES} (each of "
            "its tokens takes one 80 ms frame of the model's context before the conversation).",
            param,
        )
    return text


def _ga(fmt: DuplexFormat, rate: int) -> dict[str, Any]:
    return {"type": "audio/pcm" if fmt == "pcm16" else "audio/pcm_f32le", "rate": rate}
