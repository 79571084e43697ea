"""The Qwen3-Omni thinker as vLLM runs it, writing the talker's hidden layer
into a persistent buffer, so the capture survives vLLM's compilation and
CUDA graphs.

Owns ``CapturingThinker`` (vLLM's ``Qwen3OmniMoeThinkerForConditionalGeneration``
with one change) and the custom op it writes with, ``omnix::keep_rows``.
omnix's vLLM plugin names the class in vLLM's model registry
(``vllm_plugin.THINKER_ARCHITECTURE``, in every process vLLM starts); a
thinker stage with ``talker_context`` asks for that architecture
(``hf_overrides``); every other stage keeps vLLM's own class.  Imports
vLLM's model code: only vLLM's model loader imports this module.

How it survives compilation.  vLLM compiles the language model's forward
once (Dynamo, then Inductor; on a GPU also CUDA graphs of its pieces): a
forward hook registered later never runs.  Instead the decoder layer whose
output the talker reads gets, when the model is built, a forward that also
writes ``hidden + residual`` (the reference's ``hidden_states[k]``: the
layer's output before Qwen3-Omni's deepstack adds the visual features)
into a buffer of ``max_num_batched_tokens`` rows, through a custom op that
Dynamo and Inductor keep as it is and a CUDA graph captures as a copy into
that fixed address.  The class's own forward, outside the compiled region
(vLLM compiles the inner language model only), hands the step's rows of
the buffer to the capture's sink.

A full CUDA graph of the whole forward (vLLM's ``FULL`` modes) would replay
without running that Python: a stage with ``talker_context`` on a GPU runs
vLLM's ``PIECEWISE`` graphs (``vllm_setup.py``), which run the outer
forward every step.  While a graph is being captured the sink is not
called (nothing real is in the batch then).

Does not own what is recorded or for whom (``vllm_capture.HiddenCapture``,
the worker extension that installs the sink), nor the layer's number
(``talker_config.accept_hidden_layer``, read by ``capture_settings``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

#: What the sink is handed: the captured layer's rows for every token of the
#: step (``[num_tokens, hidden]``).
Sink = Callable[[Any], None]


@torch.library.custom_op("omnix::keep_rows", mutates_args=("out",))
def keep_rows(rows: torch.Tensor, out: torch.Tensor) -> None:
    """``out[: len(rows)] = rows``, opaque to Dynamo and Inductor."""
    out[: rows.shape[0]].copy_(rows)


@keep_rows.register_fake
def _keep_rows_fake(rows: torch.Tensor, out: torch.Tensor) -> None:
    return None


def _thinker_class() -> type:
    from vllm.model_executor.models.qwen3_omni_moe_thinker import (
        Qwen3OmniMoeThinkerForConditionalGeneration,
    )

    return Qwen3OmniMoeThinkerForConditionalGeneration


def _keep_output(layer: Any, rows: int, hidden: int, dtype: Any, device: Any) -> None:
    """Give decoder ``layer`` a forward that also keeps its output
    (``hidden + residual``) in ``layer.omnix_rows`` ([rows, hidden])."""
    # Not persistent: no checkpoint holds it, the weight loader never asks.
    layer.register_buffer(
        "omnix_rows", torch.zeros(rows, hidden, dtype=dtype, device=device), persistent=False
    )
    forward = layer.forward

    def keeping(*args: Any, **kwargs: Any) -> Any:
        hidden_states, residual = forward(*args, **kwargs)
        total = hidden_states if residual is None else hidden_states + residual
        torch.ops.omnix.keep_rows(total, layer.omnix_rows)
        return hidden_states, residual

    layer.forward = keeping


class CapturingThinker(_thinker_class()):  # type: ignore[misc]
    """vLLM's Qwen3-Omni thinker that keeps the talker's hidden layer (see
    the module doc)."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        from omnix.engines.vllm_capture import capture_settings

        layer, _ = capture_settings(Path(vllm_config.model_config.model))
        layers = self.language_model.model.layers
        if not 1 <= layer <= len(layers):
            raise ValueError(f"hidden layer {layer} is outside 1..{len(layers)}")
        # hidden_states[k] is the output of decoder layer k - 1.
        self._omnix_layer = layers[layer - 1]
        rows = int(vllm_config.scheduler_config.max_num_batched_tokens)
        hidden = int(vllm_config.model_config.hf_text_config.hidden_size)
        embed = self.language_model.model.embed_tokens.weight
        _keep_output(self._omnix_layer, rows, hidden, embed.dtype, embed.device)
        self.omnix_sink: Sink | None = None

    def forward(self, input_ids: Any, positions: Any, *args: Any, **kwargs: Any) -> Any:
        out = super().forward(input_ids, positions, *args, **kwargs)
        sink = self.omnix_sink
        if sink is not None and not (
            torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        ):
            sink(self._omnix_layer.omnix_rows[: positions.shape[-1]])
        return out
