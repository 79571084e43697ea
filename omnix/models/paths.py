"""Where the tiny models live and how a stage's ``model`` names one.

Owns: the model cache location (``default_model_dir``), ``ModelPaths`` (the
tiny model folders), ``resolve_model`` (a tiny name -> its folder in the
cache; a local folder used as is; else a Hugging Face id ``ORG/NAME`` ->
its snapshot in the local Hugging Face cache, as ``vllm serve ORG/NAME``
finds it offline: ``omnix.pipelines.hf_cache``), the ``omnix.json``
marker a finished build writes, folder digests, and ``built_once`` (a
published-size folder a GPU bench builds into a cache directory once and
reuses).  Does not own
building (``build.py``), loading (``omnix.engines``) nor downloading:
nothing here ever fetches a file.  Imports nothing heavy
(``huggingface_hub`` only when an id is looked up): the HTTP server and
workers call it before deciding whether to build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import msgspec

from omnix.pipelines.hf_cache import hf_cached, is_hf_id

#: What keeps Hugging Face's libraries from reaching a hub (omnix loads
#: local folders only; a library reads these when it is imported).
OFFLINE_ENV: Mapping[str, str] = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def stay_offline(environ: MutableMapping[str, str] = os.environ) -> None:
    """``OFFLINE_ENV`` into ``environ`` where it says nothing of its own."""
    for name, value in OFFLINE_ENV.items():
        environ.setdefault(name, value)


#: The models ``omnix models init`` builds, in build order.
TINY_MODELS: tuple[str, ...] = (
    "thinker",
    "talker",
    "code2wav",
    "image",
    "omni_thinker",
    "omni",
    "video",
    "qwen3_tts_custom_voice",
    "qwen3_tts_voice_design",
    "qwen3_tts_base",
    "moshi",
    "personaplex",
)

#: Written last into a built folder; its presence means "complete".
MARKER = "omnix.json"

#: Bumped when a builder changes what it writes (so old caches are rebuilt).
BUILD_FORMAT = 2


class ModelPaths(msgspec.Struct, frozen=True):
    """The folders of the tiny models inside one model dir."""

    root: str
    thinker: str
    talker: str
    code2wav: str
    image: str
    omni_thinker: str
    omni: str
    video: str
    qwen3_tts_custom_voice: str
    qwen3_tts_voice_design: str
    qwen3_tts_base: str
    moshi: str
    personaplex: str

    @classmethod
    def under(cls, root: Path) -> ModelPaths:
        root = Path(root)
        return cls(str(root), *(str(root / name) for name in TINY_MODELS))

    def path(self, name: str) -> Path:
        return Path(getattr(self, name))


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Contents of a tiny model's ``omnix.json``.  ``layout`` carries what an
    engine must know beyond the HF config (the talker's vocabulary layout)."""

    name: str
    format: int = BUILD_FORMAT
    seed: int = 0
    layout: dict[str, int] = {}


def default_model_dir() -> Path:
    """``$OMNIX_MODEL_DIR``, else ``~/.cache/omnix/models``."""
    env = os.environ.get("OMNIX_MODEL_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "omnix" / "models"


def read_info(folder: Path) -> ModelInfo | None:
    """The folder's ``omnix.json``, or None (not an omnix-built model, or an
    unfinished build)."""
    path = Path(folder) / MARKER
    if not path.is_file():
        return None
    try:
        return msgspec.json.decode(path.read_bytes(), type=ModelInfo)
    except msgspec.DecodeError:
        return None


def is_built(folder: Path, name: str) -> bool:
    info = read_info(folder)
    return info is not None and info.name == name and info.format == BUILD_FORMAT


def _looks_like_path(name: str) -> bool:
    return os.sep in name or name.startswith((".", "~")) or (os.altsep or "\0") in name


def resolve_model(name_or_path: str | Path, model_dir: Path | None = None) -> Path:
    """The folder a stage's ``model`` refers to.

    A bare tiny name (``thinker``, ``talker``, ``code2wav``, ``image``)
    resolves into ``model_dir`` (default: ``default_model_dir()``); an
    existing local folder is used as is; a Hugging Face id ``ORG/NAME``
    that is not a local folder is its snapshot in the local Hugging Face
    cache (``hf_cached``).  Nothing is ever downloaded.
    """
    text = str(name_or_path)
    if isinstance(name_or_path, str) and text in TINY_MODELS and not _looks_like_path(text):
        root = Path(model_dir) if model_dir is not None else default_model_dir()
        folder = root / text
        if not is_built(folder, text):
            raise FileNotFoundError(
                f"tiny model {text!r} is not built in {root}: run `omnix models init"
                f"{'' if model_dir is None else f' --dir {root}'}` (or set OMNIX_MODEL_DIR "
                "to the folder that holds it)"
            )
        return folder
    folder = Path(text).expanduser()
    if not folder.is_dir() and isinstance(name_or_path, str) and is_hf_id(text):
        return hf_cached(text)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"model folder {folder} not found: give a local model folder (weights are never "
            f"downloaded) or one of the tiny names {', '.join(TINY_MODELS)} "
            "built by `omnix models init`"
        )
    return folder


def folder_digest(folder: Path) -> str:
    """sha256 over every file's relative path and bytes, in sorted order:
    equal digests mean byte-identical folders."""
    h = hashlib.sha256()
    root = Path(folder)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root).as_posix()).encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


#: written last into a folder ``built_once`` finished
BUILT_MARKER = "omnix-published.json"


def built_once(
    folder: Path, build: Callable[[Path], dict[str, Any]]
) -> tuple[Path, dict[str, Any]]:
    """``folder`` and what its marker says, ``build(tmp)`` run first if it
    has none: into a temporary sibling renamed into place once the marker
    (``build``'s answer) is written, so a build cut short leaves nothing
    that looks finished."""
    marker = folder / BUILT_MARKER
    if marker.is_file():
        return folder, json.loads(marker.read_text())
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        info = build(tmp)
        (tmp / BUILT_MARKER).write_text(json.dumps(info, indent=1) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder, info
