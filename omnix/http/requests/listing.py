"""``GET /v1/requests``: the requests this server holds, with their state.

Owns the route: its body (``RequestList``: the folded states, most
recently admitted first, as ``GET /v1/requests/{id}`` answers each), its
query (``status``: one of the request statuses, or ``in_flight`` /
``ended`` for either kind; ``limit``: 1 to ``MAX_LIMIT``, ``DEFAULT_LIMIT``
when not given; anything else is 400), its handler, its OpenAPI operation
and its row (``LIST``).  What the server holds is what retention keeps:
requests released are not listed.
"""

from __future__ import annotations

import heapq
from typing import Any, Final, Literal, get_args

import msgspec
from aiohttp import web

from omnix.events.state import TERMINAL_STATUSES, RequestState, RequestStatus
from omnix.http.common import doc
from omnix.http.core.errors import ApiError, ErrorBody
from omnix.http.core.route import DocContext, Route
from omnix.http.core.server import Server
from omnix.http.requests.views import as_object

DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 1000
#: ``status`` values: a request status, or every in-flight or ended one.
STATUSES: Final = (*get_args(RequestStatus), "in_flight", "ended")


class RequestList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    #: each as ``GET /v1/requests/{id}`` answers it, most recent first
    data: list[dict[str, Any]]
    #: more requests matched than ``limit``
    has_more: bool


def _wanted(status: str) -> frozenset[str]:
    if status == "in_flight":
        return frozenset(get_args(RequestStatus)) - TERMINAL_STATUSES
    if status == "ended":
        return TERMINAL_STATUSES
    return frozenset({status})


def _query(request: web.Request) -> tuple[frozenset[str] | None, int]:
    status = request.query.get("status")
    if status is not None and status not in STATUSES:
        raise ApiError(
            400,
            f"status {status[:64]!r} is not a request status: give one of "
            f"{', '.join(STATUSES)}, or omit it for every request.",
            param="status",
            code="invalid_value",
        )
    raw = request.query.get("limit", str(DEFAULT_LIMIT))
    if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_LIMIT):
        raise ApiError(
            400,
            f"limit {raw[:64]!r} is not a number from 1 to {MAX_LIMIT}.",
            param="limit",
            code="invalid_value",
        )
    return (None if status is None else _wanted(status)), int(raw)


async def list_requests(server: Server, request: web.Request) -> web.Response:
    wanted, limit = _query(request)
    held = server.omni.log.state.requests.values()
    matched = [rs for rs in held if wanted is None or rs.status in wanted]
    newest: list[RequestState] = heapq.nlargest(
        limit, matched, key=lambda rs: (rs.admitted_pos, rs.request_id)
    )
    body = RequestList(data=[as_object(rs) for rs in newest], has_more=len(matched) > limit)
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def _operation(ctx: DocContext) -> dict[str, Any]:
    return doc.get(
        "The requests this server holds, with their state, most recent first",
        doc.json_body(RequestList, "Each request's state, as GET /v1/requests/{id} gives it"),
        params=[
            {"name": "status", "in": "query", "schema": {"enum": list(STATUSES)}},
            {
                "name": "limit",
                "in": "query",
                "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
            },
        ],
        errors={"400": doc.json_body(ErrorBody, "A status or limit this route does not take")},
    )


LIST = Route("GET", "/v1/requests", list_requests, _operation, types=(RequestList,))
