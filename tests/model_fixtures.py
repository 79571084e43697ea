"""The tiny models built once per test session.

Owns: ``session_models``, which the ``tiny_models`` fixtures of
``tests/models`` and ``tests/engines`` (and any other suite that needs real
engines) call.  Builds into ``$OMNIX_MODEL_DIR`` when set (only what is
missing: point it at a persistent folder to skip building across runs),
else once into the session's temporary directory (shared by pytest-xdist's
workers, one building while the others wait for it), and points
``OMNIX_MODEL_DIR`` there for the rest of the session so that tiny names
(``thinker``...) resolve in engines and in worker processes alike.  Does not
own building (``build.py``).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from omnix.models.paths import ModelPaths

_built: ModelPaths | None = None


def session_models(tmp_path_factory) -> ModelPaths:
    """Build (or find) the tiny models once per process; see module doc."""
    global _built
    if _built is None:
        from omnix.models.build import ensure_models

        env = os.environ.get("OMNIX_MODEL_DIR")
        base = tmp_path_factory.getbasetemp()
        if os.environ.get("PYTEST_XDIST_WORKER"):
            base = base.parent  # the run's folder, above each worker's own
        root = Path(env).expanduser() if env else base / "omnix-models"
        root.mkdir(parents=True, exist_ok=True)
        with open(root.parent / ".omnix-models.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _built = ensure_models(root)
        os.environ["OMNIX_MODEL_DIR"] = str(root)
    return _built
