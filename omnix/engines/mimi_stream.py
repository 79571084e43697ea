"""Mimi's decoder, frame by frame: 80 ms of codes in, 80 ms of PCM out.

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

Does not own: encoding (the user's audio reaches the model as codes),
nor which frames are decoded when (``duplex_engine.py``).
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
        for m in modules:
            if isinstance(m, MimiConv1d):
                if int(m.stride) != 1 or not m.causal:
                    raise ValueError("Mimi's decoder convolutions must be causal with stride 1")
            elif isinstance(m, MimiConvTranspose1d):
                if m.padding_left != 0:
                    raise ValueError("streaming needs Mimi's transposed convolutions trimmed right")
            else:
                continue
            self._index[id(m)] = len(self._index)
        self._conv1d, self._transposed = MimiConv1d, MimiConvTranspose1d

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

    def _conv_step(self, conv: Any, x: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """A causal convolution over the inputs it still reads, then ``x``
        (the first frame reads the padding transformers' forward pads with)."""
        i = self._index[id(conv)]
        pad = int(conv.padding_total)
        before = state.conv_inputs.get(i)
        if before is None:
            shape = (*x.shape[:-1], pad)
            if conv.pad_mode == "replicate":
                before = x[..., :1].expand(shape)
            else:
                before = x.new_zeros(shape)
        full = torch.cat([before, x], dim=-1)
        state.conv_inputs[i] = full[..., full.shape[-1] - pad :]
        out: torch.Tensor = conv.conv(full)
        return out

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
