"""Mimi frame by frame, both ways: 80 ms of PCM in, one frame of codes out
(``MimiEncodeStream``), and 80 ms of codes in, 80 ms of PCM out
(``MimiStream``).

Owns: ``MimiStream`` (over a transformers ``MimiModel``'s own modules) and
``DecodeState`` (one stream's carried state): the quantizer's decode, the
upsampling transposed convolution, the decoder transformer over its KV cache
and the SEANet decoder, each convolution carrying the input tail its
kernel still reads (causal convolutions) or the output tail the next frame
adds to (transposed convolutions, trimmed on the right as transformers'
causal ``MimiConvTranspose1d`` trims).  transformers' ``MimiModel.decode``
takes the whole code sequence at once: its convolutions pad from scratch
each call, so it cannot decode a stream frame by frame.

The frames decoded one at a time are the whole sequence's decode,
``MimiModel.decode(codes)``, cut into 1920-sample frames, up to float
rounding (the convolutions sum the same products over shorter inputs; the
transformer attends through a cache): tests/engines/test_duplex_model.py
states the tolerance.

``MimiEncodeStream`` and ``EncodeState`` are the encoder's counterpart:
the SEANet encoder's convolutions (strided ones included) carry the input
samples their next output still reads, the encoder transformer its KV
cache, the downsampling convolution its input tail (its first frame reads
the replicate padding transformers pads with), and the quantizer encodes
each frame alone.  The codes of 1920-sample frames encoded one at a time
are ``MimiModel.encode`` of the whole audio, every frame (a whole number of
frames needs no right padding in any convolution, so there is no edge
frame that differs): tests/engines/test_mimi_encode_stream.py.
transformers' own streaming encode (``use_streaming``) fails on the tiny
Mimi's 80 ms chunks, which is why omnix carries the state itself.

Does not own: which frames are encoded or decoded when (the duplex engine).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class DecodeState:
    """One stream's carry between frames."""

    cache: Any  # the decoder transformer's KV cache
    conv_inputs: dict[int, torch.Tensor] = field(default_factory=dict)
    transposed_tails: dict[int, torch.Tensor] = field(default_factory=dict)
    frames: int = 0


class MimiStream:
    """Streaming decode over one ``MimiModel`` (its weights unchanged)."""

    def __init__(self, mimi: Any) -> None:
        from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiConvTranspose1d

        self.mimi = mimi
        self.frame_samples = int(mimi.config.frame_size)
        modules = list(mimi.decoder.modules())
        if mimi.upsample is not None:
            modules.append(mimi.upsample)
        self._index: dict[int, int] = {}
        self._convs: dict[int, _Conv] = {}
        for m in modules:
            if isinstance(m, MimiConv1d):
                if int(m.stride) != 1 or not m.causal:
                    raise ValueError("Mimi's decoder convolutions must be causal with stride 1")
                self._convs[id(m)] = _Conv.of(m, len(self._index))
            elif isinstance(m, MimiConvTranspose1d):
                if m.padding_left != 0:
                    raise ValueError("streaming needs Mimi's transposed convolutions trimmed right")
            else:
                continue
            self._index[id(m)] = len(self._index)
        self._conv1d, self._transposed = MimiConv1d, MimiConvTranspose1d

    def _conv_step(self, conv: Any, x: torch.Tensor, state: DecodeState) -> torch.Tensor:
        return _causal_conv_step(conv, x, state.conv_inputs, self._convs[id(conv)])

    def start(self) -> DecodeState:
        from transformers import DynamicCache

        return DecodeState(cache=DynamicCache(config=self.mimi.config))

    def decode(self, state: DecodeState, codes: torch.Tensor) -> torch.Tensor:
        """PCM [n * frame_samples] of ``codes`` [K, n] (the stream's next
        ``n`` frames), carrying ``state`` on."""
        mimi = self.mimi
        with torch.inference_mode():
            x = mimi.quantizer.decode(codes[None].to(next(mimi.parameters()).device))
            if mimi.upsample is not None:
                x = self._transposed_step(mimi.upsample, x, state)
            x = mimi.decoder_transformer(
                x.transpose(1, 2), past_key_values=state.cache, return_dict=True
            ).last_hidden_state.transpose(1, 2)
            for layer in mimi.decoder.layers:
                x = self._layer(layer, x, state)
        state.frames += int(codes.shape[-1])
        return x[0, 0]

    def _layer(self, layer: Any, x: torch.Tensor, state: DecodeState) -> torch.Tensor:
        if isinstance(layer, self._conv1d):
            return self._conv_step(layer, x, state)
        if isinstance(layer, self._transposed):
            return self._transposed_step(layer, x, state)
        block = getattr(layer, "block", None)
        if block is None:  # an activation
            out: torch.Tensor = layer(x)
            return out
        residual = x
        for inner in block:
            x = self._layer(inner, x, state)
        return self._layer(layer.shortcut, residual, state) + x

    def _transposed_step(self, layer: Any, x: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """A transposed convolution: its output's head overlaps the previous
        frame's tail (added once, bias and all), its own tail waits."""
        i = self._index[id(layer)]
        y = layer.conv(x)
        tail = state.transposed_tails.get(i)
        if tail is not None:
            y[..., : tail.shape[-1]] += tail
        keep = x.shape[-1] * layer.conv.stride[0]
        rest = y[..., keep:]
        if layer.conv.bias is not None:
            rest = rest - layer.conv.bias[:, None]
        state.transposed_tails[i] = rest
        out: torch.Tensor = y[..., :keep]
        return out


@dataclass(frozen=True)
class _Conv:
    """A causal convolution's framing, read once: transformers keeps its
    stride, kernel and padding as tensors, and reading one on a GPU would
    wait for the device (three times a convolution, every frame)."""

    index: int  # its carried inputs' key in a stream's state
    pad: int
    kernel: int
    stride: int
    replicate: bool  # pads with its first input (else zeros)

    @classmethod
    def of(cls, conv: Any, index: int) -> _Conv:
        return cls(
            index,
            int(conv.padding_total),
            int(conv.kernel_size),
            int(conv.stride),
            conv.pad_mode == "replicate",
        )


def _causal_conv_step(
    conv: Any, x: torch.Tensor, inputs: dict[int, torch.Tensor], shape: _Conv
) -> torch.Tensor:
    """A causal convolution (any stride) over the inputs it still reads, then
    ``x``; keeps the inputs its next output reads (the first frame reads the
    padding transformers' forward pads with)."""
    i = shape.index
    before = inputs.get(i)
    if before is None:
        size = (*x.shape[:-1], shape.pad)
        before = x[..., :1].expand(size) if shape.replicate else x.new_zeros(size)
    full = torch.cat([before, x], dim=-1)
    kernel, stride = shape.kernel, shape.stride
    n = max(0, (full.shape[-1] - kernel) // stride + 1)
    inputs[i] = full[..., n * stride :]
    out: torch.Tensor = conv.conv(full[..., : max(0, (n - 1) * stride + kernel)])
    return out


@dataclass
class EncodeState:
    """One encoding stream's carry between frames."""

    cache: Any  # the encoder transformer's KV cache
    conv_inputs: dict[int, torch.Tensor] = field(default_factory=dict)
    frames: int = 0


class MimiEncodeStream:
    """Streaming encode over one ``MimiModel`` (its weights unchanged):
    whole frames of PCM in, as many frames of codes out."""

    def __init__(self, mimi: Any, num_quantizers: int) -> None:
        from transformers.models.mimi.modeling_mimi import MimiConv1d

        self.mimi = mimi
        self.num_quantizers = num_quantizers
        self.frame_samples = int(mimi.config.frame_size)
        modules = list(mimi.encoder.modules())
        if mimi.downsample is not None:
            modules.append(mimi.downsample)
        self._convs: dict[int, _Conv] = {}
        for m in modules:
            if isinstance(m, MimiConv1d):
                if not m.causal:
                    raise ValueError("streaming needs Mimi's encoder convolutions causal")
                self._convs[id(m)] = _Conv.of(m, len(self._convs))
        self._conv1d = MimiConv1d

    def start(self) -> EncodeState:
        from transformers import DynamicCache

        return EncodeState(cache=DynamicCache(config=self.mimi.config))

    def encode(self, state: EncodeState, pcm: torch.Tensor) -> torch.Tensor:
        """Codes [num_quantizers, n] of ``pcm`` [n * frame_samples] (the
        stream's next ``n`` frames of mono 24 kHz float PCM), carrying
        ``state`` on."""
        if pcm.dim() != 1 or pcm.shape[0] % self.frame_samples or pcm.shape[0] == 0:
            raise ValueError(
                f"a Mimi encode stream takes whole frames of {self.frame_samples} mono "
                f"samples; got shape {tuple(pcm.shape)}"
            )
        mimi = self.mimi
        with torch.inference_mode():
            x = pcm[None, None].to(next(mimi.parameters()))
            for layer in mimi.encoder.layers:
                x = self._layer(layer, x, state)
            x = mimi.encoder_transformer(
                x.transpose(1, 2), past_key_values=state.cache, use_cache=True, return_dict=True
            ).last_hidden_state.transpose(1, 2)
            if mimi.downsample is not None:
                x = _causal_conv_step(
                    mimi.downsample, x, state.conv_inputs, self._convs[id(mimi.downsample)]
                )
            codes: torch.Tensor = mimi.quantizer.encode(x, self.num_quantizers)
        state.frames += int(codes.shape[-1])
        return codes[:, 0]

    def _layer(self, layer: Any, x: torch.Tensor, state: EncodeState) -> torch.Tensor:
        if isinstance(layer, self._conv1d):
            return _causal_conv_step(layer, x, state.conv_inputs, self._convs[id(layer)])
        block = getattr(layer, "block", None)
        if block is None:  # an activation or an identity shortcut
            out: torch.Tensor = layer(x)
            return out
        residual = x
        for inner in block:
            x = self._layer(inner, x, state)
        return self._layer(layer.shortcut, residual, state) + x
