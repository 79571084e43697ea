"""The route table: every route of the HTTP API, one row each.

``app.build_app`` registers these rows on the aiohttp app and
``openapi.OpenApi`` describes them, so a route cannot be served without
its description (or a stated reason it has none: ``Undescribed``) nor
described without being served.  Each row is its room's (``chat``,
``completions``, ``audio``, ``images``, ``videos``, ``models``,
``requests``, ``files``, ``admin``, ``realtime``, ``playground``): adding a route is a module in a room and a row
here.  The order is the document's.
"""

from __future__ import annotations

from typing import Final

from omnix.http.admin import engines, replicas
from omnix.http.admin import router as admin
from omnix.http.audio import router as audio
from omnix.http.audio import speech_batch, speech_stream, voices
from omnix.http.chat import router as chat
from omnix.http.completions import router as completions
from omnix.http.core.route import Route
from omnix.http.files import router as files
from omnix.http.images import router as images
from omnix.http.models import router as models
from omnix.http.playground import router as playground
from omnix.http.realtime import router as realtime
from omnix.http.requests import listing
from omnix.http.requests import router as requests
from omnix.http.videos import router as videos

ROUTES: Final[tuple[Route, ...]] = (
    chat.CHAT,
    completions.COMPLETIONS,
    audio.SPEECH,
    speech_batch.SPEECH_BATCH,
    speech_stream.SPEECH_STREAM,
    audio.TRANSCRIPTIONS,
    voices.VOICES,
    voices.UPLOAD,
    voices.DELETE,
    realtime.REALTIME,
    images.IMAGES,
    images.EDITS,
    videos.CREATE,
    videos.LIST,
    videos.RETRIEVE,
    videos.DELETE,
    videos.CONTENT,
    files.FILE,
    models.MODELS,
    models.TOKENIZE,
    models.DETOKENIZE,
    admin.VERSION,
    admin.HEALTH,
    admin.READY,
    engines.ENGINES,
    replicas.REPLICAS,
    admin.METRICS,
    admin.START_PROFILE,
    admin.STOP_PROFILE,
    listing.LIST,
    requests.STATE,
    requests.EVENTS,
    requests.FIGURES,
    requests.STREAM,
    requests.CANCEL,
    requests.TRACE,
    requests.TRACE_HTML,
    admin.OPENAPI,
    playground.ROOT,
    playground.PAGE,
    *playground.ASSETS,
)
