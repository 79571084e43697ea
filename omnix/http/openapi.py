"""GET /openapi.json: an OpenAPI 3.1 description of the HTTP API as served.

Owns ``OpenApi``: the document of one server, built from the route table
(``routes.ROUTES``): each route's operation for the served pipeline (only
the generation routes it can answer: chat for a pipeline that produces
text, speech for audio, images for images; /metrics only with telemetry),
the schemas of every route's bodies (``msgspec.json.schema_components`` of
the Structs the routes name, so they cannot drift from what the server
decodes and encodes), narrowed to the pipeline by each route's ``shape``
(its model name, its stages in ``sampling_params_list``, its output
modalities, the media parts its source stage takes, the batch limit, the
cross-field rules the handlers enforce), and the API key's security
scheme.  A test runs schemathesis against the document: whatever it
accepts the server accepts, and the reverse.

Does not own any route's description (each room's ``router.py``).
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec

from omnix import __version__
from omnix.http.common import doc
from omnix.http.core.errors import ErrorBody
from omnix.http.core.route import DocContext, Route, Undescribed
from omnix.http.routes import ROUTES
from omnix.pipelines.config import PipelineConfig


class OpenApi:
    """The document for one served pipeline, built once."""

    def __init__(
        self,
        pipeline: PipelineConfig,
        *,
        max_batch: int,
        auth: bool = False,
        metrics: bool = True,
        routes: tuple[Route, ...] = ROUTES,
    ) -> None:
        self.pipeline = pipeline
        self.ctx = DocContext(pipeline=pipeline, max_batch=max_batch, metrics=metrics)
        self.auth = auth
        self.routes = routes
        self._body: bytes | None = None

    def _operations(self) -> list[tuple[Route, dict[str, Any]]]:
        out = []
        for route in self.routes:
            if isinstance(route.doc, Undescribed):
                continue
            op = route.doc(self.ctx)
            if op is not None:
                out.append((route, op))
        return out

    def describes(self, route: Route) -> bool:
        """Whether the document describes ``route`` for this pipeline."""
        return not isinstance(route.doc, Undescribed) and route.doc(self.ctx) is not None

    def published(self, path: str) -> bool:
        """Whether ``path`` is in the document: a route the table describes
        and this server's pipeline answers."""
        return any(route.path == path for route, _ in self._operations())

    def _schemas(self) -> dict[str, Any]:
        types: list[type] = []
        for route in self.routes:
            types += [t for t in route.types if t not in types]
        types.append(ErrorBody)
        _, components = msgspec.json.schema_components(
            types, ref_template="#/components/schemas/{name}"
        )
        schemas = copy.deepcopy(components)
        doc.shape_stage_params(schemas, self.pipeline)
        for route in self.routes:
            if route.shape is not None:
                route.shape(schemas, self.ctx)
        return schemas

    def document(self) -> dict[str, Any]:
        paths: dict[str, dict[str, Any]] = {}
        for route, op in self._operations():
            if self.auth:
                if route.public:
                    op["security"] = []
                else:
                    op["responses"]["401"] = doc.UNAUTHORIZED
            paths.setdefault(route.path, {})[route.method.lower()] = op
        out: dict[str, Any] = {
            "openapi": "3.1.0",
            "info": {
                "title": "omnix",
                "version": __version__,
                "description": f"OpenAI-compatible API of the omnix pipeline {self.pipeline.name!r}, "
                "plus omnix's request introspection routes. See docs/http.md.",
            },
            "paths": paths,
            "components": {"schemas": self._schemas()},
        }
        if self.auth:
            out["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            out["security"] = [{"bearer": []}]
        return out

    def body(self) -> bytes:
        if self._body is None:
            self._body = msgspec.json.encode(self.document())
        return self._body
