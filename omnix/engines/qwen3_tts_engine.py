"""Qwen3-TTS's talker as a stage engine (engine kind ``qwen3_tts_talker``).

Owns: ``Qwen3TTSEngine``, the talker engine (``talker_engine.py``: its
batched decode loop, cancellation, continuation and static decoding) over
``Qwen3TTSTalker``: a source stage whose input is the request's text, and
whose prefill is the one ``Qwen3TTSTalker.prompt`` builds from it and the
stage's ``voice`` (a CustomVoice speaker; ``default``: the checkpoint's
first by codec id, as ``GET /v1/audio/voices`` lists them; VoiceDesign has
none), ``instructions`` (CustomVoice's instruction, VoiceDesign's
description of the voice) and ``language``; on Base, the voice cloned
(``VoiceCloner``, loaded beside the talker) from the request's message:
its audio part the reference audio, its content the transcript (with one,
in-context cloning; without, the speaker vector alone).  Every frame after the prefill
reads the prompt's trailing text vectors, then ``tts_pad``: the whole text
is in the prefill, so nothing waits for more.

Does not own: the prompt or the model (``qwen3_tts_talker.py``), the
waveform (``speech_decoder.py``), nor checking a request against the
checkpoint before admission (the HTTP plan: ``omnix.http.audio.speech``).

Output: as the Qwen3-Omni talker's, one ``codec`` output per frame (all
16 groups), then the counts; a voice cloned in context first has one
``codec`` output whose ``array`` is its reference codes ([frames, 16],
int64), which the decoder decodes the frames after
(``SpeechDecoderEngine``).  A continuation past it does not send it again.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from omnix.engines.talker_engine import TalkerEngine, _Request
from omnix.pipelines.config import Qwen3TTSTalkerArgs
from omnix.transport.work import EngineInfo, EngineOutput, InputPiece

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import torch

    from omnix.engines.qwen3_tts_clone import VoiceCloner
    from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker, VoiceClone
    from omnix.engines.talker_model import Conditioning


class Qwen3TTSEngine(TalkerEngine):
    """``Engine`` over a Qwen3-TTS CustomVoice, VoiceDesign or Base talker."""

    KIND = "qwen3_tts_talker"
    args: Qwen3TTSTalkerArgs
    model: Qwen3TTSTalker | None
    #: Base's speaker and tokenizer encoders (None on the other variants)
    cloner: VoiceCloner | None = None

    async def start(self) -> EngineInfo:
        # On the loop's thread before the pool's (see TalkerEngine.start).
        import omnix.models.qwen3_tts_modules  # noqa: F401

        info = await super().start()
        assert self.model is not None and self._pool is not None
        if self.model.variant == "base":
            from omnix.engines.qwen3_tts_clone import VoiceCloner

            loop = asyncio.get_running_loop()
            self.cloner = await loop.run_in_executor(self._pool, VoiceCloner.load, info.model)
        return info

    @staticmethod
    def _load(folder: str, device: str, dtype: str) -> Qwen3TTSTalker:
        from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker

        return Qwen3TTSTalker.load(folder, device, dtype)

    async def _feed(self, req: _Request, inputs: AsyncIterator[InputPiece]) -> None:
        try:
            async for piece in inputs:
                req.utterance += piece.text
                req.messages += piece.messages
                req.media += piece.media
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
        clone = self._clone(req)
        prompt = model.prompt(
            SpeechRequest(
                text=req.utterance,
                speaker=None if clone is not None else self._voice(req),
                language=p.language or "auto",
                instruct=p.instructions or None,
                clone=clone,
            )
        )
        req.trailing = dict(enumerate(prompt.trailing))
        req.reference = None if clone is None else clone.codes
        cond: Conditioning = prompt.prefill
        return cond

    def _clone(self, req: _Request) -> VoiceClone | None:
        """Base: the voice of the request's reference audio (the first audio
        part of its messages; their content, its transcript)."""
        if self.cloner is None:
            return None
        import torch

        parts = [(m, part) for m in req.messages for part in m.media]
        audio = [i for i, (_, part) in enumerate(parts) if part.kind == "audio"]
        if not audio or audio[0] >= len(req.media):
            raise ValueError(
                "a Qwen3-TTS Base talker clones a voice: the request carries no reference "
                "audio (send ref_audio, a 24 kHz WAV data URL)"
            )
        message, part = parts[audio[0]]
        wav = torch.from_numpy(req.media[audio[0]].copy())
        return self.cloner.clone(wav, part.rate, message.content.strip() or None)

    def _prefill(self, req: _Request) -> list[tuple[_Request, EngineOutput | BaseException | None]]:
        out = super()._prefill(req)
        resume = req.request.resume
        if req.reference is not None and (resume is None or resume.chunks == 0):
            codes = req.reference.to("cpu").numpy().astype("int64")
            out.insert(0, (req, EngineOutput(modality="codec", array=codes)))
        return out

    def _trailing(self, req: _Request, j: int) -> torch.Tensor | None:
        assert self.model is not None
        row: Any = req.trailing.get(j, self.model.tts_pad)
        return row
