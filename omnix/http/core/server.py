"""The state every handler of one app shares.

Owns ``Server``: the ``Omni`` it serves and its ``HttpOptions``, what the
planners know of the pipeline (``served``), the prompt tokenizer
(``tokens``, loading while the workers load), the media decoder, the
telemetry behind /metrics, the readers of streamed responses, the
uploaded voices and the decoding of reference audio (``cloning``), the phase
(``starting`` until the runtime is ready, ``serving``, ``stopping``) and
the 503 a request gets outside ``serving``; and ``Document``, what the
OpenAPI document built from the route table answers (``app.py`` builds
it: the table sits above every route, this module below them).

Does not own any route (each room's ``router.py``) nor the app's
lifecycle (``app.py``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal, Protocol

from aiohttp import web

from omnix.api import new_request_id, new_seed
from omnix.front import OmniProtocol
from omnix.http.audio.cloning import Cloning
from omnix.http.common.plan import PlanContext
from omnix.http.common.rendering import RETRY_AFTER
from omnix.http.common.tokens import PromptTokens
from omnix.http.core.errors import ApiError, Handler
from omnix.http.core.readers import Readers
from omnix.http.media.decoder import MediaDecoder
from omnix.http.options import HttpOptions
from omnix.telemetry import Telemetry, metrics_handler

Phase = Literal["starting", "serving", "stopping"]


class Document(Protocol):
    """The OpenAPI document of one server (``omnix.http.openapi.OpenApi``)."""

    def published(self, path: str) -> bool: ...

    def body(self) -> bytes: ...


class Server:
    """What the handlers of one app share."""

    def __init__(
        self,
        omni: OmniProtocol,
        options: HttpOptions | None = None,
        *,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.omni = omni
        self.options = options = options or HttpOptions()
        self.telemetry = telemetry
        if telemetry is not None and omni.retention is not None:
            telemetry.follow_retention(omni.retention)
        self.metrics: Handler | None = None if telemetry is None else metrics_handler(telemetry)
        self.served = PlanContext(
            omni.pipeline,
            names=options.served_model_names,
            new_request_id=new_request_id,
            new_seed=new_seed,
        )
        self.tokens = PromptTokens(omni.pipeline, self.engine_settings)
        self.media = MediaDecoder(
            omni.pipeline.input_media,
            allowed_domains=options.allowed_media_domains,
            pipeline=omni.pipeline.name,
        )
        self.readers = Readers(omni, options.resume_grace_s)
        #: uploaded voices and reference audio (Qwen3-TTS Base)
        self.cloning = Cloning(self.served, options.voice_dir, options.allowed_media_domains)
        self.started_at = int(time.time())
        self.phase: Phase = "starting"
        #: The OpenAPI document (``app.build_app`` sets it).
        self.openapi: Document | None = None
        self._tokenizer_load: asyncio.Task[object] | None = None

    def engine_settings(self, stage: str) -> list[dict[str, object]]:
        """What the ready replicas of ``stage`` report of their engine's configuration."""
        return [info.settings for name, _, info in self.omni.engines() if name == stage]

    def not_accepting(self) -> ApiError:
        """The 503 of a request outside the ``serving`` phase."""
        if self.phase == "starting":
            return ApiError(
                503,
                "The server is still loading its pipeline; retry shortly (GET /ready says when).",
                code="not_ready",
                headers={"Retry-After": RETRY_AFTER["not_ready"]},
            )
        return ApiError(
            503,
            "The server is shutting down and admits no new requests; retry on another server.",
            code="shutting_down",
            headers={"Retry-After": RETRY_AFTER["shutting_down"]},
        )

    def unavailable(self, why: str) -> ApiError:
        """The 503 of a pipeline that cannot take requests for a while (its
        replicated log is unreachable, a failover is under way)."""
        return ApiError(
            503,
            f"{why}. Nothing was submitted; retry shortly.",
            code="unavailable",
            headers={"Retry-After": RETRY_AFTER["unavailable"]},
        )

    async def load_tokenizer(self, app: web.Application) -> None:
        """Load the prompt tokenizer while the workers load (seconds of
        imports), not in the first request."""
        self._tokenizer_load = asyncio.create_task(self.tokens.tokenizer(), name="omnix-tokenizer")

    def close(self) -> None:
        """Forget pending grace timers and stop the media decoders (the
        server is closing)."""
        self.readers.close()
        self.media.close()
        self.cloning.close()
        if self._tokenizer_load is not None:
            self._tokenizer_load.cancel()
