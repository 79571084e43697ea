"""A Hugging Face model id found in the local Hugging Face cache, never downloaded.

Owns ``is_hf_id`` (``ORG/NAME`` as the hub spells a model id) and
``hf_cached`` (the id's snapshot folder in the hub cache, looked up by
``huggingface_hub`` itself with ``local_files_only``, as ``vllm serve
ORG/NAME`` finds a model offline: ``$HF_HUB_CACHE``, else
``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``; the commit
``refs/main`` names), whose error is one line saying what to download.
Both ``omnix serve ORG/NAME`` (``folder.py``) and a stage's ``model``
(``omnix.models.paths.resolve_model``) resolve ids here.  Does not own
downloading (omnix never does) nor what a folder is served as
(``folder.py``).  ``huggingface_hub`` is imported only when an id is
looked up.
"""

from __future__ import annotations

import re
from pathlib import Path

#: A Hugging Face model id, ``ORG/NAME`` (the hub's own rule, less its length cap).
_HF_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def is_hf_id(text: str) -> bool:
    """``ORG/NAME`` as the hub spells a model id (no ``--`` or ``..``, not ``.git``)."""
    return (
        _HF_ID.fullmatch(text) is not None
        and "--" not in text
        and ".." not in text
        and not text.endswith(".git")
    )


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache ``huggingface_hub`` reads: ``$HF_HUB_CACHE``,
    else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hf_cached(repo_id: str) -> Path:
    """The snapshot folder of the model ``repo_id`` in the local Hugging Face
    cache (``models--ORG--NAME/snapshots/<commit>``, the commit ``refs/main``
    names), looked up as ``vllm serve`` does offline, by ``huggingface_hub``
    itself; never downloads.
    ``FileNotFoundError`` (one line: what to download) when it is not there."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cache = hf_cache_dir()
    try:
        folder = snapshot_download(repo_id, repo_type="model", local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        raise FileNotFoundError(
            f"{repo_id} is neither a local folder nor a model in the Hugging Face cache "
            f"({cache}): omnix never downloads; fetch it first with `hf download {repo_id}` "
            "(or point HF_HUB_CACHE / HF_HOME at the cache that holds it, or give the model's "
            "local folder)"
        ) from None
    return Path(folder)
