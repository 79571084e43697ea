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
its audio part the reference audio, its ``speaker`` part the audio's
speaker vector (the server's, recorded with the request; encoded here
when a request has none), its content the transcript (with one,
in-context cloning; without, the speaker vector alone).  Every frame after the prefill
reads the prompt's trailing text vectors, then ``tts_pad``: the whole text
is in the prefill, so nothing waits for more.

A request whose input streams (``GenerateRequest.input_streams``: the
speech stream's sentences, each an input piece) is spoken in the
reference's streaming-text mode instead: its prefill holds the first
piece's first token, its frames read the rest a token each, and each
later piece (joined with a space, none after a wide character) is
tokenized as it comes and read after them; a frame whose text is not in
yet waits (the talker engine sets its row aside), and ``tts_eos`` follows
the last.  Its codes are the reference's streaming-text codes of the
joined text, however the pieces were timed.  A Base voice cloned in
context, and a continuation after delivered frames, wait for the whole
text (their prefill holds it).

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
import bisect
import unicodedata
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
                # messages and media first: the engine's thread reads the
                # utterance, and a prefill must find what came with it.
                req.messages += piece.messages
                req.media += piece.media
                req.utterance = _joined(req.utterance, piece.text)
                req.piece_ends.append(len(req.utterance))  # after the text it ends
                if req.request.input_streams:
                    self._wake.set()
        except Exception as exc:  # a bad piece fails the request, not the engine
            req.queue.put_nowait(exc)
            return
        req.done = True
        self._wake.set()

    def _can_prefill(self, req: _Request) -> bool:
        if self._graphs is not None and self._graphs.free == 0:
            return False
        if req.done:
            return True
        # Text streaming in: the prefill needs the first words, unless it
        # must hold the whole text (see the module's docstring).
        if not req.request.input_streams or req.forced or self.cloner is not None:
            return False
        ends = req.piece_ends
        return bool(ends) and bool(req.utterance[: ends[-1]].strip())

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
        done = req.done  # before the text: once done, the text read is whole
        ends = list(req.piece_ends)
        text = req.utterance
        if done and not text.strip():
            return None
        streams = req.request.input_streams
        first = len(ends) - 1  # the last piece the prefill holds
        if streams and self.cloner is None:
            # The pieces up to the first with words; later ones go in as
            # ``_trailing`` reads them, each starting a row of its own.
            first = next(k for k, end in enumerate(ends) if text[:end].strip())
            text = text[: ends[first]]
        p = req.request.params
        clone = self._clone(req)
        prompt = model.prompt(
            SpeechRequest(
                text=text,
                speaker=None if clone is not None else self._voice(req),
                language=p.language or "auto",
                instruct=p.instructions or None,
                non_streaming=not streams,
                clone=clone,
            )
        )
        if streams and prompt.open:
            # Less the tts_eos the prompt ends its text with: later text
            # goes before it (``_trailing``).
            req.trailing = dict(enumerate(prompt.trailing[:-1]))
            req.said, req.pieces_said = len(text), first + 1
            req.piece_rows = [0] * req.pieces_said
        else:
            req.trailing = dict(enumerate(prompt.trailing))
        req.reference = None if clone is None else clone.codes
        cond: Conditioning = prompt.prefill
        return cond

    def _clone(self, req: _Request) -> VoiceClone | None:
        """Base: the voice of the request's reference audio (the first audio
        part of its messages; their content, its transcript), with the
        speaker vector its first ``speaker`` part carries (the one the
        server made at admission or upload, and the log holds) when there
        is one, else the vector encoded here."""
        if self.cloner is None:
            return None
        import numpy as np
        import torch

        kinds = [(m, part.kind, part.rate) for m in req.messages for part in m.media]
        audio = next((i for i, (_, k, _) in enumerate(kinds) if k == "audio"), None)
        vector = next((i for i, (_, k, _) in enumerate(kinds) if k == "speaker"), None)
        if audio is None or audio >= len(req.media):
            raise ValueError(
                "a Qwen3-TTS Base talker clones a voice: the request carries no reference "
                "audio (send ref_audio, a 24 kHz WAV data URL)"
            )
        message, _, rate = kinds[audio]
        wav = torch.from_numpy(np.array(req.media[audio], dtype=np.float32))
        speaker = None
        if vector is not None and vector < len(req.media):
            speaker = torch.from_numpy(np.array(req.media[vector]))
        return self.cloner.clone(wav, rate, message.content.strip() or None, speaker=speaker)

    def _prefilled(
        self, req: _Request
    ) -> list[tuple[_Request, EngineOutput | BaseException | None]]:
        out = super()._prefilled(req)
        resume = req.request.resume
        if req.reference is not None and (resume is None or resume.chunks == 0):
            codes = req.reference.to("cpu").numpy().astype("int64")
            out.insert(0, (req, EngineOutput(modality="codec", array=codes)))
        return out

    def _trailing(self, req: _Request, j: int) -> torch.Tensor | None:
        model = self.model
        assert model is not None
        row: Any = req.trailing.get(j)
        if row is not None:
            return row
        if req.said < 0:  # the prompt held the whole text
            return model.tts_pad
        done = req.done  # before the text, as in _conditioning
        if req.pieces_said < len(req.piece_ends):
            self._read_pieces(req)
        if j in req.trailing:
            return req.trailing[j]
        if not done:
            return None  # the row waits for the next piece
        return model.tts_eos if j == len(req.trailing) else model.tts_pad

    def _read_pieces(self, req: _Request) -> None:
        """The text vectors of the pieces that came since the last read."""
        model = self.model
        assert model is not None
        ends = list(req.piece_ends)
        text = req.utterance
        while req.pieces_said < len(ends):
            end = ends[req.pieces_said]
            n = len(req.trailing)
            req.piece_rows.append(n)
            for k, r in enumerate(model.text_after(text[req.said : end])):
                req.trailing[n + k] = r
            req.said, req.pieces_said = end, req.pieces_said + 1

    def _piece(self, req: _Request, j: int) -> int:
        """The piece whose text frame ``j`` reads (after the text: the last)."""
        return max(bisect.bisect_right(req.piece_rows, j) - 1, 0)


def _joined(text: str, piece: str) -> str:
    """``piece`` said after ``text``: a space between them, but none after
    a wide character (CJK text has no spaces) or where one side has it."""
    if not text or not piece or text[-1].isspace() or piece[0].isspace():
        return text + piece
    if unicodedata.east_asian_width(text[-1]) in ("W", "F"):
        return text + piece
    return f"{text} {piece}"
