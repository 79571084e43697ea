"""What a Qwen3-TTS checkpoint can do, read from its ``config.json`` alone.

Owns: ``TTSCard`` (the variant, its named speakers, its languages) and
``read_tts_card``, which deriving a pipeline from a folder
(``omnix.pipelines.folder``) and checking a speech request before admission
(``omnix.http.audio.speech``) read without loading a tensor; and
``VARIANT_TASKS``, what each variant's request takes.

Does not own the prompt those fields become (``omnix.engines.qwen3_tts_talker``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

import msgspec

MODEL_TYPE: Final = "qwen3_tts"

#: What each variant does with a request (qwen-tts's ``generate_*``), as the
#: errors and docs name it.
VARIANT_TASKS: Final[dict[str, str]] = {
    "custom_voice": "CustomVoice: a named speaker (voice), an optional instruction "
    "(instructions) and language",
    "voice_design": "VoiceDesign: a voice designed from its description (instructions, "
    "required) and a language; no named speakers",
    "base": "Base: a voice cloned from reference audio (ref_audio, required; ref_text, its "
    "transcript, for in-context cloning) and a language; no named speakers, no instructions",
}


class TTSCard(msgspec.Struct, frozen=True):
    """A Qwen3-TTS checkpoint's variant (``tts_model_type``: ``custom_voice``,
    ``voice_design``, ``base``), speakers (lower case, by codec id: the
    first is ``default``) and languages (lower case; dialects, which only
    a dialect speaker's Chinese selects, left out)."""

    variant: str
    speakers: tuple[str, ...]
    languages: tuple[str, ...]
    #: Base: the rate its reference audio must have (its speaker encoder's)
    clone_rate: int = 0

    @property
    def served(self) -> bool:
        return self.variant in VARIANT_TASKS

    @property
    def task(self) -> str:
        return VARIANT_TASKS.get(self.variant, self.variant)


def is_qwen3_tts(config: dict[str, object]) -> bool:
    return config.get("model_type") == MODEL_TYPE


def tts_card(config: dict[str, object]) -> TTSCard:
    """The card of a Qwen3-TTS ``config.json`` already read."""
    talker = config.get("talker_config")
    talker = talker if isinstance(talker, dict) else {}
    speakers = talker.get("spk_id") or {}
    languages = talker.get("codec_language_id") or {}
    speaker_encoder = config.get("speaker_encoder_config")
    rate = speaker_encoder.get("sample_rate", 0) if isinstance(speaker_encoder, dict) else 0
    return TTSCard(
        variant=str(config.get("tts_model_type", "")),
        speakers=tuple(str(k).lower() for k, _ in sorted(speakers.items(), key=lambda kv: kv[1])),
        languages=tuple(sorted(str(k).lower() for k in languages if "dialect" not in str(k))),
        clone_rate=int(rate) if config.get("tts_model_type") == "base" else 0,
    )


def read_tts_card(folder: str | Path) -> TTSCard | None:
    """The card of the Qwen3-TTS folder; None when it is not one (or has no
    readable ``config.json``)."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return tts_card(config) if isinstance(config, dict) and is_qwen3_tts(config) else None
