"""The aiohttp application and server around one ``Omni``.

Owns: ``build_app`` (the route table, ``routes.ROUTES``, registered on
the app, each handler bound to the shared ``core.server.Server``; the
OpenAPI document built from the same table; middlewares: OpenAI-style
errors, CORS (``core/cors.py``, closed unless origins are allowed), API
key (the table says which routes are public); the body size limit, all as
``HttpOptions`` say; the telemetry projection that backs /metrics, started
and stopped with the app) and ``HttpServer`` (bind, serve, close), the
programmatic way to serve an ``Omni`` — tests and embedders use it:

    async with Omni(pipeline) as omni, HttpServer(omni, port=0) as server:
        ...  # server.url == "http://127.0.0.1:PORT"

Does not own the runtime's lifecycle (the caller starts and shuts down
``Omni``; ``serve.py`` does both for ``omnix serve``), nor any handler
(each room's ``router.py``).

Handler cancellation is on: when a client disconnects, aiohttp cancels its
handler, which is how a dropped stream becomes ``Cancelled(disconnect)``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from omnix.front import OmniProtocol
from omnix.http.core.auth import auth_middleware
from omnix.http.core.body import generation
from omnix.http.core.cors import Cors
from omnix.http.core.errors import Handler, error_middleware
from omnix.http.core.route import Route
from omnix.http.core.server import Server
from omnix.http.openapi import OpenApi
from omnix.http.options import HttpOptions
from omnix.http.routes import ROUTES
from omnix.telemetry import Telemetry

log = logging.getLogger("omnix.http")

OMNI_KEY: web.AppKey[OmniProtocol] = web.AppKey("omni", OmniProtocol)
SERVER_KEY: web.AppKey[Server] = web.AppKey("server", Server)


def _make_telemetry(omni: OmniProtocol) -> Telemetry:
    """The telemetry behind /metrics, built from the environment."""
    # The config, not its name: audio seconds count at its codec stage's rate.
    return Telemetry.from_env(omni.pipeline)


def build_app(
    omni: OmniProtocol,
    options: HttpOptions | None = None,
    *,
    telemetry: Telemetry | bool | None = True,
) -> web.Application:
    """The application serving ``omni``, answering as ``options`` say.

    ``telemetry``: a ``Telemetry`` to expose at /metrics, ``True`` to build
    one from the environment (it follows ``omni.log`` while the app runs),
    or ``False``/``None`` for none (/metrics answers 501).
    """
    options = options or HttpOptions()
    cors = Cors(options.allowed_origins)
    # CORS before the API key: a browser's preflight carries no credentials.
    middlewares: list[Middleware] = [error_middleware, cors.middleware]
    if options.api_key:
        public = frozenset(r.path for r in ROUTES if r.public)
        middlewares.append(auth_middleware(options.api_key, public))
    app = web.Application(middlewares=middlewares, client_max_size=options.max_body)
    app.on_response_prepare.append(cors.on_prepare)
    tel = _make_telemetry(omni) if telemetry is True else (telemetry or None)
    server = Server(omni, options, telemetry=tel)
    server.openapi = openapi = OpenApi(
        omni.pipeline,
        max_batch=options.max_batch,
        auth=bool(options.api_key),
        metrics=tel is not None,
    )
    app.on_startup.append(server.load_tokenizer)
    for route in ROUTES:
        if route.described_only and not openapi.describes(route):
            continue
        add = {
            "GET": app.router.add_get,  # a GET answers HEAD too
            "POST": app.router.add_post,
            "DELETE": app.router.add_delete,
        }[route.method]
        add(route.path, _handler(server, route))
    app[OMNI_KEY] = omni
    app[SERVER_KEY] = server
    if tel is not None and telemetry is True:

        async def follow_log(app: web.Application) -> AsyncIterator[None]:
            task = asyncio.create_task(tel.run(omni.log), name="omnix-telemetry")
            yield
            await tel.aclose(task)

        app.cleanup_ctx.append(follow_log)
    return app


def _handler(server: Server, route: Route) -> Handler:
    """``route``'s handler bound to ``server``; a route that submits
    requests gets the rules of a generation (``core.body.generation``)."""
    handler: Handler = functools.partial(route.handle, server)
    if route.submits is not None:
        handler = generation(handler, json_body=route.submits == "json")
    return handler


class HttpServer:
    """Serve ``omni`` on ``host:port`` (``port=0``: any free port)."""

    def __init__(
        self,
        omni: OmniProtocol,
        options: HttpOptions | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        telemetry: Telemetry | bool | None = True,
        access_log: bool = False,
    ) -> None:
        self.omni = omni
        self.host = host
        self.port = port
        self.app = build_app(omni, options, telemetry=telemetry)
        #: what the handlers share (the OpenAPI document, stream readers...)
        self.state = self.app[SERVER_KEY]
        self._access_log = access_log
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> HttpServer:
        """Bind and serve.  Requests are answered 503 (not ready) until
        ``omni`` accepts them; call ``mark_serving`` once it is started
        (done automatically when ``omni`` is already started)."""
        kwargs: dict[str, Any] = {"handler_cancellation": True}
        if not self._access_log:
            kwargs["access_log"] = None
        runner = web.AppRunner(self.app, **kwargs)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        bound = runner.addresses  # where the site listens (the OS picks the port for 0)
        if bound:
            self.port = bound[0][1]
        if self.omni.accepting:
            self.mark_serving()
        return self

    def mark_serving(self) -> None:
        self.state.phase = "serving"

    def mark_stopping(self) -> None:
        self.state.phase = "stopping"

    async def close(self) -> None:
        """Stop serving (open connections are closed).  Shut ``omni`` down
        first to let in-flight responses end cleanly."""
        self.mark_stopping()
        self.state.close()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> HttpServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
