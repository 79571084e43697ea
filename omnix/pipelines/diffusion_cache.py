"""A diffusion stage's step cache, compilation and CFG batching, as the pipeline file says them.

Owns: the typed ``cache`` table of a diffusers stage (``StepCache``, a
tagged union on ``kind``, one Struct per cache of diffusers' own hooks,
its fields named and defaulted as diffusers names them, so an option
diffusers' config does not have is refused at decode), the ``compile``
setting (``CompileMode``), which kinds work for which pipeline family
(``CACHE_FAMILIES``, measured on omnix's tiny Flux and Wan), the one-line
problems of a setting (``cache_problems``, ``family_problem``) and the
command line's ``--cache`` spec (``parse_cache_spec``); the ``cfg_batch``
setting's families (``CFG_BATCH_FAMILIES``), what it comes to on a family
(``cfg_batches``, ``cfg_batch_problem``) and its ``--cfg-batch`` spec
(``parse_cfg_batch_spec``); the ``--compile`` spec (``parse_compile_spec``).
Read without torch or diffusers.

Does not own applying a cache to a loaded pipeline
(``omnix.engines.diffusers_cache``) nor reading a model folder.
"""

from __future__ import annotations

import tomllib
from typing import Final, Literal

import msgspec

_STRICT = dict(frozen=True, forbid_unknown_fields=True, kw_only=True)


class FirstBlockCache(msgspec.Struct, tag="first_block", tag_field="kind", **_STRICT):
    """diffusers' ``FirstBlockCacheConfig``: the rest of the blocks is
    skipped, their last residual reused, while the first block's output
    residual moves less than ``threshold`` (relative mean) between steps."""

    threshold: float = 0.05


class TaylorSeerCache(msgspec.Struct, tag="taylorseer", tag_field="kind", **_STRICT):
    """diffusers' ``TaylorSeerCacheConfig``: full computes every
    ``cache_interval`` steps, the outputs between them predicted by a
    Taylor expansion of order ``max_order``."""

    cache_interval: int = 5
    disable_cache_before_step: int = 3
    disable_cache_after_step: int | None = None
    max_order: int = 1
    taylor_factors_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    use_lite_mode: bool = False


class PyramidAttentionBroadcast(
    msgspec.Struct, tag="pyramid_attention_broadcast", tag_field="kind", **_STRICT
):
    """diffusers' ``PyramidAttentionBroadcastConfig``: attention outputs
    reused for ``*_block_skip_range`` steps while the timestep is inside
    ``*_timestep_skip_range`` (timesteps 0..1000)."""

    spatial_attention_block_skip_range: int | None = 2
    temporal_attention_block_skip_range: int | None = None
    cross_attention_block_skip_range: int | None = None
    spatial_attention_timestep_skip_range: tuple[int, int] = (100, 800)
    temporal_attention_timestep_skip_range: tuple[int, int] = (100, 800)
    cross_attention_timestep_skip_range: tuple[int, int] = (100, 800)


StepCache = FirstBlockCache | TaylorSeerCache | PyramidAttentionBroadcast
CacheKind = Literal["first_block", "taylorseer", "pyramid_attention_broadcast"]
CACHE_KINDS: Final[tuple[CacheKind, ...]] = (
    "first_block",
    "taylorseer",
    "pyramid_attention_broadcast",
)

#: ``torch.compile`` of the denoiser: ``off``; ``blocks``: diffusers'
#: ``compile_repeated_blocks`` (each transformer block compiled once, the
#: cache hooks outside the compiled code: works with every cache);
#: ``model``: the whole transformer (a cache's step-dependent branches
#: break its graph: refused with a cache).
CompileMode = Literal["off", "blocks", "model"]

#: The cache kinds that run on each pipeline family (``model_index.json``'s
#: ``_class_name``), edits and image-to-video included: the hooks sit on
#: the transformer, which the sibling pipelines share.  Measured on omnix's
#: tiny Flux and Wan 2.2 (docs/engines.md, "Step caching").  Not taylorseer
#: on Wan: its default module patterns (``^blocks.*attn``, matched whole)
#: match none of Wan's ``attn1``/``attn2``, so it would run uncached.
CACHE_FAMILIES: Final[dict[str, tuple[CacheKind, ...]]] = {
    "FluxPipeline": CACHE_KINDS,
    "FluxKontextPipeline": CACHE_KINDS,
    "WanPipeline": ("first_block", "pyramid_attention_broadcast"),
}


def cache_kind(cache: StepCache) -> CacheKind:
    tag = type(cache).__struct_config__.tag
    assert isinstance(tag, str)
    return tag  # type: ignore[return-value]


def cache_problems(cache: StepCache | None, compile_mode: CompileMode) -> list[str]:
    """Problems of a cache setting in itself (ranges, compile together)."""
    problems: list[str] = []
    match cache:
        case None:
            return problems
        case FirstBlockCache():
            if not cache.threshold > 0:
                problems.append(f"engine.cache.threshold must be > 0, got {cache.threshold}")
        case TaylorSeerCache():
            if cache.cache_interval < 1:
                problems.append(
                    f"engine.cache.cache_interval must be >= 1, got {cache.cache_interval}"
                )
            if cache.max_order < 0 or cache.disable_cache_before_step < 0:
                problems.append("engine.cache.max_order and disable_cache_before_step must be >= 0")
        case PyramidAttentionBroadcast():
            ranges = (
                cache.spatial_attention_block_skip_range,
                cache.temporal_attention_block_skip_range,
                cache.cross_attention_block_skip_range,
            )
            if all(r is None for r in ranges):
                problems.append(
                    "engine.cache: give pyramid_attention_broadcast at least one "
                    "*_attention_block_skip_range (e.g. spatial_attention_block_skip_range = 2)"
                )
            if any(r is not None and r < 1 for r in ranges):
                problems.append("engine.cache: a *_attention_block_skip_range must be >= 1")
    if compile_mode == "model":
        problems.append(
            f"engine.compile = 'model' with engine.cache ({cache_kind(cache)}): the cache's "
            "step-dependent branches break a whole-model graph; use compile = 'blocks'"
        )
    return problems


def family_problem(cache: StepCache | None, pipeline: str) -> str | None:
    """The one line for a cache asked of a pipeline whose transformer
    diffusers' hooks are not known to run on; None when they do."""
    if cache is None:
        return None
    works = CACHE_FAMILIES.get(pipeline, ())
    if cache_kind(cache) in works:
        return None
    if not works:
        return (
            f"engine.cache: diffusers' cache hooks are not known to run on "
            f"{pipeline or 'this pipeline'} (caches work on: {', '.join(CACHE_FAMILIES)}); "
            "remove the cache table"
        )
    return (
        f"engine.cache: {cache_kind(cache)} does not run on {pipeline}; "
        f"the kinds that do: {', '.join(works)}"
    )


#: The families whose two classifier-free guidance forwards omnix runs
#: as one batch (``omnix.engines.diffusers_cfg``): Wan's text- and
#: image-to-video pipelines call the transformer twice a step, on the
#: same latents, with the prompt's and the negative prompt's embeddings;
#: Flux's text-to-image does with true CFG (``true_cfg_scale > 1`` and a
#: ``negative_prompt``).  Flux's image-to-image, inpaint and Kontext
#: classes run their two forwards one after the other.
CFG_BATCH_FAMILIES: Final = frozenset({"WanPipeline", "FluxPipeline"})


def cfg_batches(cfg_batch: bool | None, pipeline: str) -> bool:
    """Whether a stage batches its guidance forwards: as set, else (unset)
    where the family is one omnix batches."""
    return cfg_batch if cfg_batch is not None else pipeline in CFG_BATCH_FAMILIES


def cfg_batch_problem(cfg_batch: bool | None, pipeline: str) -> str | None:
    """The one line for ``cfg_batch = true`` on a family omnix does not
    batch the guidance of; None otherwise."""
    if cfg_batch is not True or pipeline in CFG_BATCH_FAMILIES:
        return None
    return (
        f"engine.cfg_batch: omnix batches the two guidance forwards of "
        f"{', '.join(sorted(CFG_BATCH_FAMILIES))} only, not {pipeline or 'this pipeline'}'s; "
        "remove cfg_batch (or set it false)"
    )


def parse_cfg_batch_spec(spec: str) -> tuple[str | None, bool]:
    """``--cfg-batch [STAGE:]on|off`` -> (stage or None for every diffusion
    stage, on).  Raises ``ValueError`` naming the two values."""
    stage, colon, value = spec.rpartition(":")
    words = {"on": True, "off": False, "true": True, "false": False}
    on = words.get(value.strip().lower())
    if on is None:
        raise ValueError(f"--cfg-batch {spec!r}: give [STAGE:]on or [STAGE:]off")
    return (stage.strip() or None) if colon else None, on


COMPILE_MODES: Final[tuple[CompileMode, ...]] = ("off", "blocks", "model")


def parse_compile_spec(spec: str) -> tuple[str | None, CompileMode]:
    """``--compile [STAGE:]off|blocks|model`` -> (stage or None for every
    diffusion stage, the mode).  Raises ``ValueError`` naming the modes."""
    stage, colon, value = spec.rpartition(":")
    word = value.strip().lower()
    for mode in COMPILE_MODES:
        if word == mode:
            return (stage.strip() or None) if colon else None, mode
    raise ValueError(f"--compile {spec!r}: give [STAGE:]off, [STAGE:]blocks or [STAGE:]model")


def explain_decode_error(message: str) -> str | None:
    """A decode error inside a stage's ``cache`` table, with the kinds and
    each kind's options said; None for an error elsewhere."""
    if ".engine.cache" not in message:
        return None
    kinds = ", ".join(CACHE_KINDS)
    if "Invalid value" in message and message.rstrip("`").endswith(".kind"):
        return f"{message}: not a cache kind (kinds: {kinds}; no cache table for none)"
    options = "; ".join(
        f"{kind}: {', '.join(f for f in cls.__struct_fields__)}"
        for kind, cls in zip(CACHE_KINDS, _CLASSES, strict=True)
    )
    return f"{message} (cache kinds and their options, as diffusers names them: {options})"


_CLASSES = (FirstBlockCache, TaylorSeerCache, PyramidAttentionBroadcast)


def parse_cache_spec(spec: str) -> tuple[str | None, StepCache | None]:
    """``--cache [STAGE:]KIND[,NAME=VALUE...]`` -> (stage or None for every
    diffusion stage, the cache; None for ``none``).  Values are TOML values
    (``0.1``, ``[100, 800]``, ``true``); a bare word is a string.  Raises
    ``ValueError`` with the kinds and options on a bad spec."""
    head, _, rest = spec.partition(",")
    stage, colon, kind = head.rpartition(":")
    kind = kind.strip()
    if kind == "none":
        if rest:
            raise ValueError(f"--cache {spec!r}: 'none' takes no options")
        return (stage.strip() or None) if colon else None, None
    table: dict[str, object] = {"kind": kind}
    for item in filter(None, (p.strip() for p in _split(rest))):
        name, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--cache {spec!r}: {item!r} is not NAME=VALUE")
        try:
            table[name.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            table[name.strip()] = value.strip()
    try:
        cache = msgspec.convert(table, StepCache)
    except msgspec.ValidationError as exc:
        text = str(exc)
        text = (
            text.replace("`$", "`$.engine.cache")
            if "`$" in text
            else f"{text} - at `$.engine.cache`"
        )
        why = explain_decode_error(text) or text
        raise ValueError(f"--cache {spec!r}: {why}") from None
    return (stage.strip() or None) if colon else None, cache


def _split(text: str) -> list[str]:
    """Split on commas outside brackets (``a=[1, 2],b=3``)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out
