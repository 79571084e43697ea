"""Qwen3-Omni's Code2Wav as a streaming stage: code frames in, 24 kHz PCM out.

Owns: ``Code2WavEngine``, which loads transformers' ``Qwen3OmniMoeCode2Wav``
(its module and the checkpoint's ``code2wav.*`` weights) and decodes each
request's frames as they arrive, and ``ChunkedDecoder``, the streaming
form of the reference's ``chunked_decode``.  Does not own the talker that
produces the frames (``talker_engine.py``).

Exactness: Code2Wav's causal convolutions trim samples at every chunk's
edge, so a waveform depends on how its codes were cut.  The streamed
waveform is *defined* as ``chunked_decode(codes, chunk_size,
left_context_size)`` of the same codes with the stage's chunk and context
sizes, and ``ChunkedDecoder`` computes exactly that, sample for sample: it
decodes the same slices with the same module as soon as each chunk's
frames are in (the last chunk, shorter, when the input ends).

Input: ``InputPiece.token_ids`` are frames in frame-major order
(``num_quantizers`` codes a frame, as the talker emits them); pieces may
split frames anywhere.  Output: ``EngineOutput(modality="audio")`` arrays
of float32 PCM, then a payload-free output with the counts.

Continuation (``request.resume``): every frame is sent again; decoding is
deterministic, so the engine re-decodes from the start and drops exactly
the ``resume.samples`` samples already delivered.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from omnix.engines.checkpoint import tensors_under
from omnix.engines.decoding import DecoderThread, Delivered
from omnix.models.paths import resolve_model
from omnix.pipelines.config import Code2WavArgs
from omnix.transport.work import EngineInfo, EngineOutput, GenerateRequest, InputPiece

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

#: Streams one worker decodes side by side (they share one decode thread).
CAPACITY = 16


class ChunkedDecoder:
    """One request's decoder: frames go in as they come, and each chunk of
    ``chunk`` frames (with ``context`` frames of left context) is decoded
    as soon as it is complete, exactly as ``chunked_decode`` cuts it."""

    def __init__(self, model: Any, groups: int, chunk: int, context: int) -> None:
        self.model = model
        self.groups = groups
        self.chunk = chunk
        self.context = context
        self.upsample = int(model.total_upsample)
        self.frames: list[np.ndarray] = []  # [groups] each
        self._partial: list[int] = []
        self.start = 0  # first frame of the next chunk

    def push(self, codes: list[int] | tuple[int, ...]) -> None:
        self._partial.extend(codes)
        whole = len(self._partial) // self.groups * self.groups
        for i in range(0, whole, self.groups):
            self.frames.append(np.asarray(self._partial[i : i + self.groups], dtype=np.int64))
        del self._partial[:whole]

    @property
    def dropped(self) -> int:
        """Codes of a trailing partial frame (never decoded)."""
        return len(self._partial)

    def ready(self, final: bool) -> list[np.ndarray]:
        """Decode every chunk now complete (with ``final``, the rest too)."""
        out = []
        while self.start < len(self.frames):
            end = min(self.start + self.chunk, len(self.frames))
            if end - self.start < self.chunk and not final:
                break
            out.append(self._decode(self.start, end))
            self.start = end
        return out

    def _decode(self, start: int, end: int) -> np.ndarray:
        import torch

        # chunked_decode's rule, kept to the letter (including its ">").
        ctx = self.context if start - self.context > 0 else start
        codes = torch.from_numpy(np.stack(self.frames[start - ctx : end], axis=1))[None]
        with torch.no_grad():
            wav: torch.Tensor = self.model(codes.to(_device(self.model)))
        return wav[0, 0, ctx * self.upsample :].float().cpu().numpy()


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def load_code2wav(folder: Path, device: str) -> Any:
    """transformers' ``Qwen3OmniMoeCode2Wav`` with the checkpoint's
    ``code2wav.*`` weights (the thinker and talker are not loaded)."""
    import torch
    from transformers import AutoConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    cfg = AutoConfig.from_pretrained(str(folder))
    if not getattr(cfg, "enable_audio_output", False):
        raise ValueError(
            f"{folder} has enable_audio_output false: it has no Code2Wav to serve; "
            "serve it as a text-only pipeline"
        )
    model = Qwen3OmniMoeCode2Wav._from_config(cfg.code2wav_config, dtype=torch.float32)
    state = tensors_under(folder, "code2wav.")
    if not state:
        raise FileNotFoundError(
            f"{folder} holds no code2wav.* weights: the checkpoint cannot speak; "
            "use a Qwen3-Omni folder with its Code2Wav, or ask for text only"
        )
    model.load_state_dict(state, strict=True)
    return model.to(device).eval()


class Code2WavEngine:
    """``Engine`` over Qwen3-Omni's Code2Wav.  Built as ``Code2WavEngine(args)``."""

    def __init__(self, args: Code2WavArgs) -> None:
        self.args = args
        self.model: Any = None
        self.device = "cpu"
        self._thread = DecoderThread("code2wav")

    async def start(self) -> EngineInfo:
        # On the loop's thread, not first in the pool's (see TalkerEngine.start).
        import transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe  # noqa: F401

        folder = resolve_model(self.args.model)
        self.device = self._thread.open(self.args.device)
        self.model = await self._thread.run(load_code2wav, folder, self.device)
        return EngineInfo(
            engine="code2wav", capacity=CAPACITY, device=self.device, model=str(folder)
        )

    def generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        return self._generate(request, inputs)

    async def _generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        if self.model is None:
            raise RuntimeError("Code2WavEngine.generate before start() (or after close())")
        rid, th = request.request_id, self._thread
        th.begin(rid)
        groups = int(self.model.config.num_quantizers)
        dec = ChunkedDecoder(self.model, groups, self.args.chunk_frames, self.args.context_frames)
        delivered = Delivered(request)
        codes_in = 0
        try:
            final = False
            pieces = aiter(inputs)
            while not final:
                try:
                    piece = await anext(pieces)
                    codes_in += len(piece.token_ids)
                    dec.push(piece.token_ids)
                except StopAsyncIteration:
                    final = True
                if rid in th.aborted:
                    return
                for pcm in await th.run(dec.ready, final):
                    pcm = delivered.drop(pcm)
                    if pcm.size:
                        yield EngineOutput(modality="audio", array=pcm)
                if rid in th.aborted:
                    return
            if dec.dropped:
                log.debug("request %s: dropped a partial frame of %d codes", rid, dec.dropped)
            yield EngineOutput(
                modality="audio",
                finish_reason="stop",
                prompt_tokens=codes_in,
                output_tokens=len(dec.frames),
            )
        finally:
            th.end(rid)

    async def abort(self, request_id: str) -> None:
        self._thread.abort(request_id)

    async def close(self) -> None:
        self._thread.close()
        self.model = None
