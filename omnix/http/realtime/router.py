"""``GET /v1/realtime``: the OpenAI Realtime API over a WebSocket; its table row.

Owns the handler: the checks an upgrade passes before any session exists
(the model named in ``?model=``, 404 otherwise; then the admission every
WebSocket passes, ``omnix.http.core.websocket``: a browser's ``Origin``,
403, a serving server, 503, a WebSocket handshake, 426; the Bearer key is
the app's middleware's, as on every route),
the session a reconnecting client names (``?session_id=``, taken up again
from the log: 404 when the log holds no such session, 409 while another
socket holds it; ``?last_event_id=``: the last event it had of a response
in flight), then the upgrade and the session's loop (``connection.py``).
Its row says why the OpenAPI document leaves it out: it is a WebSocket.

A server whose audio stage is a full-duplex model serves full-duplex
sockets here instead (``duplex/route.py``: ``?duplex=1``, or bare).

Does not own the session (``session.py``) nor the messages
(``protocol.py``).
"""

from __future__ import annotations

import weakref

from aiohttp import web

from omnix.http.core.errors import ApiError
from omnix.http.core.route import Route, Undescribed
from omnix.http.core.server import Server
from omnix.http.core.websocket import check_admission, upgrade
from omnix.http.realtime.connection import MAX_MESSAGE_BYTES, Connection
from omnix.http.realtime.duplex.route import duplex, is_duplex
from omnix.http.realtime.record import restore
from omnix.http.realtime.session import Resumed

#: The sessions a socket holds now, per server.
_OPEN: weakref.WeakKeyDictionary[Server, set[str]] = weakref.WeakKeyDictionary()


def _resumed(server: Server, sid: str) -> Resumed:
    if sid in _OPEN.get(server, ()):
        raise ApiError(
            409,
            f"session {sid!r} is open on another socket; close it first.",
            param="session_id",
            code="session_in_use",
        )
    folded = restore(server.omni, sid)
    if folded is None:
        raise ApiError(
            404,
            f"no session {sid!r} in this server's log (it never opened here, or retention let "
            "it go); open a new session without session_id.",
            param="session_id",
            code="session_not_found",
        )
    return Resumed(sid, folded)


async def realtime(server: Server, request: web.Request) -> web.StreamResponse:
    if is_duplex(server, request):
        return await duplex(server, request)
    server.served.check_model(request.query.get("model", ""))
    check_admission(server, request)
    sid = request.query.get("session_id", "")
    resumed = _resumed(server, sid) if sid else None
    ws = await upgrade(
        request, max_msg_size=MAX_MESSAGE_BYTES, how="the openai SDK's client.realtime.connect does"
    )
    conn = Connection(server, ws, resumed, request.query.get("last_event_id", ""))
    held = _OPEN.setdefault(server, set())
    held.add(conn.session.id)
    try:
        await conn.run()
    finally:
        held.discard(conn.session.id)
    return ws


REALTIME = Route(
    "GET",
    "/v1/realtime",
    realtime,
    Undescribed("a WebSocket (the OpenAI Realtime API); OpenAPI describes no WebSockets"),
)
