"""A realtime session's configuration: what ``session.update`` sets and a response overrides.

Owns ``SessionConfig``: the session's instructions, output modalities,
voice, turn detection, input transcription and output token limit, with
their defaults for the served pipeline; ``update`` (a ``session.update``, checked whole before
anything changes: a bad one leaves the session as it was), ``shown``
(the session object ``session.created`` / ``session.updated`` send) and
``for_response`` (a ``response.create``'s overrides on top: the
``ResponseConfig`` one response runs with).

Function tools, ``tool_choice`` and ``parallel_tool_calls`` are ``tools.py``'s.  Everything the
Realtime API defines and omnix does not do is refused naming the field:
MCP tools, stored prompts, other audio formats than 24 kHz pcm16, noise
reduction, transcription logprobs (``include``), a transcription on a
model the server does not serve or a pipeline that cannot transcribe (as
``POST /v1/audio/transcriptions`` checks it), semantic VAD, a speed other
than 1.

Does not own the conversation (``conversation.py``) nor the requests a
response submits (``respond.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from msgspec import UNSET

from omnix.events.sessions import SessionSettings, TranscriptionSettings, TurnSettings
from omnix.http.audio import transcribe
from omnix.http.common.plan import PlanContext
from omnix.http.core.errors import ApiError
from omnix.http.realtime import vad
from omnix.http.realtime.protocol import (
    AudioFormat,
    AudioInputOut,
    AudioOut,
    AudioOutputOut,
    Modality,
    ResponseParams,
    SessionObject,
    SessionUpdate,
    Transcription,
    TranscriptionOut,
    TurnDetection,
    TurnDetectionOut,
)
from omnix.http.realtime.tools import Tools


def unsupported(param: str, why: str, code: str = "unsupported_value") -> ApiError:
    return ApiError(400, f"{param}: {why}", param=param, code=code)


@dataclass(frozen=True, slots=True)
class ResponseConfig:
    """What one response runs with: the session's configuration with a
    ``response.create``'s overrides."""

    instructions: str
    modalities: tuple[Modality, ...]
    voice: str
    max_output_tokens: int  # 0: no limit but the stage's
    conversation: bool = True
    metadata: dict[str, str] = field(default_factory=dict)
    tools: Tools = field(default_factory=Tools)


@dataclass(slots=True)
class SessionConfig:
    """One session's configuration (see the module's docstring)."""

    model: str
    audio_out: bool  # the pipeline makes audio
    audio_in: bool  # the pipeline takes audio
    instructions: str = ""
    modalities: tuple[Modality, ...] = ("text",)
    voice: str = "default"
    max_output_tokens: int = 0
    turn_detection: TurnDetectionOut | None = None
    transcription: TranscriptionSettings | None = None
    tools: Tools = field(default_factory=Tools)

    @classmethod
    def for_pipeline(cls, served: PlanContext) -> SessionConfig:
        audio_out = "audio" in served.pipeline.outputs and served.sample_rate() == 24000
        media = served.pipeline.input_media
        audio_in = media is not None and media.audio
        voices = served.voices()
        return cls(
            model=served.model,
            audio_out=audio_out,
            audio_in=audio_in,
            modalities=("audio",) if audio_out else ("text",),
            voice=voices[0] if voices else "default",
            # Server VAD by default, as OpenAI's sessions start, where audio
            # comes in (and Silero is installed: ``vad.available``).
            turn_detection=TurnDetectionOut() if audio_in and vad.available() is None else None,
        )

    def settings(self, conversation: str) -> SessionSettings:
        """The configuration as the log records it (``SessionChanged``)."""
        td = self.turn_detection
        turns = None
        if td is not None:
            turns = TurnSettings(
                threshold=td.threshold,
                prefix_padding_ms=td.prefix_padding_ms,
                silence_duration_ms=td.silence_duration_ms,
                create_response=td.create_response,
                interrupt_response=td.interrupt_response,
            )
        tools, choice = self.tools.recorded()
        return SessionSettings(
            model=self.model,
            conversation=conversation,
            instructions=self.instructions,
            modalities=self.modalities,
            voice=self.voice,
            max_output_tokens=self.max_output_tokens,
            turns=turns,
            transcription=self.transcription,
            tools=tools,
            tool_choice=choice,
            parallel_tool_calls=self.tools.parallel,
        )

    def recorded(self, s: SessionSettings) -> SessionConfig:
        """This configuration with what the log recorded (a resumed session)."""
        td = None
        if s.turns is not None:
            t = s.turns
            td = TurnDetectionOut(
                threshold=t.threshold,
                prefix_padding_ms=t.prefix_padding_ms,
                silence_duration_ms=t.silence_duration_ms,
                create_response=t.create_response,
                interrupt_response=t.interrupt_response,
            )
        return replace(
            self,
            instructions=s.instructions,
            modalities=s.modalities,
            voice=s.voice,
            max_output_tokens=s.max_output_tokens,
            turn_detection=td,
            transcription=s.transcription,
            tools=Tools.from_recorded(s.tools, s.tool_choice, s.parallel_tool_calls),
        )

    def shown(self, session_id: str, expires_at: int) -> SessionObject:
        vad = self.turn_detection
        tx = self.transcription
        transcription = None
        if tx is not None:
            transcription = TranscriptionOut(
                model=tx.model, language=tx.language or None, prompt=tx.prompt or None
            )
        return SessionObject(
            id=session_id,
            model=self.model,
            output_modalities=list(self.modalities),
            instructions=self.instructions,
            audio=AudioOut(
                input=AudioInputOut(turn_detection=vad, transcription=transcription),
                output=AudioOutputOut(voice=self.voice),
            ),
            max_output_tokens=self.max_output_tokens or "inf",
            tools=list(self.tools.tools),
            tool_choice=self.tools.choice,
            parallel_tool_calls=self.tools.parallel,
            expires_at=expires_at,
        )

    # -- checks --------------------------------------------------------------------

    def _modalities(self, given: list[Modality], param: str) -> tuple[Modality, ...]:
        if len(given) != 1:
            raise unsupported(
                param,
                'give one modality: ["audio"] (speech with its transcript) or ["text"].',
                "invalid_value",
            )
        if given[0] == "audio" and not self.audio_out:
            raise unsupported(
                param,
                f"the pipeline {self.model!r} does not speak (no 24 kHz audio output); "
                'use ["text"].',
                "unsupported_modality",
            )
        return (given[0],)

    @staticmethod
    def _format(fmt: AudioFormat, param: str) -> None:
        if fmt.type != "audio/pcm" or fmt.rate not in (None, 24000):
            raise unsupported(
                param,
                f"omnix speaks audio/pcm at 24000 Hz only, not {fmt.type} at {fmt.rate} Hz; "
                'send {"type": "audio/pcm", "rate": 24000}.',
            )

    @staticmethod
    def _max_tokens(given: int | str | None, param: str) -> int:
        if given is None or given == "inf":
            return 0
        if isinstance(given, str) or not 1 <= given <= 4096:
            raise unsupported(param, 'give 1 to 4096, or "inf".', "invalid_value")
        return given

    def _voice(self, served: PlanContext, voice: str, param: str) -> str:
        served.check_voice(voice, param)
        return voice

    def _turn_detection(self, td: TurnDetection | None) -> TurnDetectionOut | None:
        if td is None:
            return None
        param = "session.audio.input.turn_detection"
        if td.type != "server_vad":
            raise unsupported(
                f"{param}.type",
                f"omnix finds turns with server_vad only, not {td.type!r}.",
            )
        if not self.audio_in:
            raise unsupported(param, f"the pipeline {self.model!r} takes no audio input.")
        missing = vad.available()
        if missing is not None:
            raise unsupported(param, f"{missing}; send null and commit turns yourself.")
        out = TurnDetectionOut()
        for name in ("threshold", "prefix_padding_ms", "silence_duration_ms"):
            value = getattr(td, name)
            if value is not None:
                if value < 0 or (name == "threshold" and value > 1):
                    raise unsupported(f"{param}.{name}", "out of range.", "invalid_value")
                setattr(out, name, value)
        if td.idle_timeout_ms is not None:
            raise unsupported(
                f"{param}.idle_timeout_ms", "idle timeouts are not offered; send null."
            )
        for name in ("create_response", "interrupt_response"):
            value = getattr(td, name)
            if value is not None:
                setattr(out, name, value)
        return out

    # -- session.update --------------------------------------------------------

    def update(self, served: PlanContext, u: SessionUpdate) -> SessionConfig:
        """A new configuration with ``u`` applied (self is left as it was)."""
        new = replace(self)
        if u.type is not UNSET and u.type != "realtime":
            raise unsupported("session.type", f'omnix serves "realtime" sessions, not {u.type!r}.')
        if u.model is not UNSET:
            served.check_model(u.model)
        _refuse_prompt(u.prompt, "session")
        if u.tools is not UNSET or u.tool_choice is not UNSET:
            new.tools = self.tools.checked(served, u.tools, u.tool_choice, "session")
        new.tools = new.tools.with_parallel(u.parallel_tool_calls)
        if u.include:
            raise unsupported(
                "session.include",
                "omnix gives no log probabilities of input transcripts; send null or [].",
            )
        if u.instructions is not UNSET:
            new.instructions = u.instructions
        if u.output_modalities is not UNSET:
            new.modalities = self._modalities(u.output_modalities, "session.output_modalities")
        if u.max_output_tokens is not UNSET:
            new.max_output_tokens = self._max_tokens(
                u.max_output_tokens, "session.max_output_tokens"
            )
        if u.audio is not UNSET:
            self._audio(served, new, u)
        return new

    def _audio(self, served: PlanContext, new: SessionConfig, u: SessionUpdate) -> None:
        audio = u.audio
        assert audio is not UNSET
        if audio.input is not UNSET:
            inp = audio.input
            if inp.format is not UNSET:
                self._format(inp.format, "session.audio.input.format")
            if inp.noise_reduction not in (UNSET, None):
                raise unsupported("session.audio.input.noise_reduction", "not offered; send null.")
            if inp.transcription is not UNSET:
                new.transcription = _transcription(served, inp.transcription)
            if inp.turn_detection is not UNSET:
                new.turn_detection = self._turn_detection(inp.turn_detection)
        if audio.output is not UNSET:
            out = audio.output
            if out.format is not UNSET:
                self._format(out.format, "session.audio.output.format")
            if out.speed is not UNSET and out.speed != 1.0:
                raise unsupported(
                    "session.audio.output.speed", "no engine changes the speaking rate; send 1."
                )
            if out.voice is not UNSET:
                new.voice = self._voice(served, out.voice, "session.audio.output.voice")

    # -- response.create -------------------------------------------------------

    def for_response(self, served: PlanContext, p: ResponseParams | None) -> ResponseConfig:
        base = ResponseConfig(
            instructions=self.instructions,
            modalities=self.modalities,
            voice=self.voice,
            max_output_tokens=self.max_output_tokens,
            tools=self.tools,
        )
        changes: dict[str, Any] = {}
        if p is not None and (p.tools is not UNSET or p.tool_choice is not UNSET):
            changes["tools"] = self.tools.checked(served, p.tools, p.tool_choice, "response")
        else:  # the session's choice, kept until it had tools (Tools.checked)
            self.tools.check_choice("session.tool_choice")
        if p is None:
            return base
        if p.parallel_tool_calls is not UNSET:
            tools = changes.get("tools", self.tools)
            changes["tools"] = tools.with_parallel(p.parallel_tool_calls)
        _refuse_prompt(p.prompt, "response")
        if p.instructions is not UNSET and p.instructions is not None:
            changes["instructions"] = p.instructions
        if p.output_modalities is not UNSET:
            changes["modalities"] = self._modalities(
                p.output_modalities, "response.output_modalities"
            )
        if p.max_output_tokens is not UNSET:
            changes["max_output_tokens"] = self._max_tokens(
                p.max_output_tokens, "response.max_output_tokens"
            )
        if p.audio is not UNSET and p.audio.output is not UNSET:
            out = p.audio.output
            if out.format is not UNSET:
                self._format(out.format, "response.audio.output.format")
            if out.voice is not UNSET:
                changes["voice"] = self._voice(served, out.voice, "response.audio.output.voice")
        if p.conversation is not UNSET:
            if p.conversation not in ("auto", "none"):
                raise unsupported(
                    "response.conversation",
                    'a session has one conversation: give "auto" or "none".',
                    "invalid_value",
                )
            changes["conversation"] = p.conversation == "auto"
        if p.metadata not in (UNSET, None):
            changes["metadata"] = dict(p.metadata)
        return replace(base, **changes)


def _refuse_prompt(prompt: Any, where: str) -> None:
    if prompt not in (UNSET, None):
        raise unsupported(f"{where}.prompt", "stored prompts are not offered; send instructions.")


def _transcription(served: PlanContext, t: Transcription | None) -> TranscriptionSettings | None:
    """Input transcription's settings, checked as ``POST
    /v1/audio/transcriptions`` checks its form (None: off)."""
    if t is None:
        return None
    param = "session.audio.input.transcription"
    for name, why in (
        ("delay", "omnix transcribes a committed turn whole, once"),
        ("keywords", "give words the audio contains in prompt instead"),
        ("languages", "give one ISO-639-1 code in language instead"),
    ):
        if getattr(t, name) is not None:
            raise unsupported(f"{param}.{name}", f"not offered ({why}); send null.")
    try:
        transcribe.check_pipeline(served)
    except ApiError as err:
        raise unsupported(param, err.message, err.code or "unsupported_value") from None
    model = t.model or served.model
    if model not in served.names:
        names = " or ".join(repr(n) for n in served.names)
        raise unsupported(
            f"{param}.model",
            f"omnix transcribes with the model it serves, {names}, not {model!r}; "
            "give that name, or omit model.",
            "model_not_found",
        )
    texts = {"model": model}
    for name in ("language", "prompt"):
        value = getattr(t, name)
        if value is not None:
            texts[name] = value
    try:
        form = transcribe.checked_form(texts)
    except ApiError as err:
        where = f"{param}.{err.param}" if err.param else param
        raise unsupported(where, err.message, err.code or "invalid_value") from None
    return TranscriptionSettings(
        model=model, language=form.language or "", prompt=form.prompt or ""
    )
