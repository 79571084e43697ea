"""Admitting a WebSocket: the checks every WebSocket route passes before it upgrades.

Owns ``check_admission`` (a browser's ``Origin`` under the HTTP routes'
CORS policy, the server's own page included, 403 ``origin_not_allowed`` otherwise; a serving server that
accepts work, 503 otherwise) and ``upgrade`` (the socket, or 426
``websocket_required`` with ``Upgrade: websocket`` for a request that is
not a WebSocket handshake), in that order, and ``accept``, both at once.
``/v1/realtime`` and ``/v1/audio/speech/stream`` admit through here; the
Bearer key is the app's middleware's, as on every route (a browser, which
cannot set a WebSocket's headers, sends it as a subprotocol: ``auth.py``).  Does not own a
route's own checks (the model it names, a session it resumes, an output
the pipeline must make) nor what runs on the socket.
"""

from __future__ import annotations

from aiohttp import web

from omnix.http.core.cors import Cors
from omnix.http.core.errors import ApiError
from omnix.http.core.server import Server

#: The subprotocol a browser names beside its key (``auth.KEY_SUBPROTOCOL``),
#: as OpenAI's Realtime API takes it: a browser that offers subprotocols
#: fails the handshake unless the server picks one.
SUBPROTOCOL = "realtime"
#: Seconds between the server's pings; a peer that misses one is gone.
HEARTBEAT_S = 30.0


def check_admission(server: Server, request: web.Request) -> None:
    """Refuses a browser origin the server does not allow (403), then a
    server that is not serving or not accepting (503)."""
    origin = request.headers.get("Origin")
    if origin is not None:
        cors = Cors(server.options.allowed_origins)
        if not cors.admits(request):
            raise cors.refuse(origin)
    if server.phase != "serving" or not server.omni.accepting:
        raise server.not_accepting()


async def upgrade(
    request: web.Request, *, max_msg_size: int, how: str = "", writer_limit: int = 2**18
) -> web.WebSocketResponse:
    """The prepared socket; 426 ``websocket_required`` (``how``: which client does
    the handshake) when the request is no WebSocket handshake.  ``writer_limit``:
    the bytes written before a send waits for the peer (aiohttp's default)."""
    ws = web.WebSocketResponse(
        max_msg_size=max_msg_size,
        autoping=True,
        heartbeat=HEARTBEAT_S,
        protocols=(SUBPROTOCOL,),
        writer_limit=writer_limit,
    )
    if not ws.can_prepare(request).ok:
        raise ApiError(
            426,
            f"{request.method} {request.path} is a WebSocket: send an Upgrade request"
            f"{f' ({how})' if how else ''}.",
            code="websocket_required",
            headers={"Upgrade": "websocket", "Connection": "Upgrade"},
        )
    await ws.prepare(request)
    return ws


async def accept(
    server: Server, request: web.Request, *, max_msg_size: int, how: str = ""
) -> web.WebSocketResponse:
    """``check_admission``, then ``upgrade``."""
    check_admission(server, request)
    return await upgrade(request, max_msg_size=max_msg_size, how=how)
