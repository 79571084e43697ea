"""The engine kinds a pipeline config may name, and the class behind each.

Owns: the registry from an engine kind (``engine = "vllm"`` in a stage) to
the dotted path of its class.  Validation reads the kinds; the stage worker
imports the class (``omnix.stages.engine.load_engine``).  Kept as strings so
that naming a kind imports nothing: a codec worker never imports vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable

ENGINE_CLASSES: dict[str, str] = {
    "scripted": "omnix.engines.scripted:ScriptedEngine",
    "vllm": "omnix.engines.vllm_engine:VllmEngine",
    "diffusers": "omnix.engines.diffusers_engine:DiffusersEngine",
    "codec": "omnix.engines.codec_engine:CodecEngine",
    "qwen3_omni_talker": "omnix.engines.talker_engine:TalkerEngine",
    "code2wav": "omnix.engines.code2wav_engine:Code2WavEngine",
    "qwen3_tts_talker": "omnix.engines.qwen3_tts_engine:Qwen3TTSEngine",
    "qwen3_tts_decoder": "omnix.engines.speech_decoder:SpeechDecoderEngine",
    "moshi_duplex": "omnix.engines.duplex_engine:DuplexEngine",
}


_QWEN3_OMNI = "transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe"

#: What a worker of each kind imports before it loads anything (seconds of
#: CPU each): a zygote imports them once for every worker it forks
#: (``omnix.stages.zygote``).  The scripted engine needs none.
ENGINE_PRELOAD: dict[str, tuple[str, ...]] = {
    "scripted": (),
    "vllm": ("vllm.v1.engine.async_llm", "omnix.engines.vllm_engine"),
    "diffusers": ("diffusers", "omnix.engines.diffusers_engine"),
    "codec": ("torch", "omnix.engines.codec_engine"),
    "qwen3_omni_talker": (_QWEN3_OMNI, "omnix.engines.talker_engine"),
    "code2wav": (_QWEN3_OMNI, "omnix.engines.code2wav_engine"),
    "qwen3_tts_talker": ("transformers", "torch", "omnix.engines.qwen3_tts_engine"),
    "qwen3_tts_decoder": ("torch", "omnix.engines.speech_decoder"),
    "moshi_duplex": ("torch", "omnix.engines.duplex_engine"),
}


def engine_preload(kinds: Iterable[str]) -> tuple[str, ...]:
    """The modules workers of ``kinds`` import, each once, in order."""
    return tuple(dict.fromkeys(m for kind in kinds for m in ENGINE_PRELOAD.get(kind, ())))


def engine_kinds() -> tuple[str, ...]:
    return tuple(ENGINE_CLASSES)
