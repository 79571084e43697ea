"""Builder of the tiny random-weight Moshi (the full-duplex speech model).

Owns: ``build_moshi`` (the ``moshi`` tiny model of ``omnix models init``)
and ``write_folder``, its tiny sizes and everything it writes into one
folder laid out as the published transformers Moshi checkpoints are
(``kmhf/hf-moshiko``, which ``MoshiForConditionalGeneration.from_pretrained``
loads):

- ``config.json``: a ``MoshiConfig`` (``model_type: moshi``) whose
  ``audio_encoder_config`` is Mimi's (``model_type: mimi``: 24 kHz, 12.5
  frames a second, 1920 samples a frame, a split RVQ of one semantic and
  fifteen acoustic codebooks of 2048 codes) and whose ``depth_decoder_config``
  is the depth transformer's; Moshi reads the first eight codebooks, as the
  published model does.
- ``model.safetensors``: the temporal transformer (``decoder.*``), the
  sixteen audio embeddings (``embed_tokens.*``: Moshi's eight codebooks then
  the user's eight), the depth decoder (``depth_decoder.*``) and Mimi
  (``audio_encoder.*``), names and shapes from transformers' own modules on
  the meta device.
- the text tokenizer: a unigram SentencePiece model trained on omnix's
  corpus (``tokenizer.model``) and its conversion by transformers'
  ``MoshiConverter`` (``tokenizer.json``, loaded as a
  ``PreTrainedTokenizerFast``), with Kyutai's text specials at Kyutai's ids:
  ``<unk>`` 0 (the end of padding before a word), ``<s>`` 1, ``</s>`` 2,
  ``<pad>`` 3 (the padding the model writes between words); the text
  vocabulary's own size is the "initial" text token.
- ``generation_config.json``: Kyutai's sampling (text temperature 0.7,
  top-k 25; audio temperature 0.8, top-k 250 through
  ``depth_decoder_config``).
- ``preprocessor_config.json``: the ``EncodecFeatureExtractor`` (24 kHz mono)
  ``AutoFeatureExtractor`` maps Moshi to.
- PersonaPlex-style (``build_personaplex``, the ``personaplex`` tiny
  model; ``write_folder(voices=...)``): the same model with voice prompts
  in ``voices/``, ``NAME.wav`` each (two seconds of 24 kHz mono 16-bit
  PCM: a voiced tone at the voice's own pitch), named as PersonaPlex's
  published voices are; such a folder also takes a role text
  (``omnix.pipelines.persona_card``).

Does not own anything that runs the model (``omnix.engines.duplex_model``),
the cache or atomic installs (``build.py``).

Audible: every table transformers' init leaves at zero (Mimi's codebooks,
``embed_sum``) is random, the decoder's last convolution is scaled so the
waveform peaks well above silence, and the quantizers' input projections
are scaled so that user audio encodes to codes that vary frame to frame
(random encoder weights leave the quantizer's input near zero, where every
frame takes the same code).  Deterministic: every tensor comes from a
generator seeded by ``derived_seed(seed, "moshi", name)``; JSON is written
with sorted keys; the tokenizer trains single-threaded on a fixed corpus.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnix.models.paths import ModelInfo
from omnix.models.seeds import derived_seed

if TYPE_CHECKING:
    import torch

MODEL_NAME = "moshi"
PERSONAPLEX_NAME = "personaplex"
#: The tiny PersonaPlex's voices (named as two of the published ones) and
#: each one's pitch in Hz.
PERSONAPLEX_VOICES: dict[str, float] = {"NATF2": 220.0, "NATM1": 120.0}
VOICE_SECONDS = 2.0

# -- the published layout ----------------------------------------------------------
SAMPLE_RATE = 24000
FRAME_SAMPLES = 1920  # 80 ms: Mimi's 12.5 frames a second
CODEBOOK_SIZE = 2048  # audio_vocab_size; the "initial" audio token is 2048
NUM_CODEBOOKS = 8  # Moshi's codebooks of Mimi's
MIMI_QUANTIZERS = 16  # Mimi's own (32 published): Moshi reads the first 8
#: Kyutai's text specials (their ids in the published 32000-piece vocabulary).
TEXT_EPAD, TEXT_BOS, TEXT_EOS, TEXT_PAD = 0, 1, 2, 3

# -- tiny sizes ----------------------------------------------------------------------
TEXT_VOCAB = 512  # pieces of the tiny SentencePiece model
HIDDEN = 64
LAYERS = 2
HEADS = 4
FFN = 256  # fc1's width; the gated MLP's inner width is half of it
DEPTH_HIDDEN = 32
DEPTH_LAYERS = 2
DEPTH_HEADS = 2
DEPTH_FFN = 128
MIMI_HIDDEN = 32
MIMI_VQ_DIM = 16  # the quantizer's space (codebook_dim): input_proj maps into it

#: The published Moshi's context: its KV cache is a sliding window of 3000
#: frames (4 minutes).
CONTEXT = 3000

_WEIGHT_STD = 0.05
#: Output heads wider than the rest, so greedy choices vary with the input
#: rather than repeating one token (as the other tiny models' heads).
_HEAD_STD = 0.15
_HEADS = ("decoder.lm_head.weight", "depth_decoder.lm_heads.weight")
#: Moshi's sixteen audio embeddings and the text embedding: N(0, 1) as
#: transformers' own init draws embeddings, so the frame's codes matter.
_EMBED_STD = 1.0
_CODEBOOK_STD = 1.0
#: Random decoder weights give a waveform peaking near 5e-4; the last
#: convolution is scaled so the audio is audible (peaks near 0.3).
DECODER_OUTPUT_GAIN = 512.0
#: See the module docstring: user audio must encode to varied codes.
ENCODER_QUANTIZER_GAIN = 300.0


def mimi_config() -> dict[str, Any]:
    """Mimi's config (``audio_encoder_config``) at tiny widths: the published
    rates and framing, a narrower SEANet and one transformer layer."""
    return {
        "model_type": "mimi",
        "sampling_rate": SAMPLE_RATE,
        "audio_channels": 1,
        "hidden_size": MIMI_HIDDEN,
        "num_filters": 4,
        "num_residual_layers": 1,
        "upsampling_ratios": [8, 6, 5, 4],
        "kernel_size": 7,
        "last_kernel_size": 3,
        "residual_kernel_size": 3,
        "dilation_growth_rate": 2,
        "use_causal_conv": True,
        "pad_mode": "constant",
        "compress": 2,
        "trim_right_ratio": 1.0,
        "codebook_size": CODEBOOK_SIZE,
        "codebook_dim": MIMI_VQ_DIM,
        "num_quantizers": MIMI_QUANTIZERS,
        "vector_quantization_hidden_dimension": MIMI_VQ_DIM,
        "num_semantic_quantizers": 1,
        "upsample_groups": MIMI_HIDDEN,
        "num_hidden_layers": 1,
        "intermediate_size": 2 * MIMI_HIDDEN,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": MIMI_HIDDEN // 2,
        "hidden_act": "gelu",
        "max_position_embeddings": 8000,
        "norm_eps": 1e-5,
        "use_cache": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "sliding_window": 250,
        "attention_dropout": 0.0,
        "layer_scale_initial_scale": 0.01,
        "attention_bias": False,
    }


def moshi_config(text_vocab: int) -> Any:
    """The whole model's ``MoshiConfig`` (``text_vocab``: the tokenizer's
    size, so the initial text token is ``text_vocab``)."""
    from transformers import MoshiConfig

    return MoshiConfig(
        vocab_size=text_vocab,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HIDDEN // HEADS,
        ffn_dim=FFN,
        max_position_embeddings=CONTEXT,
        sliding_window=CONTEXT,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-8,
        num_codebooks=NUM_CODEBOOKS,
        audio_vocab_size=CODEBOOK_SIZE,
        tie_word_embeddings=False,
        audio_encoder_config=mimi_config(),
        depth_decoder_config={
            "hidden_size": DEPTH_HIDDEN,
            "num_hidden_layers": DEPTH_LAYERS,
            "num_attention_heads": DEPTH_HEADS,
            "num_key_value_heads": DEPTH_HEADS,
            "head_dim": DEPTH_HIDDEN // DEPTH_HEADS,
            "ffn_dim": DEPTH_FFN,
            "max_position_embeddings": NUM_CODEBOOKS + 1,
            "sliding_window": NUM_CODEBOOKS,
            "rms_norm_eps": 1e-8,
        },
        architectures=["MoshiForConditionalGeneration"],
    )


#: Kyutai's sampling, as the published folder carries it (whose text
#: temperature is misspelt ``temp``, which transformers ignores: written
#: here as ``temperature``).
GENERATION_CONFIG: dict[str, Any] = {
    "do_sample": True,
    "temperature": 0.7,
    "top_k": 25,
    "depth_decoder_config": {
        "do_sample": True,
        "temperature": 0.8,
        "top_k": 250,
        "min_length": NUM_CODEBOOKS + 1,
        "max_length": NUM_CODEBOOKS + 1,
    },
}

FEATURE_EXTRACTOR: dict[str, Any] = {
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": SAMPLE_RATE,
    "chunk_length_s": None,
    "overlap": None,
}


# -- the text tokenizer ------------------------------------------------------------


def train_sentencepiece(vocab_size: int = TEXT_VOCAB) -> bytes:
    """A unigram SentencePiece model over omnix's corpus, with byte fallback
    and Kyutai's special ids; deterministic (one thread, fixed corpus)."""
    import sentencepiece as spm

    from omnix.models.corpus import CORPUS

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines()),
        model_writer=out,
        vocab_size=vocab_size,
        model_type="unigram",
        byte_fallback=True,
        character_coverage=1.0,
        split_digits=True,
        unk_id=TEXT_EPAD,
        bos_id=TEXT_BOS,
        eos_id=TEXT_EOS,
        pad_id=TEXT_PAD,
        num_threads=1,
        minloglevel=2,
    )
    return out.getvalue()


def build_tokenizer(out_dir: Path) -> int:
    """Write ``tokenizer.model`` and its transformers conversion
    (``tokenizer.json``, ``tokenizer_config.json``) into ``out_dir``; return
    the vocabulary size."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import MoshiConverter

    out_dir.mkdir(parents=True, exist_ok=True)
    model = out_dir / "tokenizer.model"
    model.write_bytes(train_sentencepiece())
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=MoshiConverter(str(model)).converted(),
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        clean_up_tokenization_spaces=False,
        model_max_length=CONTEXT,
    )
    tokenizer.save_pretrained(str(out_dir))
    return len(tokenizer)


# -- weights -----------------------------------------------------------------------


def _std(name: str) -> float:
    if name in _HEADS:
        return _HEAD_STD
    if name.endswith("embed_sum"):
        return _CODEBOOK_STD
    if "embed_tokens" in name:
        return _EMBED_STD
    return _WEIGHT_STD


def random_weights(config: Any, seed: int) -> dict[str, torch.Tensor]:
    """Every tensor of ``MoshiForConditionalGeneration(config)``: norms,
    layer scales and Mimi's cluster counts ones, biases zeros, matrices
    N(0, std) from their own generator (see the module docstring)."""
    import torch
    from transformers import MoshiForConditionalGeneration

    with torch.device("meta"):
        model = MoshiForConditionalGeneration(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    decoder_layers = len(model.audio_encoder.decoder.layers)
    gains = {
        f"audio_encoder.decoder.layers.{decoder_layers - 1}.conv.weight": DECODER_OUTPUT_GAIN,
        **{
            f"audio_encoder.quantizer.{part}_residual_vector_quantizer.input_proj.weight": (
                ENCODER_QUANTIZER_GAIN
            )
            for part in ("semantic", "acoustic")
        },
    }
    out: dict[str, torch.Tensor] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith(".bias"):
            out[name] = torch.zeros(shape)
        elif len(shape) <= 1:
            out[name] = torch.ones(shape)
        else:
            gen = torch.Generator().manual_seed(derived_seed(seed, MODEL_NAME, name))
            out[name] = torch.randn(shape, generator=gen) * _std(name) * gains.get(name, 1.0)
    return out


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_voice(path: Path, pitch: float, seconds: float = VOICE_SECONDS) -> None:
    """A voice prompt: ``seconds`` of a voiced tone gliding around
    ``pitch``, 24 kHz mono 16-bit PCM WAV (deterministic bytes)."""
    import math
    import wave

    import numpy as np

    t = np.arange(int(SAMPLE_RATE * seconds)) / SAMPLE_RATE
    f0 = pitch * (1 + 0.1 * np.sin(2 * math.pi * 3 * t))
    phase = 2 * math.pi * np.cumsum(f0) / SAMPLE_RATE
    voice = sum(np.sin(h * phase) / h for h in range(1, 6))
    pcm = (np.clip(0.2 * voice, -1, 1) * 32767).astype("<i2")
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm.tobytes())


def write_folder(out_dir: Path, seed: int = 0, voices: dict[str, float] | None = None) -> int:
    """Write the tiny Moshi checkpoint into ``out_dir`` (with ``voices``,
    name to pitch, a PersonaPlex-style one: ``voices/NAME.wav``); return
    the text vocabulary size."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    text_vocab = build_tokenizer(out_dir)
    config = moshi_config(text_vocab)
    config.save_pretrained(str(out_dir))
    _write_json(out_dir / "generation_config.json", GENERATION_CONFIG)
    _write_json(out_dir / "preprocessor_config.json", FEATURE_EXTRACTOR)
    weights = random_weights(config, seed)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    for name, pitch in sorted((voices or {}).items()):
        write_voice(out_dir / "voices" / f"{name}.wav", pitch)
    return text_vocab


def build_moshi(out: Path, seed: int) -> ModelInfo:
    """The ``moshi`` tiny model (``omnix models init``)."""
    return _info(MODEL_NAME, seed, write_folder(out, seed))


def build_personaplex(out: Path, seed: int) -> ModelInfo:
    """The ``personaplex`` tiny model (``omnix models init``): the tiny
    Moshi's weights (PersonaPlex fine-tunes Moshi's) with voice prompts."""
    return _info(PERSONAPLEX_NAME, seed, write_folder(out, seed, PERSONAPLEX_VOICES))


def _info(name: str, seed: int, text_vocab: int) -> ModelInfo:
    return ModelInfo(
        name=name,
        seed=seed,
        layout={
            "text_vocab": text_vocab,
            "text_pad": TEXT_PAD,
            "text_epad": TEXT_EPAD,
            "num_codebooks": NUM_CODEBOOKS,
            "codebook_size": CODEBOOK_SIZE,
            "frame_samples": FRAME_SAMPLES,
            "sample_rate": SAMPLE_RATE,
        },
    )
