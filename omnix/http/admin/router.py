"""The server's own routes: liveness, readiness, version, metrics,
profiling, and the OpenAPI document.

Owns their handlers and operations: ``/health`` (the process answers; no
API key), ``/ready`` (every stage has a ready replica, 503 otherwise; no API key
either: a readiness probe carries none, and vLLM keeps its probes open),
``/version`` (as vLLM answers it), ``/metrics`` (the Prometheus exposition
of the telemetry projection; 501 without telemetry, and then not in the
document), vLLM-Omni's ``/start_profile`` and ``/stop_profile`` (404
unless the server was started with ``--profile-dir``; left out of the
document), and ``/openapi.json`` (the document ``omnix.http.openapi``
builds from the route table).
"""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web

from omnix import __version__
from omnix.api import ProfilingOff
from omnix.http.admin.protocol import (
    Health,
    ProfileRequest,
    Profiles,
    Readiness,
    Version,
    WorkerProfile,
)
from omnix.http.common import doc
from omnix.http.common.rendering import RETRY_AFTER
from omnix.http.core.body import read_body
from omnix.http.core.errors import ApiError
from omnix.http.core.respond import json_response
from omnix.http.core.route import DocContext, Route, Undescribed
from omnix.http.core.server import Server


async def health(server: Server, request: web.Request) -> web.Response:
    return json_response(Health())


async def ready(server: Server, request: web.Request) -> web.Response:
    omni = server.omni
    stages = omni.ready()
    ok = omni.accepting and all(n > 0 for n in stages.values())
    body = Readiness(ready=ok, accepting=omni.accepting, stages=omni.ready())
    return json_response(
        body, 200 if ok else 503, None if ok else {"Retry-After": RETRY_AFTER["not_ready"]}
    )


async def version(server: Server, request: web.Request) -> web.Response:
    """vLLM's ``GET /version``: ``{"version": ...}``, omnix's."""
    return json_response(Version(version=__version__))


async def metrics(server: Server, request: web.Request) -> web.StreamResponse:
    if server.metrics is None:
        raise ApiError(
            501,
            "Metrics are off in this server: it was started without telemetry.",
            code="metrics_unavailable",
        )
    return await server.metrics(request)


async def _profile(
    server: Server, request: web.Request, action: Literal["start", "stop"]
) -> web.Response:
    """The profiler of the workers of ``stages`` (every stage by default)."""
    # An empty body (curl -X POST) profiles every stage.
    body = (
        await read_body(request, ProfileRequest)
        if (await request.read()).strip()
        else ProfileRequest()
    )
    try:
        reports = await server.omni.profile(action, body.stages)
    except ProfilingOff as exc:
        raise ApiError(404, str(exc), code="profiling_off") from None
    except ValueError as exc:
        raise ApiError(400, str(exc), param="stages", code="invalid_value") from None
    workers = [
        WorkerProfile(stage=r.stage, replica=r.replica, ok=r.ok, detail=r.detail) for r in reports
    ]
    return json_response(Profiles(workers=workers), 200 if all(w.ok for w in workers) else 500)


async def start_profile(server: Server, request: web.Request) -> web.Response:
    return await _profile(server, request, "start")


async def stop_profile(server: Server, request: web.Request) -> web.Response:
    return await _profile(server, request, "stop")


async def openapi(server: Server, request: web.Request) -> web.Response:
    assert server.openapi is not None  # build_app sets it
    return web.Response(body=server.openapi.body(), content_type="application/json")


def _health_doc(ctx: DocContext) -> dict[str, Any]:
    return doc.get("Liveness: the process answers", doc.json_body(Health, "Alive"))


def _ready_doc(ctx: DocContext) -> dict[str, Any]:
    return doc.get(
        "Readiness: every stage has a ready replica",
        doc.json_body(Readiness, "Ready"),
        errors={"503": doc.json_body(Readiness, "Not ready")},
    )


def _version_doc(ctx: DocContext) -> dict[str, Any]:
    return doc.get("The server's version (as vLLM answers it)", doc.json_body(Version, "Version"))


def _metrics_doc(ctx: DocContext) -> dict[str, Any] | None:
    if not ctx.metrics:
        return None
    return doc.get(
        "Prometheus exposition of omnix's metrics",
        {"description": "Prometheus text format", "content": {"text/plain": {}}},
    )


def _openapi_doc(ctx: DocContext) -> dict[str, Any]:
    return doc.get(
        "This document", {"description": "OpenAPI 3.1", "content": {"application/json": {}}}
    )


_PROFILING = Undescribed(
    "vLLM-Omni's operational routes, outside the OpenAI API (404 without --profile-dir)"
)

HEALTH = Route("GET", "/health", health, _health_doc, public=True, types=(Health,))
READY = Route("GET", "/ready", ready, _ready_doc, public=True, types=(Readiness,))
VERSION = Route("GET", "/version", version, _version_doc, types=(Version,))
METRICS = Route("GET", "/metrics", metrics, _metrics_doc)
START_PROFILE = Route("POST", "/start_profile", start_profile, _PROFILING)
STOP_PROFILE = Route("POST", "/stop_profile", stop_profile, _PROFILING)
OPENAPI = Route("GET", "/openapi.json", openapi, _openapi_doc)
