"""A local Hugging Face hub cache laid out as ``hf download`` leaves it, for tests.

Owns ``hub_cache``: ``models--ORG--NAME/blobs/<sha>`` holding a local
folder's files, ``snapshots/<commit>/`` of links to them and
``refs/main`` naming the commit, so ``huggingface_hub``'s own offline
lookup finds the model by its id.  Does not download anything nor own
the lookup (``omnix.pipelines.hf_cache``).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(cache: Path, repo_id: str, folder: Path) -> Path:
    """Puts ``folder``'s files into the hub cache ``cache`` as ``repo_id``
    at ``COMMIT`` (``refs/main``); returns the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    for src in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        rel = src.relative_to(folder)
        blob = repo / "blobs" / hashlib.sha256(src.read_bytes()).hexdigest()
        if not blob.exists():
            shutil.copyfile(src, blob)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path(*[".."] * (len(rel.parts) + 1), "blobs", blob.name))
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot
