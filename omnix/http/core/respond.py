"""Writing responses: JSON bodies, rendered ones, and streams.

Owns: ``json_response``; ``whole_response`` (a ``Rendered`` as an aiohttp
response); a streamed response's writes (``open_response``: a prepared
stream whose headers leave with its first body bytes; ``finish``: its end,
or, for a response that is not complete, the cut connection a client
cannot take for a whole one); when buffered bytes should leave
(``caught_up``: the request has nothing newer in the log yet, the tail is
about to wait) and the wait before they may (``durable``: with a
``--log-dir`` log, never send the bytes of an event a crash could take
back, so the ids a client holds stay valid across a restart).

Does not own what the bytes are (``omnix.http.render``) nor the loop that
tails the log (``live.py``).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from aiohttp import web
from multidict import CIMultiDict

from omnix.events.log import LogClosed
from omnix.front import OmniProtocol
from omnix.http.common.rendering import Head, Rendered

#: A streamed response writes at least this often (bytes) within a burst.
FLUSH_BYTES: Final = 64 * 1024
_enc = msgspec.json.Encoder()


def json_response(
    obj: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    resp = web.Response(status=status, body=_enc.encode(obj), content_type="application/json")
    if headers:
        resp.headers.update(headers)
    return resp


def _headers(head: Head) -> CIMultiDict[str]:
    return CIMultiDict(head.headers)


def whole_response(r: Rendered) -> web.Response:
    return web.Response(status=r.head.status, headers=_headers(r.head), body=r.body)


class Stream(web.StreamResponse):
    """A streamed response whose headers leave with its first body bytes
    (one send, not two), as ``web.Response``'s do."""

    _send_headers_immediately = False


async def open_response(request: web.Request, head: Head, buf: bytearray) -> web.StreamResponse:
    """The response for ``head``: a prepared stream, or (a head that is not
    streamed) the whole response, ``buf`` being its body."""
    if not head.streamed:
        return web.Response(status=head.status, headers=_headers(head), body=bytes(buf))
    resp = Stream(status=head.status, headers=_headers(head))
    await resp.prepare(request)
    return resp


async def finish(
    request: web.Request, resp: web.StreamResponse, buf: bytearray, complete: bool
) -> web.StreamResponse:
    """Write the rest of a stream and end it; a stream that is not
    ``complete`` is cut instead."""
    if not complete:
        # A raw audio stream whose request failed, or the log closed: cut
        # the connection so the client cannot take it as complete.
        if buf:
            await resp.write(bytes(buf))
        if request.transport is not None:
            request.transport.abort()
        return resp
    await resp.write_eof(bytes(buf))
    return resp


async def durable(omni: OmniProtocol, pos: int) -> None:
    """Wait until the log position ``pos`` is acknowledged (on disk for a
    ``--log-dir`` log, acked by JetStream for a replicated one): a client
    is never sent bytes of an event that a crash could take back, so the
    ids it holds stay valid across a restart."""
    log = omni.log
    if log.durable_pos <= pos:
        try:
            await log.flush()
        except LogClosed:
            pass  # closing wrote out (and acknowledged) everything it could


def caught_up(omni: OmniProtocol, rid: str, pos: int) -> bool:
    """No event of ``rid`` after ``pos`` is in the log yet: the tail is
    about to wait, so what is buffered should leave now."""
    rs = omni.state(rid)
    return rs is None or rs.last_pos <= pos
