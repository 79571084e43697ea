"""The decoder stage engine: streamed codec codes in, PCM chunks out.

Owns: loading a ``CodecDecoder`` from a model folder onto a device, and
turning each request's stream of code pieces into audio outputs as the
pieces arrive.  Does not own the decoder's maths or its exactness argument
(``omnix.models.codec``), nor the talker that produces the codes.

Input: each ``InputPiece``'s ``token_ids`` (or a 1-D integer ``array``) are
codec codes in the frame-major layout of the model's ``config.json``; pieces
may split frames anywhere (a partial frame waits for the next piece).
Output: ``EngineOutput(modality="audio", array=float32 1-D PCM)`` per piece
that completed at least part of a frame, at the config's sample rate, then a
payload-free output with ``finish_reason="stop"``, ``prompt_tokens`` = codes
consumed and ``output_tokens`` = frames decoded.  Concatenating the arrays
equals the one-shot ``CodecDecoder.decode`` of all the codes, sample for
sample (bit-identical); a trailing partial frame at the end of the input is
dropped.  After ``abort`` nothing more is yielded for that request.

Continuation (``request.resume``, a stage execution migrated here after
``resume.samples`` samples were delivered): the engine gets every code
again, re-decodes from the start and drops exactly the first
``resume.samples`` samples it would have emitted.  Decoding is
deterministic and block-exact (``omnix.models.codec``), so the samples it
re-computes are the very bits the lost replica computed, whatever the
pieces' boundaries on either side, and the delivered audio plus the
continuation equals an undisturbed run's sample for sample.  Re-decoding
the prefix (instead of starting from a saved decoder state, which the log
does not hold) costs well under a millisecond per block.  The final
counts are the undisturbed run's (codes consumed, frames decoded).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import numpy as np

from omnix.engines.decoding import DecoderThread, Delivered
from omnix.models.paths import resolve_model
from omnix.pipelines.config import CodecArgs
from omnix.transport.work import EngineInfo, EngineOutput, GenerateRequest, InputPiece

if TYPE_CHECKING:  # imported by start(): importing torch costs ~1 s
    from omnix.models.codec import CodecDecoder

log = logging.getLogger(__name__)

# Decoding a piece takes well under a millisecond per block; many streams
# fit on one worker.  They share one decode thread (see start()).
CAPACITY = 16


class CodecEngine:
    """``Engine`` over ``CodecDecoder``.  Built as ``CodecEngine(args)``."""

    def __init__(self, args: CodecArgs) -> None:
        self.args = args
        self.decoder: CodecDecoder | None = None
        self.device = "cpu"
        self._thread = DecoderThread("codec")

    async def start(self) -> EngineInfo:
        from omnix.models.codec import load_codec

        folder = resolve_model(self.args.model)
        self.device = self._thread.open(self.args.device)
        self.decoder = await self._thread.run(load_codec, folder, self.device)
        rate = self.decoder.config.sample_rate
        if rate != self.args.sample_rate:
            raise ValueError(
                f"stage says sample_rate {self.args.sample_rate} but {folder}/config.json decodes "
                f"at {rate} Hz: set the stage's sample_rate to {rate}"
            )
        return EngineInfo(engine="codec", capacity=CAPACITY, device=self.device, model=str(folder))

    def generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        return self._generate(request, inputs)

    async def _generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        from omnix.models.codec import CodecStream

        if self.decoder is None:
            raise RuntimeError("CodecEngine.generate before start() (or after close())")
        rid, th = request.request_id, self._thread
        th.begin(rid)
        stream = CodecStream(self.decoder)
        codes_in = 0
        delivered = Delivered(request)
        try:
            async for piece in inputs:
                if rid in th.aborted:
                    return
                codes = _codes_of(piece)
                if codes.size == 0:
                    continue
                codes_in += codes.size
                pcm = delivered.drop(await th.run(stream.push, codes))
                if rid in th.aborted:
                    return
                if pcm.size:
                    yield EngineOutput(modality="audio", array=pcm)
            stream.flush()
            if delivered.left:
                log.warning(
                    "request %s: resumed after %d samples but its input decodes to %d",
                    rid,
                    request.resume.samples if request.resume else 0,
                    stream.samples_out,
                )
            if stream.dropped_codes:
                log.debug(
                    "request %s: dropped a partial frame of %d codes", rid, stream.dropped_codes
                )
            yield EngineOutput(
                modality="audio",
                finish_reason="stop",
                prompt_tokens=codes_in,
                output_tokens=stream.frames_in,
            )
        finally:
            th.end(rid)

    async def abort(self, request_id: str) -> None:
        self._thread.abort(request_id)

    async def close(self) -> None:
        self._thread.close()
        self.decoder = None


def _codes_of(piece: InputPiece) -> np.ndarray:
    if piece.token_ids:
        return np.asarray(piece.token_ids, dtype=np.int64)
    if piece.array is not None:
        arr = np.asarray(piece.array)
        if arr.dtype.kind not in "iu":
            raise ValueError(f"codec stage got a {arr.dtype} array; it decodes integer codec codes")
        return arr.astype(np.int64).reshape(-1)
    if piece.text:
        raise ValueError(
            "codec stage got a text piece: its input must be codec codes (token_ids), "
            "e.g. from a talker stage with output_modality 'codec'"
        )
    return np.zeros(0, dtype=np.int64)
