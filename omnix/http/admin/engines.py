"""``GET /engines``: what each ready replica's engine runs with.

Owns the route: its body (``EngineList``: per ready replica, the engine
kind, its capacity, device and model folder, and ``settings``, the
engine's configuration as the engine itself resolved it: a vLLM stage's
engine arguments read back from vLLM's own config when the worker became
ready, so ``--max-model-len 256`` shows as what vLLM runs, not as what
omnix asked), its handler, its OpenAPI operation and its row (``ENGINES``).
Replicas not (or no longer) ready are not listed.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from omnix.http.common import doc
from omnix.http.core.respond import json_response
from omnix.http.core.route import DocContext, Route
from omnix.http.core.server import Server


class ReplicaEngine(msgspec.Struct, kw_only=True):
    stage: str
    replica: int
    engine: str
    capacity: int
    device: str
    model: str
    #: the engine's configuration by name (vLLM: its engine arguments)
    settings: dict[str, Any]


class EngineList(msgspec.Struct, kw_only=True):
    engines: list[ReplicaEngine]


async def list_engines(server: Server, request: web.Request) -> web.Response:
    rows = [
        ReplicaEngine(
            stage=stage,
            replica=replica,
            engine=info.engine,
            capacity=info.capacity,
            device=info.device,
            model=info.model,
            settings=dict(info.settings),
        )
        for stage, replica, info in server.omni.engines()
    ]
    return json_response(EngineList(engines=rows))


def _operation(ctx: DocContext) -> dict[str, Any]:
    return doc.get(
        "What each ready replica's engine runs with, as the engine reports it",
        doc.json_body(EngineList, "One entry per ready replica"),
    )


ENGINES = Route("GET", "/engines", list_engines, _operation, types=(EngineList,))
