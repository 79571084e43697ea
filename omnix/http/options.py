"""The HTTP server's knobs, in one value.

Owns ``HttpOptions``: what ``omnix serve``'s HTTP flags set (API key, body
and batch limits, CORS origins, media hosts, the stream-resume grace,
where uploaded voices are kept) and
``build_app``/``HttpServer``/``Routes`` read.  Imports nothing heavy, so
``serve.py`` can show the defaults in ``--help`` before loading any HTTP
code.  Does not own parsing the flags (``serve.py``) nor what each knob
does (``app.py``, ``core/``, ``media/``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: Largest request body (bytes); larger ones get 413.  Room for one media
#: part at its default limit (10 MiB, about 13.4 MiB as base64) plus the
#: text, so an oversized part gets the 400 that names it, not a 413.
DEFAULT_MAX_BODY = 32 * 1024 * 1024

#: The most requests one call may submit (a batch of conversations).
DEFAULT_MAX_BATCH = 256


@dataclass(frozen=True, slots=True)
class HttpOptions:
    """How one server answers, beside its pipeline."""

    #: The bearer key every /v1 route requires; None: open.
    api_key: str | None = None
    #: Largest request body in bytes (413 beyond).
    max_body: int = DEFAULT_MAX_BODY
    #: The most requests one call may submit; more is 400.
    max_batch: int = DEFAULT_MAX_BATCH
    #: Seconds a streamed request outlives its dropped client, for a
    #: reconnect to ``/v1/requests/{id}/stream`` (0: cancel at once).
    resume_grace_s: float = 0.0
    #: Browser origins CORS allows (``cors.parse_origins``; ``"*"``: any).
    allowed_origins: frozenset[str] = frozenset()
    #: Hosts whose http(s) media URLs may be fetched (``media/``); none:
    #: only ``data:`` URLs.
    allowed_media_domains: frozenset[str] = frozenset()
    #: The names the server answers to as ``model`` (``--served-model-name``,
    #: as vLLM's): the first is the one it reports; none: the pipeline's name.
    served_model_names: tuple[str, ...] = ()
    #: Where uploaded voices are kept (``POST /v1/audio/voices``; ``omnix
    #: serve`` keeps them in ``--log-dir``'s ``voices/``); None: a temporary
    #: folder, removed when the server closes.
    voice_dir: Path | None = None
