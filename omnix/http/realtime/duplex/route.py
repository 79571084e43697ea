"""Whether a ``/v1/realtime`` socket is full duplex, and its handler.

Owns ``is_duplex`` (vLLM-Omni's rule: on a server whose audio stage is a
full-duplex model a bare connection is duplex, ``?duplex=1`` (``true``,
``on``) says so too, ``?duplex=0`` asks for the turn-based API, which such
a server does not serve (400); on any other server ``?duplex=1`` gets the
turn-based API, whose ``session.created`` carries no ``capabilities``) and
``duplex`` (the upgrade, then the socket's loop: ``connection.py``).

Does not own the turn-based handler (``omnix.http.realtime.router``).
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from omnix.http.core.errors import ApiError
from omnix.http.core.server import Server
from omnix.http.core.websocket import check_admission, upgrade
from omnix.http.realtime.duplex.connection import MAX_EVENT_BYTES, DuplexConnection
from omnix.http.realtime.duplex.session import duplex_stage

_YES: Final = ("1", "true", "on", "yes")
_NO: Final = ("0", "false", "off", "no")
#: What the socket's writer holds before it waits for the peer (aiohttp's
#: default is 256 KiB: seconds of audio a stalled client would hide).
WRITER_LIMIT: Final = 16 * 1024


def is_duplex(server: Server, request: web.Request) -> bool:
    asked = request.query.get("duplex", "").lower()
    if not duplex_stage(server):
        return False
    if asked in _NO:
        raise ApiError(
            400,
            "this server serves a full-duplex model: /v1/realtime is full duplex here "
            "(drop duplex=0).",
            param="duplex",
            code="unsupported_value",
        )
    return True


async def duplex(server: Server, request: web.Request) -> web.StreamResponse:
    server.served.check_model(request.query.get("model", ""))
    check_admission(server, request)
    autostart = request.query.get("autostart", "1").lower() not in _NO
    ws = await upgrade(
        request,
        max_msg_size=2 * MAX_EVENT_BYTES,
        how="vLLM-Omni's DuplexClient does",
        writer_limit=WRITER_LIMIT,
    )
    await DuplexConnection(server, ws, request).run(autostart)
    return ws
