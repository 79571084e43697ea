"""CORS: which web pages may call the server from a browser.

Owns: the ``--allowed-origins`` list (``parse_origins``), the answer to a
browser's preflight (``OPTIONS`` with ``Access-Control-Request-Method``),
given before authentication because browsers send no credentials on a
preflight, the ``Access-Control-*`` headers of every response to an
allowed origin (streams included: they are added as the headers are
prepared), and the refusal (403 ``origin_not_allowed``) of a POST from any
other origin, so that a page cannot make a browser start or cancel work
here even with a request that needs no preflight.

A page this server served itself (the playground) is of the server's own
origin: ``Origin`` equal to ``http://`` + ``Host``.  That is admitted only
where the Host is an IP address or ``localhost``: a name could be an
attacker's, rebound by DNS to this address (DNS rebinding makes a foreign
page same-origin with the server); behind a name, ``--allowed-origins``
names it.

Closed by default: with no allowed origins no response carries CORS
headers and every preflight is refused.  Does not own authentication
(``auth.py``) nor the Content-Type rule of JSON routes (``body.py``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from aiohttp import web

from omnix.http.core.errors import ApiError, Handler

#: Methods the API's routes take.
_METHODS = "GET, POST, DELETE, OPTIONS"
#: Headers a browser may send, when its preflight names none.
_ALLOW_HEADERS = "Authorization, Content-Type, X-Request-Id, Last-Event-ID, traceparent"
#: Response headers a page's script may read besides the CORS-safelisted ones.
_EXPOSE_HEADERS = "X-Request-Id, Retry-After"
_ORIGIN = re.compile(
    r"^https?://[a-z0-9.\-]+(:[0-9]{1,5})?$|^https?://\[[0-9a-f:.]+\](:[0-9]{1,5})?$"
)
_TOKEN_LIST = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~\-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~\-]+)*$")


def parse_origins(values: str | Iterable[str] | None) -> frozenset[str]:
    """``"https://a.example,http://localhost:3000"`` (or a list of them) as
    the set of allowed origins; ``*`` allows any.  Raises ``ValueError``
    naming an entry that is not an origin (``scheme://host[:port]``, no
    path)."""
    if values is None:
        return frozenset()
    items = values.split(",") if isinstance(values, str) else list(values)
    out: set[str] = set()
    for raw in items:
        origin = raw.strip().rstrip("/").lower()
        if not origin:
            continue
        if origin != "*" and not _ORIGIN.match(origin):
            raise ValueError(
                f"allowed origin {raw.strip()!r} is not an origin: give scheme://host[:port] "
                "(e.g. http://localhost:3000, no path), or * for any"
            )
        out.add(origin)
    return frozenset(out)


def _literal_host(host: str) -> bool:
    """Whether ``host`` (a Host header, port and all) names no DNS name:
    an IP address, or ``localhost``, which browsers resolve to loopback
    themselves."""
    name = host[1 : host.find("]")] if host.startswith("[") else host.split(":", 1)[0]
    if name.lower() == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def own_origin(request: web.Request) -> bool:
    """Whether the request's ``Origin`` is the server's own origin as the
    browser reached it, under a Host that DNS cannot rebind."""
    origin = request.headers.get("Origin", "")
    host = request.headers.get("Host", "")
    return (
        bool(host)
        and origin.lower() == f"{request.scheme}://{host}".lower()
        and _literal_host(host)
    )


class Cors:
    """The CORS policy of one app: ``middleware`` (preflights and refused
    origins) and ``on_prepare`` (headers of allowed responses)."""

    def __init__(self, origins: frozenset[str]) -> None:
        self.origins = origins
        self.any = "*" in origins

    def allows(self, origin: str) -> bool:
        return self.any or origin.lower() in self.origins

    def admits(self, request: web.Request) -> bool:
        """Whether the request's ``Origin`` (there is one) may start work
        here: an allowed origin, or the server's own (``own_origin``)."""
        return self.allows(request.headers["Origin"]) or own_origin(request)

    def refuse(self, origin: str) -> ApiError:
        hint = (
            "this server allows no browser origins"
            if not self.origins
            else f"it allows {', '.join(sorted(self.origins))}"
        )
        return ApiError(
            403,
            f"Origin {origin!r} may not call this server from a browser ({hint}). "
            f"Start omnix serve with --allowed-origins {origin} to allow it.",
            param="Origin",
            code="origin_not_allowed",
        )

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is None:
            return await handler(request)
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            if not self.allows(origin):
                raise self.refuse(origin)
            asked = request.headers.get("Access-Control-Request-Headers", "").strip()
            headers = {
                "Access-Control-Allow-Methods": _METHODS,
                "Access-Control-Allow-Headers": asked
                if _TOKEN_LIST.match(asked)
                else _ALLOW_HEADERS,
                "Access-Control-Max-Age": "600",
            }
            return web.Response(status=204, headers=headers)
        if request.method == "POST" and not self.admits(request):
            raise self.refuse(origin)
        return await handler(request)

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin is None or not self.allows(origin):
            return
        response.headers["Access-Control-Allow-Origin"] = "*" if self.any else origin
        response.headers["Access-Control-Expose-Headers"] = _EXPOSE_HEADERS
        if not self.any:
            response.headers.add("Vary", "Origin")
