"""OpenAI-style errors for the HTTP API: one exception, one body, one middleware.

Owns: ``ApiError`` (status + the fields of OpenAI's error object), the
``{"error": {"message", "type", "param", "code"}}`` body, the translation of
the errors the layers below raise (msgspec decode/validation errors,
``RequestError`` from request planning, ``ShuttingDown``) and of aiohttp's
own HTTP exceptions (404, 405, 413...) into that body, via
``error_middleware``.

Does not own which request is bad (each room's ``plan.py`` and the
pipeline's ``validate_request``, run by ``Omni.submit_group``, decide)
nor the errors of a request that was admitted and then failed: those are
part of the request's log and are rendered by ``omnix.http.render`` so
replay reproduces them.

Status conventions (documented in docs/http.md):
  * 400 ``invalid_request_error``: the request is not one this server
    takes: bad JSON, wrong types, unknown fields, out-of-range values, and
    (code ``unsupported_*``) well-formed requests its pipeline cannot serve
    (an output modality it does not produce, a parameter it does not
    honour).  One status for both, as OpenAI and vLLM answer;
  * 401 ``authentication_error``; 403 (a browser origin not allowed); 404
    ``not_found_error`` (route, request id, model); 405; 409 (a request id
    already in use); 410 ``not_found_error`` (a request retention released);
    413 (body over the size limit); 415 (a JSON route sent another
    Content-Type);
  * 429 / 503 with ``Retry-After``: admission refused (rendered from the
    recorded ``Rejected`` events) or shutting down.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web

from omnix.pipelines.plan import RequestError

log = logging.getLogger("omnix.http")

ErrorType = str  # "invalid_request_error", "authentication_error", ...

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    410: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    501: "not_implemented_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class ErrorDetail(msgspec.Struct, frozen=True):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct, frozen=True):
    error: ErrorDetail


class ApiError(Exception):
    """An error answered before (or instead of) admitting a request."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: ErrorType | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPE_BY_STATUS.get(status, "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> web.Response:
        resp = web.Response(status=self.status, body=self.body(), content_type="application/json")
        resp.headers.update(self.headers)
        return resp


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> bytes:
    return msgspec.json.encode(ErrorBody(ErrorDetail(message, type, param, code)))


def error_type(status: int) -> str:
    return _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")


# -- translations -------------------------------------------------------------

# msgspec says "Expected `int`, got `str` - at `$.messages[0].role`".
_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")


def _param_of(path: str) -> str | None:
    path = path.lstrip(".")
    return path or None


def from_decode_error(
    exc: msgspec.DecodeError, unsupported: dict[str, str] | None = None
) -> ApiError:
    """A body msgspec could not decode into the route's request Struct.
    ``unsupported`` maps top-level fields the API knows but omnix does not
    take to the reason (answered ``unsupported_parameter`` with that reason
    instead of a generic "unknown field")."""
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        m = _AT.search(text)
        param = _param_of(m.group("path")) if m else None
        what = _AT.sub("", text)
        unknown = what.startswith("Object contains unknown field")
        if unknown:
            name = _UNKNOWN.search(what)
            if name:
                param = f"{param}.{name.group(1)}" if param else name.group(1)
        if unknown and unsupported and param in unsupported:
            return ApiError(
                400,
                f"{param} is not supported: {unsupported[param]}",
                param=param,
                code="unsupported_parameter",
            )
        where = f" at `{param}`" if param else ""
        return ApiError(
            400,
            f"Invalid request body{where}: {what}."
            + (
                " Remove it: this API does not accept it."
                if unknown
                else " Fix the value and retry."
            ),
            param=param,
            code="unknown_field" if unknown else "invalid_value",
        )
    return ApiError(
        400,
        f"The request body is not valid JSON ({text}). Send a JSON object "
        "with Content-Type: application/json.",
        code="invalid_json",
    )


def from_request_error(exc: RequestError) -> ApiError:
    """``RequestError`` from the pipeline's validation: 400, its code
    saying whether the body is wrong (``invalid_value``) or the pipeline
    cannot serve it (``unsupported_*``)."""
    return ApiError(400, exc.message, param=exc.param, code=exc.code)


# -- middleware ----------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_HTTP_HINTS = {
    404: "No route {method} {path}. See GET /openapi.json for the routes this server offers.",
    405: "Method {method} is not allowed on {path} on this server; GET /openapi.json "
    "lists the routes and methods it answers.",
    413: "The request body is larger than this server accepts ({limit} bytes): send a smaller body.",
}


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer every failure with OpenAI's error body.

    ``ApiError`` is ours; ``web.HTTPException`` is aiohttp's (no route,
    wrong method, body too large) and keeps its status and headers (405's
    ``Allow``).  Anything else is a bug: logged with its traceback and
    answered 500 without internals.
    """
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        hint = _HTTP_HINTS.get(exc.status)
        limit = request.app._client_max_size if exc.status == 413 else 0
        message = (
            hint.format(method=request.method, path=request.path, limit=limit)
            if hint
            else (exc.text or exc.reason)
        )
        resp = web.Response(
            status=exc.status,
            body=error_body(
                message, error_type(exc.status), None, exc.reason.lower().replace(" ", "_")
            ),
            content_type="application/json",
        )
        for name in ("Allow", "Retry-After", "WWW-Authenticate"):
            if name in exc.headers:
                resp.headers[name] = exc.headers[name]
        return resp
    except (ConnectionResetError, TimeoutError):
        raise
    except Exception:
        if request.transport is None or request.transport.is_closing():
            raise
        log.exception("unhandled error in %s %s", request.method, request.path)
        return web.Response(
            status=500,
            body=error_body(
                "Internal server error; the server log has the details.",
                "server_error",
                None,
                "internal_error",
            ),
            content_type="application/json",
        )
