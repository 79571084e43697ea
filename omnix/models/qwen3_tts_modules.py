"""Qwen3-TTS's talker, code predictor and 12 Hz speech decoder as torch
modules assembled from transformers' own building blocks.

Owns: ``TTSTalker`` (the talker: a dense Qwen3 backbone with interleaved
MRoPE, which is transformers' Qwen3-VL text decoder, over the sum of a
codec and a projected text embedding; its codec head; the code predictor,
which is Qwen3-Omni's, plus the projection from the talker's width to the
predictor's) and ``SpeechDecoder`` (codes -> 24 kHz waveform: the split
residual quantizer's decode, a causal convolution, Qwen3-Omni Code2Wav's
sliding-window transformer between two projections, its upsampling and
its decoder blocks), each built from the published ``config.json``
fields with the published checkpoint's tensor names.

Lives under ``omnix.models`` so that the tiny checkpoint's builder
(``qwen3_tts.py``) and the engines that load a checkpoint
(``omnix.engines.qwen3_tts_talker``, ``omnix.engines.speech_decoder``)
share one definition.  Torch and transformers at import: import it where
used.  Does not own loading weights, the prompt, choosing codes or the
decode loop (the engines), nor the speech tokenizer's encoder
(``qwen3_tts_encoder.py``) or the Base variant's speaker encoder
(``qwen3_tts_speaker.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
    Qwen3OmniMoeCode2WavConfig,
    Qwen3OmniMoeTalkerCodePredictorConfig,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCausalConvNet,
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2WavDecoderBlock,
    Qwen3OmniMoeCode2WavTransformerModel,
    Qwen3OmniMoeConvNeXtBlock,
    Qwen3OmniMoeSnakeBeta,
    Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration,
)
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel

SPEECH_TOKENIZER_DIR = "speech_tokenizer"


def _rope(fields: dict[str, Any]) -> dict[str, Any]:
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": float(fields.get("rope_theta", 10000)),
    }
    scaling = fields.get("rope_scaling") or {}
    if "mrope_section" in scaling:
        rope["mrope_section"] = list(scaling["mrope_section"])
        rope["mrope_interleaved"] = bool(scaling.get("interleaved", False))
    return rope


_LAYER_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "attention_bias",
)


def _layer_fields(fields: dict[str, Any]) -> dict[str, Any]:
    out = {k: fields[k] for k in _LAYER_FIELDS if k in fields}
    if fields.get("head_dim") is not None:
        out["head_dim"] = fields["head_dim"]
    return out


def backbone_config(talker: dict[str, Any]) -> Qwen3VLTextConfig:
    """The talker backbone's config from ``config.json``'s ``talker_config``."""
    if not (talker.get("rope_scaling") or {}).get("interleaved", False):
        raise ValueError("the Qwen3-TTS talker's MRoPE is interleaved; this config says otherwise")
    cfg = Qwen3VLTextConfig(
        vocab_size=talker["vocab_size"], rope_parameters=_rope(talker), **_layer_fields(talker)
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def predictor_config(talker: dict[str, Any]) -> Qwen3OmniMoeTalkerCodePredictorConfig:
    """The code predictor's config from ``talker_config.code_predictor_config``."""
    fields = talker["code_predictor_config"]
    cfg = Qwen3OmniMoeTalkerCodePredictorConfig(
        vocab_size=fields["vocab_size"],
        num_code_groups=fields["num_code_groups"],
        rope_parameters=_rope(fields),
        **_layer_fields(fields),
    )
    cfg._attn_implementation = "sdpa"
    return cfg


class _Backbone(Qwen3VLTextModel):
    """Qwen3-VL's text decoder with Qwen3-TTS's two input tables in place of
    its token embedding: codec ids (the talker's own vocabulary) and text ids
    (the text tokenizer's, projected to the talker's width by the talker)."""

    def __init__(self, config: Qwen3VLTextConfig, text_vocab: int, text_hidden: int) -> None:
        super().__init__(config)
        del self.embed_tokens
        self.codec_embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.text_embedding = nn.Embedding(text_vocab, text_hidden)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.codec_embedding


class _ResizeMLP(nn.Module):
    """The text projection: two biased linears with the talker's activation."""

    def __init__(self, size_in: int, hidden: int, size_out: int, act: str) -> None:
        from transformers.activations import ACT2FN

        super().__init__()
        self.linear_fc1 = nn.Linear(size_in, hidden, bias=True)
        self.linear_fc2 = nn.Linear(hidden, size_out, bias=True)
        self.act_fn = ACT2FN[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear_fc2(self.act_fn(self.linear_fc1(x)))
        return out


class _TalkerConfigView:
    """What ``TalkerModel`` reads of a talker's config (its backbone's)."""

    def __init__(self, text_config: Qwen3VLTextConfig) -> None:
        self.text_config = text_config


class TTSTalker(nn.Module):
    """The talker with the attribute names of the published checkpoint
    (``talker.model``, ``talker.text_projection``, ``talker.codec_head``,
    ``talker.code_predictor``) and of Qwen3-Omni's talker, which
    ``TalkerModel`` drives."""

    def __init__(self, talker: dict[str, Any]) -> None:
        super().__init__()
        backbone = backbone_config(talker)
        self.config = _TalkerConfigView(backbone)
        self.model = _Backbone(backbone, talker["text_vocab_size"], talker["text_hidden_size"])
        hidden = backbone.hidden_size
        self.text_projection = _ResizeMLP(
            talker["text_hidden_size"], talker["text_hidden_size"], hidden, backbone.hidden_act
        )
        self.codec_head = nn.Linear(hidden, backbone.vocab_size, bias=False)
        pcfg = predictor_config(talker)
        predictor = Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration(pcfg)
        # Qwen3-TTS keeps the residual groups' embeddings at the talker's
        # width (they are summed into the talker's next input) and projects
        # the predictor's inputs down to its own width.
        predictor.model.codec_embedding = nn.ModuleList(
            nn.Embedding(pcfg.vocab_size, hidden) for _ in range(pcfg.num_code_groups - 1)
        )
        predictor.small_to_mtp_projection = (
            nn.Linear(hidden, pcfg.hidden_size, bias=True)
            if pcfg.hidden_size != hidden
            else nn.Identity()
        )
        self.code_predictor = predictor

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.codec_embedding


def read_config(folder: str | Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(folder) / "config.json").read_text())
    return data


# -- the 12 Hz speech decoder --------------------------------------------------------


class _Codebook(nn.Module):
    """One codebook, as an EMA-trained quantizer stores it: the codes'
    vectors are ``embedding_sum / cluster_usage``."""

    def __init__(self, dim: int, size: int, epsilon: float = 1e-5) -> None:
        super().__init__()
        self.epsilon = epsilon
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        table = self.embedding_sum / self.cluster_usage.clamp(min=self.epsilon)[:, None]
        return nn.functional.embedding(codes, table)


class _VQ(nn.Module):
    def __init__(self, dim: int, size: int) -> None:
        super().__init__()
        self._codebook = _Codebook(dim, size)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self._codebook(codes)
        return out


class _Layers(nn.Module):
    def __init__(self, n: int, dim: int, size: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_VQ(dim, size) for _ in range(n))


class _ResidualQuantizer(nn.Module):
    """A residual quantizer's decode: the sum of its codebooks' vectors,
    then a 1x1 convolution out (``input_proj`` is the encoder's)."""

    def __init__(self, n: int, dim: int, io_dim: int, size: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = _Layers(n, dim, size)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """[B, n, T] codes -> [B, io_dim, T]."""
        total: torch.Tensor = torch.zeros((), device=codes.device)
        for i, layer in enumerate(self.vq.layers):
            total = total + layer(codes[:, i]).transpose(1, 2)
        out: torch.Tensor = self.output_proj(total)
        return out


class _SplitQuantizer(nn.Module):
    """The first (semantic) code group and the 15 acoustic ones, each with
    projections of their own; their decodes add."""

    def __init__(self, groups: int, dim: int, io_dim: int, size: int) -> None:
        super().__init__()
        self.rvq_first = _ResidualQuantizer(1, dim, io_dim, size)
        self.rvq_rest = _ResidualQuantizer(groups - 1, dim, io_dim, size)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


def decoder_config(fields: dict[str, Any]) -> Qwen3OmniMoeCode2WavConfig:
    """Code2Wav's config carrying the speech decoder's transformer and
    decoder-block sizes (the same blocks; ``hidden_size`` is the
    transformer's width, ``latent_dim`` the convolutions')."""
    cfg = Qwen3OmniMoeCode2WavConfig(
        codebook_size=fields["codebook_size"],
        hidden_size=fields["hidden_size"],
        max_position_embeddings=fields["max_position_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": float(fields["rope_theta"])},
        num_attention_heads=fields["num_attention_heads"],
        num_key_value_heads=fields["num_key_value_heads"],
        attention_bias=fields["attention_bias"],
        sliding_window=fields["sliding_window"],
        intermediate_size=fields["intermediate_size"],
        hidden_act=fields["hidden_act"],
        layer_scale_initial_scale=fields["layer_scale_initial_scale"],
        rms_norm_eps=fields["rms_norm_eps"],
        num_hidden_layers=fields["num_hidden_layers"],
        num_quantizers=fields["num_quantizers"],
        upsample_rates=list(fields["upsample_rates"]),
        upsampling_ratios=list(fields["upsampling_ratios"]),
        decoder_dim=fields["decoder_dim"],
        # The published decoder's heads (64 wide) are not its width over
        # their number (512 / 16): without the field the attention's
        # projections would take the wrong shapes.
        **({"head_dim": fields["head_dim"]} if "head_dim" in fields else {}),
    )
    cfg._attn_implementation = "sdpa"
    return cfg


class _SnakeBeta(Qwen3OmniMoeSnakeBeta):
    """Code2Wav's SnakeBeta, ``x + 1 / (exp(beta) + 1e-9) * sin(x * exp(alpha)) ** 2``,
    with one new tensor of the input's size instead of four: the same
    products and sums in place (``pow(s, 2)`` is ``s * s`` on the CPU and
    CUDA, and the factors of a product and the terms of a sum commute
    exactly), so the same bits.  At 24 kHz the decoder's activations are
    its largest tensors; allocating and filling them cost as much as the
    arithmetic."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        alpha = torch.exp(self.alpha.unsqueeze(0).unsqueeze(-1))
        beta = torch.exp(self.beta.unsqueeze(0).unsqueeze(-1))
        out = hidden_states * alpha
        out.sin_()
        out.mul_(out)
        out.mul_(1.0 / (beta + self.no_div_by_zero))
        return out.add_(hidden_states)


class SpeechDecoder(nn.Module):
    """The 12 Hz tokenizer's decoder: [B, 16, T] codes -> [B, 1, T x 1920]
    samples in [-1, 1] (names as the checkpoint's ``decoder.*``)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        super().__init__()
        cfg = decoder_config(fields)
        self.config = cfg
        latent, codebook_dim = fields["latent_dim"], fields["codebook_dim"]
        self.total_upsample = 1
        for r in [*cfg.upsample_rates, *cfg.upsampling_ratios]:
            self.total_upsample *= int(r)
        self.quantizer = _SplitQuantizer(
            cfg.num_quantizers, codebook_dim // 2, codebook_dim, cfg.codebook_size
        )
        self.pre_conv = Qwen3OmniMoeCausalConvNet(codebook_dim, latent, kernel_size=3)
        pre = Qwen3OmniMoeCode2WavTransformerModel._from_config(cfg)
        pre.input_proj = nn.Linear(latent, cfg.hidden_size)
        pre.output_proj = nn.Linear(cfg.hidden_size, latent)
        self.pre_transformer = pre
        self.upsample = nn.ModuleList(
            nn.ModuleList(
                [
                    Qwen3OmniMoeCausalTransConvNet(latent, latent, f, f),
                    Qwen3OmniMoeConvNeXtBlock(latent),
                ]
            )
            for f in cfg.upsampling_ratios
        )
        out_dim = cfg.decoder_dim // 2 ** len(cfg.upsample_rates)
        self.decoder = nn.ModuleList(
            [
                Qwen3OmniMoeCausalConvNet(latent, cfg.decoder_dim, 7),
                *(Qwen3OmniMoeCode2WavDecoderBlock(cfg, i) for i in range(len(cfg.upsample_rates))),
                _SnakeBeta(out_dim),
                Qwen3OmniMoeCausalConvNet(out_dim, 1, 7),
            ]
        )
        for name, module in list(self.named_modules()):
            if type(module) is Qwen3OmniMoeSnakeBeta:
                parent, _, child = name.rpartition(".")
                setattr(self.get_submodule(parent), child, _SnakeBeta(module.in_features))
        for module in self.modules():
            if isinstance(module, Qwen3OmniMoeCausalTransConvNet):
                # Causal: the transposed convolutions' overhang is cut on
                # the right only (Qwen3-Omni's Code2Wav cuts both sides),
                # so T frames give exactly T x 1920 samples.
                module.left_pad = 0

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        hidden = self.pre_conv(self.quantizer.decode(codes)).transpose(1, 2)
        pre = self.pre_transformer
        hidden = pre.output_proj(pre(inputs_embeds=pre.input_proj(hidden)).last_hidden_state)
        hidden = hidden.permute(0, 2, 1)
        for blocks in self.upsample:
            for block in cast(nn.ModuleList, blocks):
                hidden = block(hidden)
        for block in self.decoder:
            hidden = block(hidden)
        return hidden.clamp(min=-1, max=1)

    def chunked(
        self, codes: torch.Tensor, chunk: int = 300, left_context: int = 25, first: int = 0
    ) -> torch.Tensor:
        """Decode ``chunk`` frames at a time, each with up to ``left_context``
        frames before it whose samples are cut off again (the reference's
        chunking: the waveform equals its for the same codes); ``first``
        (0: ``chunk``) frames in the first chunk, as a serving stage streams."""
        parts, start, n = [], 0, codes.shape[-1]
        while start < n:
            end = min(start + ((first or chunk) if start == 0 else chunk), n)
            context = left_context if start - left_context > 0 else start
            wav = self(codes[..., start - context : end])
            parts.append(wav[..., context * self.total_upsample :])
            start = end
        return torch.cat(parts, dim=-1)
