"""The playground's routes: its page and the files it loads, and ``/``.

Owns ``GET /playground`` (the page), ``GET /playground/NAME`` for each file
in ``static/`` (plain HTML, CSS and JavaScript modules, shipped in the
package: no build step, nothing fetched from elsewhere), and ``GET /``,
which redirects to the page.  They are public (the API key is not asked
for them: they hold no data; the page asks the person for the key and
sends it on every API call it makes) and sent with a Content-Security-Policy
that lets the page load and call nothing but this server.

Does not own anything the page shows: it calls the API's own routes
(``/v1/realtime``, ``/v1/requests/{id}/events``, ...), as any client.
"""

from __future__ import annotations

from importlib import resources
from typing import Final

from aiohttp import web

from omnix.http.core.route import Route, RouteHandler, Undescribed
from omnix.http.core.server import Server

#: The files of ``static/`` and their types (the page is ``index.html``).
FILES: Final = {
    "index.html": "text/html",
    "style.css": "text/css",
    "main.js": "text/javascript",
    "api.js": "text/javascript",
    "talk.js": "text/javascript",
    "forms.js": "text/javascript",
    "speech.js": "text/javascript",
    "timeline.js": "text/javascript",
    "capture.js": "text/javascript",
}
_CSP: Final = (
    "default-src 'self'; connect-src 'self'; media-src 'self' blob:; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
_WHY: Final = Undescribed("the playground: a page for people, not the API")


def _file(name: str) -> web.Response:
    body = resources.files(__package__).joinpath("static", name).read_bytes()
    return web.Response(
        body=body,
        content_type=FILES[name],
        charset="utf-8",
        headers={
            "Content-Security-Policy": _CSP,
            "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff",
        },
    )


def _serves(name: str) -> RouteHandler:
    async def handle(server: Server, request: web.Request) -> web.StreamResponse:
        return _file(name)

    return handle


async def root(server: Server, request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/playground")


PAGE = Route("GET", "/playground", _serves("index.html"), _WHY, public=True)
ROOT = Route("GET", "/", root, _WHY, public=True)
ASSETS: Final = tuple(
    Route("GET", f"/playground/{name}", _serves(name), _WHY, public=True)
    for name in FILES
    if name != "index.html"
)
