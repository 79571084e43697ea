"""Qwen3-TTS's talker as a stage engine (engine kind ``qwen3_tts_talker``).

Owns: ``Qwen3TTSEngine``, the talker engine (``talker_engine.py``: its
batched decode loop, cancellation, continuation and static decoding) over
``Qwen3TTSTalker``: a source stage whose input is the request's text, and
whose prefill is the one ``Qwen3TTSTalker.prompt`` builds from it and the
stage's ``voice`` (a CustomVoice speaker; ``default``: the checkpoint's
first by codec id, as ``GET /v1/audio/voices`` lists them; VoiceDesign has
none), ``instructions`` (CustomVoice's instruction, VoiceDesign's
description of the voice) and ``language``.  Every frame after the prefill
reads the prompt's trailing text vectors, then ``tts_pad``: the whole text
is in the prefill, so nothing waits for more.

Does not own: the prompt or the model (``qwen3_tts_talker.py``), the
waveform (``speech_decoder.py``), nor checking a request against the
checkpoint before admission (the HTTP plan: ``omnix.http.audio.speech``).

Output: as the Qwen3-Omni talker's, one ``codec`` output per frame (all
16 groups), then the counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omnix.engines.talker_engine import TalkerEngine, _Request
from omnix.pipelines.config import Qwen3TTSTalkerArgs
from omnix.transport.work import EngineInfo, InputPiece

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import torch

    from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker
    from omnix.engines.talker_model import Conditioning


class Qwen3TTSEngine(TalkerEngine):
    """``Engine`` over a Qwen3-TTS CustomVoice or VoiceDesign talker."""

    KIND = "qwen3_tts_talker"
    args: Qwen3TTSTalkerArgs
    model: Qwen3TTSTalker | None

    async def start(self) -> EngineInfo:
        # On the loop's thread before the pool's (see TalkerEngine.start).
        import omnix.models.qwen3_tts_modules  # noqa: F401

        return await super().start()

    @staticmethod
    def _load(folder: str, device: str, dtype: str) -> Qwen3TTSTalker:
        from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker

        return Qwen3TTSTalker.load(folder, device, dtype)

    async def _feed(self, req: _Request, inputs: AsyncIterator[InputPiece]) -> None:
        try:
            async for piece in inputs:
                req.utterance += piece.text
        except Exception as exc:  # a bad piece fails the request, not the engine
            req.queue.put_nowait(exc)
            return
        req.done = True
        self._wake.set()

    def _can_prefill(self, req: _Request) -> bool:
        return req.done and (self._graphs is None or self._graphs.free > 0)

    def _voice(self, req: _Request) -> str | None:
        model = self.model
        assert model is not None
        voice = req.request.params.voice or self.args.voice
        if voice and voice != "default":
            return voice
        speakers = model.layout.speakers
        return min(speakers, key=speakers.__getitem__) if speakers else None

    def _conditioning(self, req: _Request) -> Conditioning | None:
        from omnix.engines.qwen3_tts_talker import SpeechRequest

        model = self.model
        assert model is not None
        if not req.utterance.strip():
            return None
        p = req.request.params
        prompt = model.prompt(
            SpeechRequest(
                text=req.utterance,
                speaker=self._voice(req),
                language=p.language or "auto",
                instruct=p.instructions or None,
            )
        )
        req.trailing = dict(enumerate(prompt.trailing))
        cond: Conditioning = prompt.prefill
        return cond

    def _trailing(self, req: _Request, j: int) -> torch.Tensor | None:
        assert self.model is not None
        row: Any = req.trailing.get(j, self.model.tts_pad)
        return row
