"""``GET /v1/realtime``: the OpenAI Realtime API over a WebSocket; its table row.

Owns the handler: the checks an upgrade passes before any session exists
(the model named in ``?model=``, 404 otherwise; a browser's ``Origin``
under the HTTP routes' CORS policy, 403 otherwise; a serving server, 503
otherwise; the Bearer key is the app's middleware's, as on every route),
then the upgrade and the session's loop (``connection.py``).  Its row says
why the OpenAPI document leaves it out: it is a WebSocket.

Does not own the session (``session.py``) nor the messages
(``protocol.py``).
"""

from __future__ import annotations

from aiohttp import web

from omnix.http.core.cors import Cors
from omnix.http.core.errors import ApiError
from omnix.http.core.route import Route, Undescribed
from omnix.http.core.server import Server
from omnix.http.realtime.connection import MAX_MESSAGE_BYTES, Connection


async def realtime(server: Server, request: web.Request) -> web.StreamResponse:
    server.served.check_model(request.query.get("model", ""))
    origin = request.headers.get("Origin")
    if origin is not None:
        cors = Cors(server.options.allowed_origins)
        if not cors.allows(origin):
            raise cors.refuse(origin)
    if server.phase != "serving" or not server.omni.accepting:
        raise server.not_accepting()
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES, autoping=True, heartbeat=30.0)
    if not ws.can_prepare(request).ok:
        raise ApiError(
            400,
            "GET /v1/realtime is a WebSocket: send an Upgrade request (the openai SDK's "
            "client.realtime.connect does).",
            code="websocket_required",
        )
    await ws.prepare(request)
    await Connection(server, ws).run()
    return ws


REALTIME = Route(
    "GET",
    "/v1/realtime",
    realtime,
    Undescribed("a WebSocket (the OpenAI Realtime API); OpenAPI describes no WebSockets"),
)
