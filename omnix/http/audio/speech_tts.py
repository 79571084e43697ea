"""A speech body checked against the Qwen3-TTS checkpoint a pipeline serves.

Owns: ``check_tts``, the 400s (before anything is admitted) for what the
served checkpoint cannot do, each naming what it can: a task another
variant does (``task_type``; ``ref_audio`` / ``ref_text`` cloning, the Base
variant's; a named voice on VoiceDesign, which has none, or on Base one
that is not an uploaded voice; VoiceDesign without the voice's description
in ``instructions``; Base with no voice to clone, or with
``instructions``), a language it lacks.  On a pipeline with no Qwen3-TTS
talker, the cloning fields and ``language`` are refused as no stage there
honours them.  And ``speech_fields``, the same
rules published (``SpeechFields`` on ``GET /v1/models``' card) so that a
client (the playground) offers the fields the checkpoint takes.

Also owns ``reference_message``: the clip a Base request clones from
(``cloning.Reference``: ``ref_audio`` decoded, or an uploaded voice read
back) recorded as the request's one message: its audio part a blob
(``MediaPart``, as chat's media), then its speaker vector (a ``speaker``
part, a blob too: the talker clones with it), its content the transcript,
so a trace of a cloned request holds all the talker was given, without
the voice store.

Does not own decoding the clip or the uploaded voices (``cloning.py``),
the voice check every speech pipeline shares (``PlanContext.check_voice``)
nor the mapping onto stage parameters (``speech.py``).
"""

from __future__ import annotations

from typing import Final

from omnix.events.blobs import array_ref
from omnix.events.types import ChatMessage, MediaPart
from omnix.http.audio.cloning import MAX_SECONDS, Reference
from omnix.http.audio.protocol import SpeechFields, SpeechRequest, Takes, TaskType
from omnix.http.common.plan import DecodedBlob, PlanContext
from omnix.http.common.sampling import bad, check_speech, unsupported
from omnix.http.media.parts import MEDIA_TYPES
from omnix.pipelines.tts_card import TTSCard

#: ``task_type`` (vLLM-Omni's names) of each variant.
_TASK_TYPES: Final[dict[str, TaskType]] = {
    "custom_voice": "CustomVoice",
    "voice_design": "VoiceDesign",
    "base": "Base",
}
#: What each variant takes of instructions, ref_audio and ref_text, as
#: ``_check_task`` checks them (tests/http/test_speech_fields.py holds the two together).
_TAKES: Final[dict[str, tuple[Takes, Takes, Takes]]] = {
    "custom_voice": ("optional", "refused", "refused"),
    "voice_design": ("required", "refused", "refused"),
    "base": ("refused", "required", "optional"),
}


def speech_fields(served: PlanContext) -> SpeechFields:
    """What the speech route takes on ``served``'s pipeline (``check_tts``'s
    rules, read from the same checkpoint card)."""
    card = served.tts_card()
    if card is None or card.variant not in _TAKES:
        return SpeechFields()
    instructions, ref_audio, ref_text = _TAKES[card.variant]
    return SpeechFields(
        task_type=_TASK_TYPES[card.variant],
        instructions=instructions,
        languages=["auto", *card.languages],
        ref_audio=ref_audio,
        ref_audio_rate=card.clone_rate if ref_audio != "refused" else 0,
        ref_text=ref_text,
    )


def check_tts(
    served: PlanContext,
    body: SpeechRequest,
    stages: tuple[str, ...],
    reference: Reference | None = None,
) -> None:
    """``reference``: what ``cloning.Cloning.reference`` found ``body``
    clones from (None: nothing, or not resolved)."""
    card = served.tts_card()
    if card is None:
        if body.ref_audio is not None or body.ref_text is not None:
            raise unsupported(
                "ref_audio" if body.ref_audio is not None else "ref_text",
                f"pipeline {served.model!r} does not clone voices (that is Qwen3-TTS Base's "
                "task: serve a Base folder); omit ref_audio and ref_text.",
            )
        if body.task_type is not None:
            raise unsupported(
                "task_type", f"pipeline {served.model!r} is not Qwen3-TTS; omit task_type."
            )
        if body.language is not None:
            check_speech(served, "language", stages)
        return
    _check_task(served, body, card, reference)
    if body.language is not None:
        lang = body.language.lower()
        if lang != "auto" and lang not in card.languages:
            raise bad(
                "language",
                f"Unknown language {body.language!r}: this checkpoint speaks auto, "
                f"{', '.join(card.languages)}.",
            )


def _check_task(
    served: PlanContext, body: SpeechRequest, card: TTSCard, reference: Reference | None
) -> None:
    variant = _TASK_TYPES.get(card.variant, card.variant)
    can = f"{served.model!r} is Qwen3-TTS {card.task}"
    if body.task_type is not None and body.task_type != variant:
        raise unsupported("task_type", f"{can}; send task_type {variant!r} or omit it.")
    if card.variant == "base":
        _check_base(body, can, card, reference)
        return
    if body.ref_audio is not None or body.ref_text is not None:
        raise unsupported(
            "ref_audio" if body.ref_audio is not None else "ref_text",
            f"{can}; voice cloning (ref_audio, ref_text) needs a Qwen3-TTS Base checkpoint: "
            "omit ref_audio and ref_text.",
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


def _check_base(body: SpeechRequest, can: str, card: TTSCard, reference: Reference | None) -> None:
    if reference is None and body.voice != "default":
        raise bad(
            "voice",
            f"{can}: it has no named voice {body.voice!r}; name a voice uploaded with "
            "POST /v1/audio/voices (GET /v1/audio/voices lists them), or clone from ref_audio "
            "and omit voice (or send 'default').",
        )
    if reference is None:
        raise bad(
            "ref_audio",
            f"{can}: send ref_audio, the voice to clone (a data URL such as "
            f"data:audio/wav;base64,..., {_AUDIO.format(rate=card.clone_rate, seconds=MAX_SECONDS)}), and "
            "optionally ref_text, its transcript (in-context cloning; without it the speaker "
            "vector alone); or name a voice uploaded with POST /v1/audio/voices in voice.",
        )
    if body.instructions:
        raise unsupported(
            "instructions",
            f"{can}: it takes no instructions; omit them (the voice is the one cloned).",
        )


#: What Base's reference audio may be (``cloning.py`` decodes it).
_AUDIO: Final = (
    "or an http(s) URL of a host the server fetches media from; wav, flac, mp3, ogg and "
    "more, at any rate (resampled to {rate} Hz), at most {seconds:g} s"
)


def reference_message(reference: Reference) -> tuple[ChatMessage, tuple[DecodedBlob, ...]]:
    """The clip as the request's message and the blobs its parts reference
    (the audio's, the speaker vector's)."""
    audio = array_ref(reference.samples, MEDIA_TYPES["audio"])
    speaker = array_ref(reference.speaker, MEDIA_TYPES["speaker"])
    parts = (
        MediaPart(kind="audio", blob=audio, rate=reference.rate),
        MediaPart(kind="speaker", blob=speaker),
    )
    message = ChatMessage(role="user", content=reference.text or "", media=parts)
    blobs = (
        DecodedBlob(ref=audio, array=reference.samples),
        DecodedBlob(ref=speaker, array=reference.speaker),
    )
    return message, blobs
