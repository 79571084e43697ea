"""``POST /admin/stages/{name}/replicas``: set a scaling stage's replica count by hand.

Owns the route: its bodies (``SetReplicas`` in: the count; ``StageReplicas``
out: the stage's count, range, ready replicas, the draining ones and the
log positions of the ``Scaled`` events the call appended), its handler,
its OpenAPI operation (for a pipeline with a stage that scales: the
stages that do, the count within their range) and its row (``REPLICAS``).  The count becomes the
same ``Scaled`` events the orchestrator's own decisions are (an input,
``reason = "admin"``: ``Omni.scale``), so replay explains it; the stage
keeps scaling by its rules from there.  Behind the API key, as every
route but ``/health``.

Answers: 404 for a stage the pipeline lacks, 409 for a stage with a fixed
count (``replicas = N``) or when replicas still draining stand in the way,
400 for a count outside the stage's ``min..max`` (or a body that is not
``{"replicas": N}``).  Does not own the decision rules
(``omnix.orchestrator.scaling``) nor carrying them out (the runtime).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from aiohttp import web
from msgspec import Meta

from omnix.http.common import doc
from omnix.http.common.fields import REQUEST
from omnix.http.core.body import read_body
from omnix.http.core.errors import ApiError, ErrorBody
from omnix.http.core.respond import json_response
from omnix.http.core.route import DocContext, Route, Schemas
from omnix.http.core.server import Server
from omnix.orchestrator.scaling import ScaleRefused, StageReplicas


class SetReplicas(msgspec.Struct, **REQUEST):
    """The count the stage should run (within its ``min..max``)."""

    replicas: Annotated[int, Meta(ge=1, le=4096)]


async def set_replicas(server: Server, request: web.Request) -> web.Response:
    name = request.match_info["name"]
    body = await read_body(request, SetReplicas)
    try:
        body_out = await server.omni.set_replicas(name, body.replicas)
    except ScaleRefused as exc:
        param = "replicas" if exc.status == 400 else None
        raise ApiError(exc.status, str(exc), param=param, code=exc.code) from None
    return json_response(body_out)


def _operation(ctx: DocContext) -> dict[str, Any] | None:
    """Described where a stage scales (the others answer 404 or 409)."""
    names = [st.name for st in ctx.pipeline.stages if st.scaling is not None]
    if not names:
        return None
    return {
        "summary": "Set a scaling stage's replica count (replicas = {min, max} in its config)",
        "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"enum": names}}],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": doc.ref(SetReplicas)}},
        },
        "responses": {
            "200": doc.json_body(StageReplicas, "The stage's replicas after the change"),
            "400": doc.json_body(ErrorBody, "Not a count, or outside the stage's min..max"),
            "404": doc.json_body(ErrorBody, "No such stage"),
            "409": doc.json_body(
                ErrorBody, "The stage has a fixed count, or replicas still draining are in the way"
            ),
            "413": doc.ERRORS["413"],
        },
    }


def _shape(schemas: Schemas, ctx: DocContext) -> None:
    """The count within the scaling stages' ranges (their union where
    several scale: a path and a body cannot be tied in OpenAPI)."""
    ranges = [st.scaling for st in ctx.pipeline.stages if st.scaling is not None]
    if ranges:
        prop = schemas["SetReplicas"]["properties"]["replicas"]
        prop["minimum"] = min(r.min for r in ranges)
        prop["maximum"] = max(r.max for r in ranges)


REPLICAS = Route(
    "POST",
    "/admin/stages/{name}/replicas",
    set_replicas,
    _operation,
    types=(SetReplicas, StageReplicas),
    shape=_shape,
)
