"""Reading a request: its JSON body, and the headers a generation honours.

Owns: ``read_body`` (a JSON body decoded into its route's Struct; a whole
float such as ``2.0`` read as the integer it is, as JSON Schema counts
it; msgspec's errors as 400s naming the field), the rules every route that
submits requests applies before reading its body (``generation``: a JSON
route takes ``Content-Type: application/json`` only, 415 otherwise, so a
web page cannot make a browser start a generation without a CORS
preflight; a valid ``X-Request-Id`` names what it submits), the W3C
``traceparent`` a request carries (``traceparent``) and the absolute URL
of ``GET /v1/files/`` as the client reached the server (``files_url``,
from its Host header: image and video answers by URL).

Does not own what a body means (each room's ``plan.py``).
"""

from __future__ import annotations

import functools
import re
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from omnix.http.common.plan import CLIENT_REQUEST_ID
from omnix.http.core.errors import ApiError, Handler, from_decode_error

T = TypeVar("T")

#: A client's X-Request-Id: it becomes a request id (and a URL path
#: segment of /v1/requests/{id}), batch members getting a "-i" suffix.
CLIENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$")
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def _whole_floats_to_int(obj: Any) -> Any:
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    if isinstance(obj, dict):
        return {k: _whole_floats_to_int(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_whole_floats_to_int(v) for v in obj]
    return obj


class _BodyDecoder:
    """A request body's decoder that reads a whole float (``2.0``) where an
    integer is expected as that integer: JSON Schema (so the published
    document) counts it as one, as pydantic-based servers (vLLM) do, while
    msgspec refuses it.  Only a body msgspec refused pays the second pass."""

    def __init__(self, typ: type) -> None:
        self.typ = typ
        self._decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(typ)

    def decode(self, raw: bytes) -> Any:
        try:
            return self._decoder.decode(raw)
        except msgspec.ValidationError as exc:
            if "got `float`" not in str(exc):
                raise
        return msgspec.convert(_whole_floats_to_int(msgspec.json.decode(raw)), self.typ)


_DECODERS: dict[type, _BodyDecoder] = {}


async def read_body(
    request: web.Request, typ: type[T], unsupported: dict[str, str] | None = None
) -> T:
    """The body as ``typ``: 400 when it is empty or does not decode
    (``unsupported``: fields the API knows and omnix does not take, with
    the reason), 413 past the server's body limit."""
    raw = await request.read()  # over client_max_size: aiohttp raises 413
    if not raw.strip():
        raise ApiError(400, "The request body is empty: send a JSON object.", code="invalid_json")
    decoder = _DECODERS.get(typ)
    if decoder is None:
        decoder = _DECODERS[typ] = _BodyDecoder(typ)
    try:
        body: T = decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise from_decode_error(exc, unsupported) from None
    return body


#: A Host header usable in an absolute URL: a name or IPv4 address, or a
#: bracketed IPv6 address, and an optional port.
_HOST = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?$")


def files_url(request: web.Request) -> str:
    """The absolute URL of ``GET /v1/files/`` as the client reached this
    server (its Host header), "" when the Host is not usable."""
    host = request.host
    if not host or not _HOST.match(host):
        return ""
    return f"{request.scheme}://{host}/v1/files/"


def traceparent(request: web.Request) -> str:
    """The request's W3C ``traceparent`` header if well-formed, else ""."""
    header = request.headers.get("traceparent")
    if header and _TRACEPARENT.match(header.strip().lower()):
        return header.strip().lower()
    return ""


def _json_content(request: web.Request) -> None:
    """A JSON route's body must say it is JSON: a browser sends a
    ``text/plain`` POST from any web page without a CORS preflight, and it
    must not start a generation."""
    ctype = request.content_type  # lowercased; application/octet-stream when absent
    charset = (request.charset or "utf-8").lower()
    if ctype != "application/json" or charset not in ("utf-8", "utf8"):
        got = request.headers.get("Content-Type")
        raise ApiError(
            415,
            f"{request.method} {request.path} takes a JSON body: send it with the header "
            f"Content-Type: application/json (got {got!r})."
            if got
            else f"{request.method} {request.path} takes a JSON body: send it with the header "
            "Content-Type: application/json (the request had no Content-Type).",
            param="Content-Type",
            code="unsupported_media_type",
        )


def _client_id(request: web.Request) -> str:
    """The request's valid ``X-Request-Id``, "" when none; 400 when invalid."""
    value = request.headers.get("X-Request-Id")
    if value is None:
        return ""
    if not CLIENT_ID.match(value):
        raise ApiError(
            400,
            f"X-Request-Id {value[:200]!r} is not a usable request id: give 1 to 128 characters "
            "from A-Z a-z 0-9 . _ : - starting with a letter or digit, or omit the header.",
            param="X-Request-Id",
            code="invalid_request_id",
        )
    return value


def generation(handler: Handler, *, json_body: bool = True) -> Handler:
    """``handler`` of a route that submits requests: its body must be JSON
    (``json_body``; multipart routes pass False), and the client's
    ``X-Request-Id`` names what it submits (``plan.CLIENT_REQUEST_ID``)."""

    @functools.wraps(handler)
    async def handle(request: web.Request) -> web.StreamResponse:
        if json_body:
            _json_content(request)
        rid = _client_id(request)
        # Reset after: requests of one keep-alive connection may share a task.
        token = CLIENT_REQUEST_ID.set(rid)
        try:
            return await handler(request)
        except ApiError as exc:
            if rid:  # the id is echoed on refusals too
                exc.headers.setdefault("X-Request-Id", rid)
            raise
        finally:
            CLIENT_REQUEST_ID.reset(token)

    return handle
