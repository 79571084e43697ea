"""The Qwen3-Omni thinker as vLLM runs it, with the talker's hidden layer as
a second output, so the capture survives vLLM's compilation and CUDA graphs.

Owns ``CapturingThinker`` (vLLM's ``Qwen3OmniMoeThinkerForConditionalGeneration``
with one change).  omnix's vLLM plugin names it in vLLM's model registry
(``vllm_plugin.THINKER_ARCHITECTURE``, in every process vLLM starts); a
thinker stage with ``talker_context`` asks for that architecture
(``hf_overrides``); every other stage keeps vLLM's own class.  Imports
vLLM's model code: only vLLM's model loader imports this module.

How it survives compilation.  vLLM compiles the language model's forward
once (Dynamo, then Inductor; on a GPU also CUDA graphs of its pieces): a
forward hook registered later never runs.  vLLM's language model can
already return the sum ``hidden + residual`` after chosen decoder layers
as extra outputs (``aux_hidden_state_layers``, what EAGLE-3 drafts from);
set before the first forward, they are part of the traced graph.
``CapturingThinker`` sets the talker's layer there when it is built, and
its own forward (outside the compiled region: vLLM compiles the inner
language model only) hands that output to the capture's sink, then returns
the hidden states alone, as vLLM's runner expects.

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

#: What the sink is handed: the captured layer's rows for every token of the
#: step (``[num_tokens, hidden]``, padded to vLLM's batch size).
Sink = Callable[[Any], None]


def _thinker_class() -> type:
    from vllm.model_executor.models.qwen3_omni_moe_thinker import (
        Qwen3OmniMoeThinkerForConditionalGeneration,
    )

    return Qwen3OmniMoeThinkerForConditionalGeneration


class CapturingThinker(_thinker_class()):  # type: ignore[misc]
    """vLLM's Qwen3-Omni thinker whose language model also returns the
    talker's hidden layer (see the module doc)."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        from omnix.engines.vllm_capture import capture_settings

        layer, _ = capture_settings(Path(vllm_config.model_config.model))
        inner = self.language_model.model
        if not 1 <= layer <= len(inner.layers):
            raise ValueError(f"hidden layer {layer} is outside 1..{len(inner.layers)}")
        # Layer k's entry is the output of decoder layer k - 1 (hidden +
        # residual): the reference's hidden_states[k].
        inner._set_aux_hidden_state_layers((layer,))
        self.omnix_sink: Sink | None = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        out = super().forward(*args, **kwargs)
        if not isinstance(out, tuple):  # a pipeline rank's intermediate tensors
            return out
        hidden, aux = out
        sink = self.omnix_sink
        if sink is not None and not (
            torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        ):
            sink(aux[0])
        return hidden
