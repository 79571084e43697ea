"""The tiny byte-level BPE tokenizer shared by the thinker and the talker.

Owns: training a byte-level BPE with ``tokenizers`` on the built-in corpus
and saving it as a *native* transformers ``Qwen2Tokenizer`` (with a ChatML
chat template), and ``load_tokenizer``, which loads any folder's tokenizer
as ``AutoTokenizer`` does (one omnix saved without importing torch).  Does
not own the models that use it (``build.py``).

Why native: for ``model_type: qwen2`` transformers 5.x's ``AutoTokenizer``
ignores ``tokenizer_class`` and rebuilds a ``Qwen2Tokenizer`` from the vocab
and merges with Qwen2's own normalizer (NFC), pre-tokenizer (Qwen2's split
regex, then byte-level) and decoder.  A tokenizer trained with any other
pipeline would then encode to different ids than ``tokenizer.json`` says.  So
we train with exactly Qwen2's pipeline and save through ``Qwen2Tokenizer``
itself: whichever loader reads the folder (``tokenizers``, ``AutoTokenizer``,
vLLM's ``get_tokenizer``) produces the same ids.  ``check_roundtrip`` proves
it for a folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnix.models.corpus import CORPUS, ROUNDTRIP_SAMPLES

if TYPE_CHECKING:  # imported where used: building models is rare
    from tokenizers import Tokenizer

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# ChatML, as Qwen2 uses it; a system message is optional.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen2's pre-tokenizer split (transformers.models.qwen2.tokenization_qwen2).
_QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def train_tokenizer(vocab_size: int = 1024) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train the byte-level BPE (deterministic: one fixed corpus, one
    thread-independent trainer) and return ``(vocab, merges)``."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE

    tok = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The corpus repeated a few times so min_frequency=2 admits its pairs.
    tok.train_from_iterator([line for line in CORPUS.splitlines(keepends=True)] * 3, trainer)
    model = tok.get_vocab(with_added_tokens=True)
    merges = _merges_of(tok)
    return model, merges


def merge_whole_words(
    vocab: dict[str, int], merges: list[tuple[str, str]], words: tuple[str, ...]
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """``vocab``/``merges`` extended so that each of ``words`` encodes as one
    token where it stands alone (after ``<|im_start|>``, say), as Qwen's
    tokenizer encodes its chat roles: code that slices a chat prompt at fixed
    offsets (Qwen3-Omni's talker) relies on it.

    The word's pieces under the trained merges are joined left to right by
    merges appended after the trained ones, each making a new token; the new
    tokens are new, so no trained merge can take them apart again.  Ids go
    after the trained vocabulary, in ``words`` order."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import BPE

    vocab, merges = dict(vocab), list(merges)
    for word in words:
        tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        pieces = tok.encode(word, add_special_tokens=False).tokens
        joined = pieces[0]
        for piece in pieces[1:]:
            merges.append((joined, piece))
            joined += piece
            vocab.setdefault(joined, len(vocab))
    return vocab, merges


def _merges_of(tok: Tokenizer) -> list[tuple[str, str]]:
    import json

    data = json.loads(tok.to_str())
    merges: list[tuple[str, str]] = []
    for m in data["model"]["merges"]:  # "a b" (older tokenizers) or ["a", "b"]
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        merges.append((a, b))
    return merges


def build_tokenizer(out_dir: Path, model_max_length: int = 2048) -> int:
    """Train and save the tokenizer into ``out_dir``; return its vocabulary
    size (special tokens included)."""
    vocab, merges = train_tokenizer()
    return save_tokenizer(out_dir, vocab, merges, model_max_length=model_max_length)


def save_tokenizer(
    out_dir: Path,
    vocab: dict[str, int],
    merges: list[tuple[str, str]],
    *,
    model_max_length: int,
    named: Mapping[str, str] | None = None,
) -> int:
    """Save ``vocab``/``merges`` as a native ``Qwen2Tokenizer`` with the
    ChatML template into ``out_dir``; ``named`` declares model-specific
    special tokens by attribute (``{"audio_token": "<|audio_pad|>"}``), as
    multimodal processors read them.  Returns the vocabulary size."""
    from transformers import Qwen2Tokenizer

    extra: dict[str, object] = {"model_specific_special_tokens": dict(named)} if named else {}
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        # Pairs, as in tokenizer.json: transformers takes them, though its
        # annotation names only "a b" strings.
        merges=merges,  # type: ignore[arg-type]
        unk_token=ENDOFTEXT,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=model_max_length,
        **extra,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out_dir))
    return len(tokenizer)


#: A folder holds a tokenizer when it has one of these.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(folder: Path, *, saved_by_omnix: bool) -> Any:
    """The transformers tokenizer in ``folder``, as ``AutoTokenizer`` loads
    it.  One ``save_tokenizer`` wrote (``saved_by_omnix``: its model folder
    has an ``omnix.json``; its ``tokenizer_config.json`` names
    ``Qwen2Tokenizer``) is loaded through that class, the one
    ``AutoTokenizer`` picks there (``check_roundtrip`` holds them equal at
    every build), without ``AutoTokenizer``'s import of torch: ~3 CPU-s in
    a process that needs none (the HTTP server counting prompts)."""
    if saved_by_omnix and _named_class(folder) == "Qwen2Tokenizer":
        from transformers import Qwen2Tokenizer

        return Qwen2Tokenizer.from_pretrained(str(folder))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def _named_class(folder: Path) -> str | None:
    import json

    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    name = config.get("tokenizer_class") if isinstance(config, dict) else None
    return name if isinstance(name, str) else None


def check_roundtrip(folder: Path, samples: tuple[str, ...] = ROUNDTRIP_SAMPLES) -> None:
    """Raise ``AssertionError`` unless the tokenizer in ``folder`` round-trips
    ``samples``, and the raw ``tokenizer.json``, the transformers loader
    (the one vLLM uses) and ``load_tokenizer`` agree on every id."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(str(folder))
    own = load_tokenizer(folder, saved_by_omnix=True)
    assert type(own) is type(hf), f"{folder}: AutoTokenizer loads {type(hf).__name__}"
    for text in samples:
        ids = hf.encode(text, add_special_tokens=False)
        raw_ids = raw.encode(text, add_special_tokens=False).ids
        assert ids == raw_ids, f"loaders disagree on {text!r}: {ids} != {raw_ids}"
        assert own.encode(text, add_special_tokens=False) == ids, text
        back = hf.decode(ids)
        assert back == text, f"round-trip changed {text!r} into {back!r}"
