"""``GET /v1/audio/voices``: the voices the served model speaks with.

Owns the route: its body (``VoiceList``: the talker checkpoint's speakers
in its order; ``default`` names the first), its handler, its OpenAPI
operation and its row (``VOICES``), as vLLM-Omni answers the same path.
A pipeline with no talker that names speakers (a stand-in, or no speech
at all) lists none, and then takes any ``voice`` and ignores it.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from aiohttp import web

from omnix.http.common import doc
from omnix.http.core.route import DocContext, Route
from omnix.http.core.server import Server


class VoiceList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    #: the speakers, as ``voice`` takes them (any case)
    voices: list[str]
    #: the one ``"default"`` names, or "" when there are none
    default: str


async def list_voices(server: Server, request: web.Request) -> web.Response:
    voices = list(server.served.voices())
    body = VoiceList(voices=voices, default=voices[0] if voices else "")
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def _operation(ctx: DocContext) -> dict[str, Any]:
    return doc.get(
        "The voices the served model speaks with",
        doc.json_body(VoiceList, "The talker's speakers; 'default' is the first"),
    )


VOICES = Route("GET", "/v1/audio/voices", list_voices, _operation, types=(VoiceList,))
