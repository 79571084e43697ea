"""The 12 Hz speech tokenizer's encoder: 24 kHz audio -> codes.

Owns: ``SpeechEncoder``, transformers' ``MimiModel`` less its decoding half
(upsampling, decoder transformer and decoder, which the 12 Hz tokenizer
replaces with its own: ``qwen3_tts_modules.SpeechDecoder``), built from the
speech tokenizer's ``encoder_config`` with the checkpoint's ``encoder.*``
tensor names; its ``encode`` keeps the first ``encoder_valid_num_quantizers``
codebooks and ceil(samples / 1920) frames, as the reference's does.

Does not own loading the tensors (``omnix.engines.qwen3_tts_clone``) nor
reading audio.  Torch and transformers at import: import it where used.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import MimiConfig, MimiModel

#: The decoding half of ``MimiModel``, which the 12 Hz tokenizer lacks.
DECODING = ("upsample", "decoder_transformer", "decoder")


def encoder_config(fields: dict[str, Any]) -> MimiConfig:
    """``encoder_config`` (transformers 4.x's Mimi fields) as 5.x's config."""
    kept = {k: v for k, v in fields.items() if k not in ("model_type", "rope_theta")}
    rope = {"rope_type": "default", "rope_theta": float(fields.get("rope_theta", 10000.0))}
    cfg = MimiConfig(**kept, rope_parameters=rope)
    cfg._attn_implementation = "sdpa"
    return cfg


class SpeechEncoder(MimiModel):
    """Mimi's encoder, transformer, downsampling and split quantizer."""

    def __init__(self, fields: dict[str, Any], valid_quantizers: int, samples_per_frame: int):
        super().__init__(encoder_config(fields))
        for name in DECODING:
            delattr(self, name)
        self.valid_quantizers = valid_quantizers
        self.samples_per_frame = samples_per_frame

    def codes(self, wav: torch.Tensor) -> torch.Tensor:
        """[samples] float audio at the tokenizer's rate -> [frames, valid] codes."""
        with torch.inference_mode():
            out = self.encode(input_values=wav[None, None], return_dict=True)
        frames = -(-wav.shape[-1] // self.samples_per_frame)
        all_codes = getattr(out, "audio_codes")  # noqa: B009 (a union mypy cannot narrow)
        codes: torch.Tensor = all_codes[0, : self.valid_quantizers, :frames]
        return codes.T.contiguous()
