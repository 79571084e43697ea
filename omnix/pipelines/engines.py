"""The engine kinds a pipeline config may name, and the class behind each.

Owns: the registry from an engine kind (``engine = "vllm"`` in a stage) to
the dotted path of its class.  Validation reads the kinds; the stage worker
imports the class (``omnix.stages.engine.load_engine``).  Kept as strings so
that naming a kind imports nothing: a codec worker never imports vLLM.
"""

from __future__ import annotations

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


def engine_kinds() -> tuple[str, ...]:
    return tuple(ENGINE_CLASSES)
