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

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

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

    def __init__(self, model: Any, groups: int, chunk: int, context: int, first: int = 0) -> None:
        self.model = model
        self.groups = groups
        self.chunk = chunk
        self.context = context
        #: the first chunk's frames (0: ``chunk``): Qwen3-TTS's early first packet
        self.first = first or chunk
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

    def slices(self, final: bool) -> list[Slice]:
        """Every chunk now complete (with ``final``, the rest too), as the
        codes to decode with their left context."""
        out = []
        while self.start < len(self.frames):
            size = self.first if self.start == 0 else self.chunk
            end = min(self.start + size, len(self.frames))
            if end - self.start < size and not final:
                break
            # chunked_decode's rule, kept to the letter (including its ">").
            ctx = self.context if self.start - self.context > 0 else self.start
            out.append(Slice(np.stack(self.frames[self.start - ctx : end], axis=1), ctx))
            self.start = end
        return out


class Slice(NamedTuple):
    """One chunk to decode: its codes with context ([groups, frames]) and
    how many of those frames are context (their samples are dropped)."""

    codes: np.ndarray
    context: int


def decode_slices(model: Any, slices: list[Slice]) -> list[np.ndarray]:
    """Each slice's PCM; slices of one length decode in one forward."""
    import torch

    upsample = int(model.total_upsample)
    out: list[np.ndarray | None] = [None] * len(slices)
    by_length: dict[int, list[int]] = {}
    for i, s in enumerate(slices):
        by_length.setdefault(s.codes.shape[1], []).append(i)
    for rows in by_length.values():
        codes = torch.from_numpy(np.stack([slices[i].codes for i in rows]))
        with torch.no_grad():
            wav: torch.Tensor = model(codes.to(_device(model)))
        pcm = wav[:, 0].float().cpu().numpy()
        for j, i in enumerate(rows):
            out[i] = pcm[j, slices[i].context * upsample :]
    return [p for p in out if p is not None]


class ChunkBatcher:
    """The ready chunks of every request of a worker, decoded together: a
    request hands its slices in and awaits their PCM; what arrives while a
    batch decodes goes in the next one (at most ``limit`` slices a batch)."""

    def __init__(self, thread: DecoderThread, model: Any, limit: int) -> None:
        self.thread, self.model, self.limit = thread, model, limit
        self._pending: list[tuple[Slice, asyncio.Future[np.ndarray]]] = []
        self._task: asyncio.Task[None] | None = None

    async def decode(self, slices: list[Slice]) -> list[np.ndarray]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in slices]
        self._pending += zip(slices, futures, strict=True)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="omnix-code2wav-batch")
        return list(await asyncio.gather(*futures))

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(0)  # the other requests' ready chunks join
            batch, self._pending = self._pending[: self.limit], self._pending[self.limit :]
            try:
                pcm = await self.thread.run(decode_slices, self.model, [s for s, _ in batch])
            except Exception as exc:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut), p in zip(batch, pcm, strict=True):
                if not fut.done():
                    fut.set_result(p)


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def load_code2wav(folder: Path, device: str, dtype: str = "float32") -> Any:
    """transformers' ``Qwen3OmniMoeCode2Wav`` with the checkpoint's
    ``code2wav.*`` weights (the thinker and talker are not loaded), in
    ``dtype``."""
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
    return model.to(device=device, dtype=getattr(torch, dtype)).eval()


class Code2WavEngine:
    """``Engine`` over Qwen3-Omni's Code2Wav.  Built as ``Code2WavEngine(args)``;
    ``model`` hands it a module already built instead of loading ``args.model``."""

    KIND = "code2wav"

    def __init__(self, args: Code2WavArgs, model: Any = None) -> None:
        self.args = args
        self._prebuilt = model
        self.model: Any = None
        self.device = "cpu"
        self._thread = DecoderThread("code2wav")
        self._batcher: ChunkBatcher | None = None

    async def start(self) -> EngineInfo:
        # On the loop's thread, not first in the pool's (see TalkerEngine.start).
        import transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe  # noqa: F401

        if self._prebuilt is not None:
            folder, self.model = self.args.model, self._prebuilt
            self.device = self._thread.open(str(_device(self.model)))
        else:
            folder = str(resolve_model(self.args.model))
            self.device = self._thread.open(self.args.device)
            self.model = await self._thread.run(
                self._load, Path(folder), self.device, self.args.dtype
            )
        limit = self.args.batch_chunks or (CAPACITY if self.device.startswith("cuda") else 1)
        self._batcher = ChunkBatcher(self._thread, self.model, limit) if limit > 1 else None
        if self.device.startswith("cuda"):
            await self._thread.run(self._warm)
        return EngineInfo(
            engine=self.KIND, capacity=CAPACITY, device=self.device, model=str(folder)
        )

    # _load, _groups and _decoder are what a decoder of another model's
    # codes replaces (``speech_decoder.SpeechDecoderEngine``).
    @staticmethod
    def _load(folder: Path, device: str, dtype: str) -> Any:
        return load_code2wav(folder, device, dtype)

    def _groups(self) -> int:
        return int(self.model.config.num_quantizers)

    def _decoder(self) -> ChunkedDecoder:
        return ChunkedDecoder(
            self.model, self._groups(), self.args.chunk_frames, self.args.context_frames
        )

    def _warm(self) -> None:
        """Decode each chunk shape a stream meets once (the first chunk, a
        chunk with context): a shape's first run on CUDA pays for kernel
        selection, which a request's first packet should not."""
        import torch

        groups = self._groups()
        dec = self._decoder()
        for frames in {dec.first, dec.chunk + dec.context}:
            codes = torch.zeros(1, groups, frames, dtype=torch.long, device=_device(self.model))
            with torch.no_grad():
                self.model(codes)

    async def _decode(self, slices: list[Slice]) -> list[np.ndarray]:
        if not slices:
            return []
        if self._batcher is not None:
            return await self._batcher.decode(slices)
        return await self._thread.run(decode_slices, self.model, slices)

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
        dec = self._decoder()
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
                for pcm in await self._decode(dec.slices(final)):
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
