"""The Prometheus endpoint: an aiohttp handler for GET /metrics.

Owns: ``metrics_handler(telemetry)`` (the handler the HTTP layer mounts),
``render_metrics(telemetry)`` (content type and body, for any other server)
and ``serve_metrics`` (a standalone /metrics server, for ``omnix telemetry
--prometheus-port`` and tests).

Does not own the omnix HTTP API server or any metric (``Telemetry`` does).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from omnix.telemetry.setup import Telemetry

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def render_metrics(telemetry: Telemetry, accept: str = "") -> tuple[str, bytes]:
    """(content type, body) of the exposition; OpenMetrics if ``accept`` asks."""
    return telemetry.prometheus_text(accept)


def metrics_handler(telemetry: Telemetry) -> Handler:
    """``app.router.add_get("/metrics", metrics_handler(tel))``.

    Rendering is synchronous and runs on the event loop: it reads the
    aggregates (a few hundred series) under the metrics lock, which the
    projection holds only for one request's observations at a time.
    """

    async def handle(request: web.Request) -> web.Response:
        content_type, body = render_metrics(telemetry, request.headers.get("Accept", ""))
        resp = web.Response(body=body)
        # aiohttp refuses a charset inside content_type=; set the header whole.
        resp.headers["Content-Type"] = content_type
        return resp

    return handle


async def serve_metrics(
    telemetry: Telemetry, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, int]:
    """Start a server with only /metrics; return the runner and bound port."""
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(telemetry))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    addresses = runner.addresses  # where the site listens (the OS picks the port for 0)
    return runner, addresses[0][1] if addresses else port
