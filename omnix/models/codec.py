"""The torch codec decoder: codec codes -> 24 kHz mono float32 PCM.

Owns: ``CodecConfig`` (saved as the model folder's ``config.json``), the
``CodecDecoder`` module (code embeddings, then causal convolutions and
non-overlapping transposed-convolution upsampling), its save/load, and
``CodecStream``, the stateful streaming decoder.  Does not own the stage
plumbing (``omnix.engines.codec_engine``) nor building the tiny model's
weights (``build.py``).

Codec layout: ``num_codebooks`` (K) codebooks of ``codebook_size`` (C)
codes each, one frame of K codes per ``hop`` (= product of the upsample
rates, 320) output samples.  A code stream is *frame-major*: frame 0's codes
for codebooks 0..K-1, then frame 1's, ...; the codebook of a code is its
position modulo K.  Codes are in ``[0, C)`` in every codebook.

Exactness (what is guaranteed and why): every layer is causal with a finite
left context, so in exact arithmetic decoding chunk by chunk with carried
state equals decoding at once.  In float32 it does not by itself: oneDNN and
cuDNN pick kernels and blockings by input length, and a conv over 37 frames
rounds some outputs differently from the same conv over 120 (measured here:
about 2% of random split points differ in the last bit).  So the decoder
never runs on arbitrary lengths.  It runs in fixed *blocks* of
``block_frames`` frames with per-layer state, and every call has exactly the
same tensor shapes.  A block that is not yet complete is computed padded with
code 0 (outputs are causal, so padding changes no earlier sample in exact
arithmetic, and with identical shapes every real sample takes the identical
instruction path), its real samples are emitted, and its state is *not*
kept; when the block completes it is recomputed from the same state and only
the samples not yet emitted are emitted.  One-shot ``decode`` is the same
block loop.  Hence: streamed PCM is bit-identical to one-shot PCM for any
chunking, on one device with deterministic kernels (the engine sets
``cudnn.deterministic``).  ``decode_full`` (one pass over all frames, for
offline use) agrees with it only to float32 rounding (~1e-6).
"""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import numpy as np
import torch
import torch.nn.functional as F
from numpy.typing import ArrayLike
from torch import nn

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


class CodecConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The decoder's shape; saved as ``config.json`` in the model folder."""

    omnix_model: str = "code2wav"
    format: int = 1
    sample_rate: int = 24000
    num_codebooks: int = 2
    codebook_size: int = 1024
    dim: int = 128
    # Product is the hop (samples per frame): 8*5*4*2 = 320 -> 75 frames/s.
    upsample_rates: tuple[int, ...] = (8, 5, 4, 2)
    channels: tuple[int, ...] = (128, 64, 32, 16, 8)
    kernel_size: int = 7
    block_frames: int = 8
    out_scale: float = 0.5

    @property
    def hop(self) -> int:
        return math.prod(self.upsample_rates)


class _CausalConv(nn.Module):
    """Conv1d over ``[state, x]`` where ``state`` is the previous
    ``kernel-1`` input frames (zeros at the start): output t sees inputs
    t-kernel+1 .. t only."""

    def __init__(self, cin: int, cout: int, kernel: int):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel)
        self.context = kernel - 1

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inp = torch.cat([state, x], dim=-1)
        return self.conv(inp), inp[..., inp.shape[-1] - self.context :]


class CodecDecoder(nn.Module):
    """codes (K, T) -> PCM (T * hop,).  Use ``CodecStream`` or ``decode``."""

    offsets: torch.Tensor  # (K, 1) row offset of each codebook in ``embed`` (a buffer)

    def __init__(self, config: CodecConfig):
        super().__init__()
        if len(config.channels) != len(config.upsample_rates) + 1:
            raise ValueError("CodecConfig.channels needs one more entry than upsample_rates")
        self.config = config
        k = config.kernel_size
        # One table for all codebooks: codebook b's code c is row b*C + c.
        self.embed = nn.Embedding(config.num_codebooks * config.codebook_size, config.dim)
        self.pre = _CausalConv(config.dim, config.channels[0], 3)
        self.ups = nn.ModuleList()
        self.res = nn.ModuleList()
        for i, rate in enumerate(config.upsample_rates):
            cin, cout = config.channels[i], config.channels[i + 1]
            # kernel == stride: each frame owns exactly `rate` outputs, so
            # upsampling needs no overlap-add state across chunks.
            self.ups.append(nn.ConvTranspose1d(cin, cout, rate, stride=rate))
            self.res.append(_CausalConv(cout, cout, k))
        self.post = _CausalConv(config.channels[-1], 1, k)
        offsets = torch.arange(config.num_codebooks) * config.codebook_size
        self.register_buffer("offsets", offsets.view(-1, 1), persistent=False)

    def convs(self) -> list[_CausalConv]:
        return [self.pre, *self.res, self.post]

    def initial_state(self) -> list[torch.Tensor]:
        p = next(self.parameters())
        return [
            torch.zeros(1, c.conv.in_channels, c.context, dtype=p.dtype, device=p.device)
            for c in self.convs()
        ]

    def step(
        self, codes: torch.Tensor, state: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Decode ``codes`` (K, T) after ``state``; return PCM (T*hop,) and
        the state after it."""
        x = self.embed(codes + self.offsets).sum(0).T.unsqueeze(0)  # (1, dim, T)
        new_state = []
        x, s = self.pre(x, state[0])
        new_state.append(s)
        for i, (up, res) in enumerate(zip(self.ups, self.res, strict=True)):
            x = up(F.elu(x))
            y, s = res(F.elu(x), state[i + 1])
            x = x + y
            new_state.append(s)
        x, s = self.post(F.elu(x), state[-1])
        new_state.append(s)
        return torch.tanh(x).reshape(-1) * self.config.out_scale, new_state

    @torch.inference_mode()
    def decode(self, codes: ArrayLike) -> np.ndarray:
        """One-shot decode of a frame-major code sequence: the canonical
        result streaming reproduces bit for bit.  A trailing partial frame
        is dropped."""
        stream = CodecStream(self)
        return np.concatenate([stream.push(codes), stream.flush()])

    @torch.inference_mode()
    def decode_full(self, codes: ArrayLike) -> np.ndarray:
        """One pass over all frames (no blocks): fastest offline, equal to
        ``decode`` only within float32 rounding."""
        frames = _frames(codes, self.config.num_codebooks, self.config.codebook_size)
        dev = next(self.parameters()).device
        pcm, _ = self.step(torch.as_tensor(frames, device=dev), self.initial_state())
        return pcm.float().cpu().numpy()


def _frames(codes: ArrayLike, k: int, c: int) -> np.ndarray:
    arr = np.asarray(codes, dtype=np.int64).reshape(-1)
    n = arr.size // k
    arr = arr[: n * k]
    if arr.size and (arr.min() < 0 or arr.max() >= c):
        bad = arr[(arr < 0) | (arr >= c)][0]
        raise ValueError(
            f"codec code {int(bad)} is outside [0, {c}): is the talker's codec layout "
            "the same as the decoder's config.json?"
        )
    return arr.reshape(n, k).T  # (K, frames)


class CodecStream:
    """Streaming decode of one code sequence (one request).

    ``push(codes)`` takes any number of codes (not necessarily whole frames)
    and returns the new PCM samples; ``flush()`` ends the stream and returns
    what is left (nothing, by construction: every complete frame's samples
    are already out) and drops a trailing partial frame.  Concatenating every
    returned array equals ``decoder.decode(all codes)`` bit for bit.
    """

    def __init__(self, decoder: CodecDecoder):
        self.decoder = decoder
        cfg = decoder.config
        self.k, self.c, self.hop, self.block = (
            cfg.num_codebooks,
            cfg.codebook_size,
            cfg.hop,
            cfg.block_frames,
        )
        self.device = next(decoder.parameters()).device
        self.state = decoder.initial_state()
        self.partial: list[int] = []  # codes of an incomplete frame
        self.block_frames: np.ndarray = np.zeros((self.k, 0), dtype=np.int64)
        self.emitted = 0  # samples of the current block already returned
        self.frames_in = 0
        self.samples_out = 0
        self.dropped_codes = 0

    @torch.inference_mode()
    def push(self, codes: ArrayLike) -> np.ndarray:
        flat = [*self.partial, *np.asarray(codes, dtype=np.int64).reshape(-1).tolist()]
        whole = len(flat) // self.k * self.k
        self.partial = flat[whole:]
        if whole == 0:
            return np.zeros(0, dtype=np.float32)
        frames = _frames(flat[:whole], self.k, self.c)
        self.frames_in += frames.shape[1]
        self.block_frames = np.concatenate([self.block_frames, frames], axis=1)
        out: list[torch.Tensor] = []
        while self.block_frames.shape[1] >= self.block:
            pcm, self.state = self._run(self.block_frames[:, : self.block])
            out.append(pcm[self.emitted :])
            self.block_frames = self.block_frames[:, self.block :]
            self.emitted = 0
        n = self.block_frames.shape[1]
        if n and n * self.hop > self.emitted:
            padded = np.zeros((self.k, self.block), dtype=np.int64)
            padded[:, :n] = self.block_frames
            pcm, _ = self._run(padded)  # state of a padded block is never kept
            out.append(pcm[self.emitted : n * self.hop])
            self.emitted = n * self.hop
        res = torch.cat(out).float().cpu().numpy() if out else np.zeros(0, dtype=np.float32)
        self.samples_out += res.size
        return res

    def flush(self) -> np.ndarray:
        self.dropped_codes = len(self.partial)
        self.partial = []
        return np.zeros(0, dtype=np.float32)

    def _run(self, frames: np.ndarray) -> tuple[torch.Tensor, list[torch.Tensor]]:
        codes = torch.as_tensor(frames, device=self.device)
        return self.decoder.step(codes, self.state)


def save_codec(decoder: CodecDecoder, folder: Path) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_NAME).write_bytes(
        msgspec.json.format(msgspec.json.encode(decoder.config)) + b"\n"
    )
    state = {k: v.detach().contiguous().cpu() for k, v in sorted(decoder.state_dict().items())}
    save_file(state, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})


def load_codec(folder: Path, device: str | torch.device = "cpu") -> CodecDecoder:
    from safetensors.torch import load_file

    cfg_path = Path(folder) / CONFIG_NAME
    if not cfg_path.is_file():
        raise FileNotFoundError(
            f"codec model folder {folder} has no {CONFIG_NAME}: run `omnix models init` "
            "or point the stage's model at a folder saved by omnix.models.codec.save_codec"
        )
    config = msgspec.json.decode(cfg_path.read_bytes(), type=CodecConfig)
    decoder = CodecDecoder(config)
    decoder.load_state_dict(load_file(str(Path(folder) / WEIGHTS_NAME)))
    return decoder.to(device).eval()
