"""API-key authentication for the HTTP API.

Owns: ``auth_middleware(api_key, public)``: with a key configured, every
route but the public ones (``/health`` and ``/ready``: liveness and
readiness probes carry no credentials; the playground's page and assets,
which hold no data; the route table says which) requires
``Authorization: Bearer KEY``, or on a WebSocket handshake the subprotocol
``openai-insecure-api-key.KEY`` (a browser's WebSocket cannot send headers:
OpenAI's Realtime API takes the key from browsers so); anything else is answered 401 with OpenAI's
error body and a ``WWW-Authenticate`` challenge.  The comparison is
constant-time.

Does not own key management (one key, given to ``omnix serve --api-key``
or ``$OMNIX_API_KEY``) nor authorization (every valid key may do
everything, including cancelling and reading any request).
"""

from __future__ import annotations

import hmac

from aiohttp import web
from aiohttp.typedefs import Middleware

from omnix.http.core.errors import ApiError, Handler

#: The prefix of the subprotocol a browser's WebSocket sends its key as.
KEY_SUBPROTOCOL = "openai-insecure-api-key."


def _given(request: web.Request) -> str:
    """The credentials sent: the Authorization header, else the key a
    WebSocket handshake names as a subprotocol, as that header would be."""
    given = request.headers.get("Authorization", "")
    if given or request.headers.get("Upgrade", "").lower() != "websocket":
        return given
    for proto in request.headers.get("Sec-WebSocket-Protocol", "").split(","):
        proto = proto.strip()
        if proto.startswith(KEY_SUBPROTOCOL):
            return "Bearer " + proto[len(KEY_SUBPROTOCOL) :]
    return ""


def auth_middleware(api_key: str, public: frozenset[str]) -> Middleware:
    """Requires ``api_key`` on every path but those in ``public``."""
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def check_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in public:
            return await handler(request)
        given = _given(request)
        if not given:
            raise ApiError(
                401,
                "Missing API key: send the header 'Authorization: Bearer YOUR_KEY' "
                "(the key this server was started with).",
                code="missing_api_key",
                headers={"WWW-Authenticate": 'Bearer realm="omnix"'},
            )
        if not hmac.compare_digest(given.encode(), expected):
            raise ApiError(
                401,
                "Incorrect API key provided. Check the key this server was started with "
                "(omnix serve --api-key).",
                code="invalid_api_key",
                headers={"WWW-Authenticate": 'Bearer realm="omnix", error="invalid_token"'},
            )
        return await handler(request)

    return check_key
