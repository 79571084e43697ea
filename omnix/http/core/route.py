"""A row of the route table: one route, its handler and its description.

Owns ``Route``: the method and path, the handler (an async function of
the shared ``Server`` and the request), whether it submits requests (its
body's Content-Type rule and ``X-Request-Id``: ``core.body.generation``),
whether it answers without the API key, and what the OpenAPI document
says of it: the operation for this server's pipeline (or nothing, when
the pipeline does not answer it), the Structs its bodies are (the
document's schemas), and how those schemas narrow to the pipeline; a
route served only where it is described (``described_only``).  A route
the document does not describe says why (``Undescribed``).

``omnix.http.routes`` lists the rows; ``app.py`` registers them and
``omnix.http.openapi`` describes them, so neither can drift from the
other.  Does not own any handler.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from omnix.http.core.server import Server
from omnix.pipelines.config import PipelineConfig

RouteHandler = Callable[[Server, web.Request], Awaitable[web.StreamResponse]]
#: The OpenAPI schemas of a document, by name (``#/components/schemas/NAME``).
Schemas = dict[str, Any]


@dataclass(frozen=True, slots=True)
class DocContext:
    """What a route's description depends on: the served pipeline, the
    batch limit, whether the server has telemetry (/metrics)."""

    pipeline: PipelineConfig
    max_batch: int
    metrics: bool


@dataclass(frozen=True, slots=True)
class Undescribed:
    """A route the document leaves out, and why."""

    why: str


#: The route's OpenAPI operation object for this server, None when the
#: server does not answer it (a pipeline without the output it returns).
Operation = Callable[[DocContext], dict[str, Any] | None]


@dataclass(frozen=True, slots=True)
class Route:
    method: Literal["GET", "POST", "DELETE"]
    path: str
    handle: RouteHandler
    doc: Operation | Undescribed
    #: a route that submits requests: its body is JSON (``"json"``) or a
    #: multipart form (``"form"``), and ``X-Request-Id`` names what it submits
    submits: Literal["json", "form"] | None = None
    #: answered without the API key (liveness probes carry none)
    public: bool = False
    #: the Structs of its bodies, whose schemas the document holds
    types: tuple[type, ...] = ()
    #: narrows those schemas to the pipeline (in place)
    shape: Callable[[Schemas, DocContext], None] | None = None
    #: registered only where the document describes it: elsewhere its
    #: method is not allowed on its path (405, ``Allow`` listing the
    #: methods that are), as the document says
    described_only: bool = False
