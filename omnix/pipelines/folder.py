"""The pipeline a model folder is served as (``omnix serve PATH``).

Owns: reading a local folder (or a Hugging Face id's snapshot in the
local Hugging Face cache, found as ``vllm serve ORG/NAME`` finds it
offline: ``hf_cache.py``; the pipeline is then named
after the id, as vLLM names its model) and its ``config.json`` (a transformers model) or
``model_index.json`` (a diffusers pipeline), ``KINDS`` (the table of what
omnix serves, in the order it is tried: each row says what it matches and
builds the pipeline), ``derive_pipeline`` and ``FolderError``, a one-line
message naming the folder and what to do.  The architecture is read as
vLLM reads it: ``architectures[0]``, else transformers' base class for the
``model_type``.

A derived pipeline is a ``PipelineConfig`` like any other: ``omnix
pipelines show --model PATH`` prints it as TOML, which ``--pipeline FILE``
serves unchanged.  Its vLLM stages leave max_model_len, max_num_seqs and
gpu_memory_utilization to vLLM (as ``vllm serve PATH`` does) and run the
checkpoint's own dtype; ``gpu`` says whether it is derived for a GPU
machine, which decides eager mode (CUDA graphs there; on CPU vLLM would
compile the model with inductor first, minutes on a small machine) and a
diffusers stage's dtype.  Does not own serving (``omnix.http.serve``) nor
vLLM's engine flags (``vllm_args.py``).
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnix.events.types import StageParams
from omnix.pipelines.config import (
    Code2WavArgs,
    DiffusersArgs,
    DuplexArgs,
    EdgeConfig,
    MediaLimits,
    PipelineConfig,
    Qwen3TTSDecoderArgs,
    Qwen3TTSTalkerArgs,
    StageConfig,
    TalkerArgs,
    VllmArgs,
)
from omnix.pipelines.families import VIDEO_FAMILIES
from omnix.pipelines.hf_cache import hf_cached, is_hf_id
from omnix.pipelines.tts_card import VARIANT_TASKS, is_qwen3_tts, tts_card

QWEN3_OMNI = "Qwen3OmniMoeForConditionalGeneration"
MOSHI = "MoshiForConditionalGeneration"


class FolderError(ValueError):
    """The folder cannot be served; the message says why, in one line."""


@dataclass(frozen=True)
class Folder:
    """A local model folder and what its configs say."""

    path: Path
    config: dict[str, Any] = field(default_factory=dict)  # config.json
    index: dict[str, Any] = field(default_factory=dict)  # model_index.json
    #: the Hugging Face id the folder was found by in the hub's cache ("" a local folder)
    repo_id: str = ""

    @property
    def name(self) -> str:
        """The id it was named by (``ORG/NAME``, as vLLM names the model), else the folder's name."""
        return self.repo_id or self.path.name

    @property
    def architecture(self) -> str:
        """As vLLM reads it: ``architectures[0]``, else transformers' base
        model class for ``model_type`` ("" when neither says)."""
        archs = self.config.get("architectures") or []
        if archs and isinstance(archs[0], str):
            return archs[0]
        model_type = self.config.get("model_type")
        if not isinstance(model_type, str):
            return ""
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

        return str(MODEL_MAPPING_NAMES.get(model_type, ""))

    @property
    def pipeline_class(self) -> str:
        """A diffusers folder's pipeline class (``FluxPipeline``)."""
        return str(self.index.get("_class_name", ""))

    @property
    def dtype(self) -> str:
        """The checkpoint's own dtype (config.json's ``dtype``), else vLLM's ``auto``."""
        value = self.config.get("dtype") or self.config.get("torch_dtype")
        return value if isinstance(value, str) and value else "auto"


@dataclass(frozen=True)
class Kind:
    """One row of the table: what a folder is, what it becomes."""

    name: str
    serves: str  # for the docs and for the error that lists what is served
    matches: Callable[[Folder], bool]
    build: Callable[[Folder, bool], PipelineConfig]


def _single(f: Folder, what: str, stage: StageConfig, outputs: dict[str, str]) -> PipelineConfig:
    return PipelineConfig(
        name=f.name,
        description=f"{f.path}: {what}",
        stages=(stage,),
        outputs=outputs,  # type: ignore[arg-type]  # the keys are Modality literals
    )


def _vllm(f: Folder, gpu: bool, **more: Any) -> VllmArgs:
    """A vLLM stage over the folder as ``vllm serve PATH`` would run it:
    vLLM's max_model_len, max_num_seqs and memory share, the checkpoint's
    dtype, CUDA graphs on a GPU."""
    kw: dict[str, Any] = dict(
        model=str(f.path),
        dtype=f.dtype,
        max_model_len=0,
        max_num_seqs=0,
        gpu_memory_utilization=0,
        enforce_eager=not gpu,
    )
    kw.update(more)
    return VllmArgs(**kw)


def text_model(f: Folder, gpu: bool) -> PipelineConfig:
    stage = StageConfig(name="llm", engine=_vllm(f, gpu))
    return _single(f, f"{f.architecture} on vLLM (text in, text out)", stage, {"text": "llm"})


def _diffusers(f: Folder, gpu: bool, **more: Any) -> DiffusersArgs:
    size = _read(f.path / "vae" / "config.json").get("sample_size")
    kw: dict[str, Any] = {"model": str(f.path), "dtype": "bfloat16" if gpu else "float32"}
    if isinstance(size, int) and size > 0:
        kw["default_size"] = size
    return DiffusersArgs(**kw, **more)


def text_to_image(f: Folder, gpu: bool) -> PipelineConfig:
    stage = StageConfig(name="image", engine=_diffusers(f, gpu), timeout_s=300)
    what = f"{f.pipeline_class} on diffusers (text in, image out)"
    return _single(f, what, stage, {"image": "image"})


def text_to_video(f: Folder, gpu: bool) -> PipelineConfig:
    """A video job's stage as ``tiny-video`` runs it: a first frame taken
    where the family has image-to-video, the generation restarted after a
    server's kill -9 (a diffusion stage cannot continue from a step)."""
    first_frame = bool(VIDEO_FAMILIES[f.pipeline_class].image_to_video)
    stage = StageConfig(
        name="video",
        engine=_diffusers(f, gpu, output_modality="video"),
        timeout_s=1800,
        retry=True,
        media=MediaLimits(image=True, max_image_parts=1) if first_frame else None,
    )
    what = f"{f.pipeline_class} on diffusers (text{', a first frame' if first_frame else ''} in, video out)"
    return _single(f, what, stage, {"video": "video"})


def qwen3_omni(f: Folder, gpu: bool) -> PipelineConfig:
    """Qwen3-Omni as ``tiny-omni`` serves it: thinker -> talker -> code2wav
    over the one folder, the thinker sending its talker context; the
    thinker alone when the checkpoint does not speak.  Its output is read
    as vLLM's recipes for Qwen3-Omni read it: hermes-style tool calls
    (``<tool_call>{json}</tool_call>``), and, on the thinker alone (the
    Thinking checkpoint), Qwen3's reasoning parser."""
    speaks = f.config.get("enable_audio_output", True) is not False
    thinker = StageConfig(
        name="thinker",
        engine=_vllm(
            f,
            gpu,
            limit_mm_per_prompt={"audio": 1, "image": 1, "video": 1},
            enable_auto_tool_choice=True,
            tool_call_parser="hermes",
            **({} if speaks else {"reasoning_parser": "qwen3"}),
            # The talker and Code2Wav share the GPU unless devices place
            # them elsewhere.
            **({"talker_context": True} if speaks else {}),
            **({"gpu_memory_utilization": 0.7} if speaks and gpu else {}),
        ),
        media=MediaLimits(audio=True, image=True, video=True, max_audio_seconds=120.0),
    )
    if not speaks:
        what = "the Qwen3-Omni thinker on vLLM (text, audio, image, video in; text out)"
        return _single(f, what, thinker, {"text": "thinker"})
    return PipelineConfig(
        name=f.name,
        description=f"{f.path}: Qwen3-Omni thinker -> talker -> code2wav "
        "(text, audio, image, video in; text + audio out)",
        stages=(
            thinker,
            StageConfig(
                name="talker",
                engine=TalkerArgs(
                    model=str(f.path), dtype=f.dtype if f.dtype != "auto" else "float32"
                ),
                # The reference's talker sampling (vLLM-Omni's stage config).
                sampling=StageParams(temperature=0.9, top_k=50),
            ),
            StageConfig(name="code2wav", engine=Code2WavArgs(model=str(f.path))),
        ),
        edges=(
            EdgeConfig(source="thinker", target="talker", forward="chunk", every=2),
            EdgeConfig(source="talker", target="code2wav", forward="chunk", every=5),
        ),
        outputs={"text": "thinker", "audio": "code2wav"},
    )


def qwen3_tts(f: Folder, gpu: bool) -> PipelineConfig:
    """Qwen3-TTS CustomVoice, VoiceDesign or Base: talker -> code2wav (the
    12 Hz speech decoder) over the one folder, text in, audio out (Base's
    talker stage loads the voice cloner beside the talker).  The decoder
    gets the talker's frames five at a time and decodes its first five at
    once (the first packet), then 25 at a time with 25 frames of left
    context, as the reference decodes; a voice cloned in context is
    decoded after its reference codes, whole (``SpeechCodec.decode_after``)."""
    card = tts_card(f.config)
    if not card.served:
        raise FolderError(
            f"{f.path}: Qwen3-TTS {card.variant or '(no tts_model_type)'} is not a variant omnix "
            f"serves; it serves {', '.join(VARIANT_TASKS)}"
        )
    return PipelineConfig(
        name=f.name,
        description=f"{f.path}: Qwen3-TTS {card.variant} talker -> code2wav (text in, audio out)",
        stages=(
            StageConfig(
                name="talker",
                engine=Qwen3TTSTalkerArgs(
                    model=str(f.path), dtype=f.dtype if f.dtype != "auto" else "float32"
                ),
                # The reference's sampling (the folder's generation_config.json).
                sampling=StageParams(temperature=0.9, top_k=50),
            ),
            StageConfig(name="code2wav", engine=Qwen3TTSDecoderArgs(model=str(f.path))),
        ),
        edges=(EdgeConfig(source="talker", target="code2wav", forward="chunk", every=5),),
        outputs={"audio": "code2wav"},
    )


def moshi(f: Folder, gpu: bool) -> PipelineConfig:
    """Moshi: one ``moshi_duplex`` stage over the folder, full-duplex
    sessions (the user's audio in as it streams, per 80 ms frame the
    model's text token and audio out), ticking in real time."""
    dtype = f.dtype if f.dtype not in ("auto", "") else "float32"
    # No queue: a session waiting for a slot would hear nothing while its
    # client talks; one past the slots is refused (resource_exhausted).
    stage = StageConfig(
        name="duplex", engine=DuplexArgs(model=str(f.path), dtype=dtype), max_queue=0
    )
    return _single(
        f, "Moshi full duplex (audio in, text and audio out)", stage, {"audio": "duplex"}
    )


def _is_text_to_image(f: Folder) -> bool:
    return bool(f.index) and f.pipeline_class in text_to_image_classes()


def _is_text_to_video(f: Folder) -> bool:
    return bool(f.index) and f.pipeline_class in VIDEO_FAMILIES


def _vllm_serves(f: Folder) -> bool:
    return bool(f.config) and f.architecture in vllm_architectures()


#: What omnix serves a folder as, tried in order (Qwen3-Omni before the
#: vLLM row, which would otherwise take it as a thinker alone).
KINDS: tuple[Kind, ...] = (
    Kind(
        "Qwen3-Omni",
        f"{QWEN3_OMNI} (Qwen3-Omni): thinker (vLLM) -> talker -> code2wav, or the thinker "
        "alone when enable_audio_output is false",
        lambda f: bool(f.config) and f.architecture == QWEN3_OMNI,
        qwen3_omni,
    ),
    Kind(
        "Qwen3-TTS",
        "Qwen3TTSForConditionalGeneration (Qwen3-TTS CustomVoice, VoiceDesign or Base): "
        "talker -> code2wav (text in, audio out)",
        lambda f: bool(f.config) and is_qwen3_tts(f.config),
        qwen3_tts,
    ),
    Kind(
        "Moshi",
        f"{MOSHI} (Moshi): one full-duplex stage (moshi_duplex)",
        lambda f: bool(f.config) and f.architecture == MOSHI,
        moshi,
    ),
    Kind(
        "text-to-image",
        "a diffusers text-to-image pipeline (the classes of diffusers' AutoPipelineForText2Image: "
        "FluxPipeline, StableDiffusionPipeline, ...): one diffusers stage",
        _is_text_to_image,
        text_to_image,
    ),
    Kind(
        "text-to-video",
        f"a diffusers text-to-video pipeline ({', '.join(sorted(VIDEO_FAMILIES))}): one diffusers "
        "stage serving /v1/videos",
        _is_text_to_video,
        text_to_video,
    ),
    Kind(
        "vLLM",
        "an architecture vLLM serves (vllm.ModelRegistry): one vLLM stage, text in, text out",
        _vllm_serves,
        text_model,
    ),
)


def read_folder(path: str | Path) -> Folder:
    """The folder and its configs; ``FolderError`` when it is not one."""
    p = Path(path).expanduser()
    repo_id = ""
    if not p.exists() and isinstance(path, str) and is_hf_id(path):
        try:
            p, repo_id = hf_cached(path), path
        except FileNotFoundError as missing:
            raise FolderError(str(missing)) from None
    if not p.exists():
        raise FolderError(
            f"{path}: no such folder: give a local model folder or a Hugging Face id ORG/NAME "
            "in the local Hugging Face cache (omnix never downloads: fetch it first with "
            "`hf download ORG/NAME`)"
        )
    if not p.is_dir():
        raise FolderError(
            f"{path} is a file, not a model folder (to serve a pipeline file, give --pipeline FILE)"
        )
    p = p.resolve()
    config, index = _read(p / "config.json"), _read(p / "model_index.json")
    if not config and not index:
        raise FolderError(
            f"{p} has no config.json (a transformers model) and no model_index.json (a diffusers "
            "pipeline): give the folder that holds the model's files"
        )
    return Folder(p, config, index, repo_id)


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise FolderError(f"{path}: cannot read it as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise FolderError(f"{path}: not a JSON object")
    return data


def derive_pipeline(path: str | Path, *, gpu: bool) -> PipelineConfig:
    """The pipeline the folder at ``path`` is served as; ``FolderError``
    (one line) when it cannot be."""
    f = read_folder(path)
    for kind in KINDS:
        if kind.matches(f):
            return kind.build(f, gpu)
    raise FolderError(_not_served(f))


def _not_served(f: Folder) -> str:
    served = "; ".join(k.serves for k in KINDS)
    if f.index:
        what = f"a diffusers {f.pipeline_class or 'pipeline without _class_name'}"
        known = text_to_image_classes() | VIDEO_FAMILIES.keys()
        near = difflib.get_close_matches(f.pipeline_class, sorted(known), n=3)
    elif not f.architecture:
        return (
            f"{f.path}/config.json names no architecture (no architectures, and no model_type "
            "transformers knows): serve it with a pipeline file (--pipeline FILE)"
        )
    else:
        what = f"architecture {f.architecture}"
        near = difflib.get_close_matches(f.architecture, sorted(vllm_architectures()), n=3)
    hint = f" (near: {', '.join(near)})" if near else ""
    return f"{f.path}: {what} is not one omnix serves{hint}; it serves {served}"


@functools.cache
def vllm_architectures() -> frozenset[str]:
    """The architectures the installed vLLM serves."""
    from omnix.pipelines.vllm_args import import_vllm

    import_vllm()
    from vllm import ModelRegistry

    return frozenset(ModelRegistry.get_supported_archs())


@functools.cache
def text_to_image_classes() -> frozenset[str]:
    """diffusers' text-to-image pipeline classes (its own
    ``AUTO_TEXT2IMAGE_PIPELINES_MAPPING``, read from the installed
    source rather than imported, which would import every pipeline:
    seconds), less those that need a control or mask image."""
    spec = importlib.util.find_spec("diffusers")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    source = Path(next(iter(spec.submodule_search_locations))) / "pipelines" / "auto_pipeline.py"
    try:
        tree = ast.parse(source.read_text())
    except (OSError, SyntaxError):
        return frozenset()
    names: set[str] = set()
    mapping = "AUTO_TEXT2IMAGE_PIPELINES_MAPPING"
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            (isinstance(t, ast.Name) and t.id == mapping)
            or (isinstance(t, ast.Subscript) and getattr(t.value, "id", "") == mapping)
            for t in node.targets
        ):
            names.update(n.id for n in ast.walk(node.value) if isinstance(n, ast.Name))
    return frozenset(
        n for n in names if n.endswith("Pipeline") and "Control" not in n and "Inpaint" not in n
    )
