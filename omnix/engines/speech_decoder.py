"""Qwen3-TTS's 12 Hz speech decoder: codes -> 24 kHz waveform.

Owns: ``SpeechCodec``, which loads a Qwen3-TTS folder's
``speech_tokenizer/`` decoder (every ``decoder.*`` tensor, none missing or
left over) and decodes an utterance's codes ([frames, 16]) into float32
samples (1,920 a frame) chunked as the reference's tokenizer decodes them
(300 frames a chunk, each with 25 frames of left context), so the samples
are the reference's for the same codes; ``decode_after``, a cloned voice's
new codes decoded after its reference codes and the reference's share cut
off, as the reference's ``generate_voice_clone`` cuts it.

Also owns ``SpeechDecoderEngine``, the decoder as a streaming stage
(engine kind ``qwen3_tts_decoder``): Code2Wav's engine (chunks decoded as
their frames arrive, each with its left context) over this decoder, with a
short first chunk; its waveform is ``SpeechCodec.decode`` of the same codes
with the stage's chunk sizes.  A voice cloned in context (its first input
piece's ``array``: the reference codes, [frames, 16]) is
``SpeechCodec.decode_after`` of them and the frames that follow, decoded
once the frames end: the reference's cut depends on how many there are.

Does not own: the decoder's modules (``omnix.models.qwen3_tts_modules``),
the tokenizer's encoder (reference audio -> codes: ``qwen3_tts_clone.py``), nor the
streaming itself (``code2wav_engine.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from omnix.engines.code2wav_engine import ChunkedDecoder, Code2WavEngine
from omnix.engines.decoding import Delivered
from omnix.pipelines.config import Qwen3TTSDecoderArgs
from omnix.transport.work import EngineOutput, GenerateRequest, InputPiece

if TYPE_CHECKING:
    import torch

SPEECH_TOKENIZER_DIR = "speech_tokenizer"
#: The reference tokenizer's ``chunked_decode`` defaults.
CHUNK_FRAMES = 300
LEFT_CONTEXT_FRAMES = 25


class SpeechCodec:
    """The decoder of one 12 Hz speech tokenizer, on one device."""

    def __init__(self, decoder: Any, sample_rate: int, samples_per_frame: int) -> None:
        self.decoder = decoder
        self.sample_rate = sample_rate
        self.samples_per_frame = samples_per_frame
        self.device = next(decoder.parameters()).device

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu") -> SpeechCodec:
        """From a Qwen3-TTS folder (its ``speech_tokenizer/``) or a speech
        tokenizer folder itself."""
        from omnix.engines.checkpoint import load_exact
        from omnix.models.qwen3_tts_modules import SpeechDecoder, read_config

        folder = Path(folder)
        if (folder / SPEECH_TOKENIZER_DIR / "config.json").exists():
            folder = folder / SPEECH_TOKENIZER_DIR
        cfg = read_config(folder)
        if cfg.get("model_type") != "qwen3_tts_tokenizer_12hz":
            raise ValueError(
                f"{folder} is not a 12 Hz Qwen3-TTS speech tokenizer ({cfg.get('model_type')})"
            )
        decoder = load_exact(
            SpeechDecoder(cfg["decoder_config"]), folder, "decoder.", "12 Hz decoder"
        )
        return cls(
            decoder.to(device),
            int(cfg["output_sample_rate"]),
            int(cfg["decode_upsample_rate"]),
        )

    def decode(
        self,
        codes: torch.Tensor,
        chunk: int = CHUNK_FRAMES,
        context: int = LEFT_CONTEXT_FRAMES,
        first: int = 0,
    ) -> torch.Tensor:
        """[frames, 16] codes -> [frames x 1920] float32 samples in [-1, 1],
        cut as the reference cuts them unless told otherwise (a serving
        stage's ``first`` / ``chunk`` / ``context`` frames)."""
        import torch

        with torch.inference_mode():
            wav = self.decoder.chunked(codes.T[None].to(self.device), chunk, context, first)
        return wav[0, 0, : codes.shape[0] * self.samples_per_frame].float().cpu()

    def decode_after(self, prefix: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """The samples of ``codes`` continuing ``prefix`` (a cloned voice's
        reference codes): the two decoded as one utterance, the prefix's
        share cut off at the reference's proportional offset."""
        import torch

        wav = self.decode(torch.cat([prefix.to(codes), codes]))
        cut = int(prefix.shape[0] / max(prefix.shape[0] + codes.shape[0], 1) * wav.shape[0])
        return wav[cut:]


class SpeechDecoderEngine(Code2WavEngine):
    """``Engine`` over the 12 Hz decoder: Code2Wav's streaming, this model."""

    KIND = "qwen3_tts_decoder"
    args: Qwen3TTSDecoderArgs

    @staticmethod
    def _load(folder: Path, device: str, dtype: str) -> Any:
        import torch

        return SpeechCodec.load(folder, device).decoder.to(getattr(torch, dtype))

    def _decoder(self) -> ChunkedDecoder:
        a = self.args
        return ChunkedDecoder(
            self.model, self._groups(), a.chunk_frames, a.context_frames, a.first_chunk_frames
        )

    async def _generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        pieces = aiter(inputs)
        first = await anext(pieces, None)
        if first is None or first.array is None:
            async for out in super()._generate(request, _again(first, pieces)):
                yield out
            return
        async for out in self._after_reference(request, first, pieces):
            yield out

    async def _after_reference(
        self, request: GenerateRequest, first: InputPiece, pieces: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        """A voice cloned in context: every frame in, then ``decode_after``."""
        import torch

        if self.model is None:
            raise RuntimeError("SpeechDecoderEngine.generate before start() (or after close())")
        rid, th, groups = request.request_id, self._thread, self._groups()
        th.begin(rid)
        try:
            prefix = torch.from_numpy(np.asarray(first.array, dtype=np.int64).reshape(-1, groups))
            ids = list(first.token_ids)
            async for piece in pieces:
                ids += piece.token_ids
                if rid in th.aborted:
                    return
            frames = len(ids) // groups
            codes = torch.tensor(ids[: frames * groups], dtype=torch.long).reshape(frames, groups)
            # decode_after reads no sample rate.
            codec = SpeechCodec(self.model, 0, int(self.model.total_upsample))
            wav = await th.run(codec.decode_after, prefix, codes)
            if rid in th.aborted:
                return
            pcm = Delivered(request).drop(wav.numpy())
            if pcm.size:
                yield EngineOutput(modality="audio", array=pcm)
            yield EngineOutput(
                modality="audio",
                finish_reason="stop",
                prompt_tokens=len(ids),
                output_tokens=frames,
            )
        finally:
            th.end(rid)


async def _again(
    first: InputPiece | None, rest: AsyncIterator[InputPiece]
) -> AsyncIterator[InputPiece]:
    """``first`` (already read), then the rest."""
    if first is not None:
        yield first
    async for piece in rest:
        yield piece
