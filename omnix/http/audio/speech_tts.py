"""A speech body checked against the Qwen3-TTS checkpoint a pipeline serves.

Owns: ``check_tts``, the 400s (before anything is admitted) for what the
served checkpoint cannot do, each naming what it can: a task another
variant does (``task_type``; ``ref_audio`` / ``ref_text`` cloning, the Base
variant's; a named voice on VoiceDesign, which has none; VoiceDesign
without the voice's description in ``instructions``), a language it lacks.
On a pipeline with no Qwen3-TTS talker, the cloning fields and ``language``
are refused as no stage there honours them.

Does not own the voice check every speech pipeline shares
(``PlanContext.check_voice``) nor the mapping onto stage parameters
(``speech.py``).
"""

from __future__ import annotations

from typing import Final

from omnix.http.audio.protocol import SpeechRequest
from omnix.http.common.plan import PlanContext
from omnix.http.common.sampling import bad, check_speech, unsupported
from omnix.pipelines.tts_card import TTSCard

#: ``task_type`` (vLLM-Omni's names) of each variant.
_TASK_TYPES: Final = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "base": "Base"}


def check_tts(served: PlanContext, body: SpeechRequest, stages: tuple[str, ...]) -> None:
    card = served.tts_card()
    if card is None:
        if body.ref_audio is not None or body.ref_text is not None:
            raise unsupported(
                "ref_audio" if body.ref_audio is not None else "ref_text",
                f"pipeline {served.model!r} does not clone voices (that is Qwen3-TTS Base's "
                "task, which omnix does not serve yet); omit ref_audio and ref_text.",
            )
        if body.task_type is not None:
            raise unsupported(
                "task_type", f"pipeline {served.model!r} is not Qwen3-TTS; omit task_type."
            )
        if body.language is not None:
            check_speech(served, "language", stages)
        return
    _check_task(served, body, card)
    if body.language is not None:
        lang = body.language.lower()
        if lang != "auto" and lang not in card.languages:
            raise bad(
                "language",
                f"Unknown language {body.language!r}: this checkpoint speaks auto, "
                f"{', '.join(card.languages)}.",
            )


def _check_task(served: PlanContext, body: SpeechRequest, card: TTSCard) -> None:
    variant = _TASK_TYPES.get(card.variant, card.variant)
    can = f"{served.model!r} is Qwen3-TTS {card.task}"
    if body.task_type is not None and body.task_type != variant:
        raise unsupported("task_type", f"{can}; send task_type {variant!r} or omit it.")
    if body.ref_audio is not None or body.ref_text is not None:
        raise unsupported(
            "ref_audio" if body.ref_audio is not None else "ref_text",
            f"{can}; voice cloning (ref_audio, ref_text) needs the Base variant, which omnix "
            "does not serve yet: omit ref_audio and ref_text.",
        )
    if card.variant == "voice_design":
        if body.voice != "default":
            raise bad(
                "voice",
                f"{can}: it has no named voice {body.voice!r}; describe the voice in "
                "instructions and omit voice (or send 'default').",
            )
        if not (body.instructions or "").strip():
            raise bad(
                "instructions",
                f"{can}: give instructions describing the voice to design, e.g. "
                "'A warm, low female voice, speaking slowly'.",
            )
