"""What the tool-calling tests share: the ``get_weather`` function, its
arguments bounded (a city of two, no other keys) so that a random-weight
model under structured output still closes its JSON, in chat's and the
Realtime API's shapes; and the admission a request's log holds (the
history the thinker was given)."""

from __future__ import annotations

from typing import Any

from omnix.events.types import Admitted
from omnix.http.app import HttpServer

WEATHER_FUNCTION: dict[str, Any] = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
#: As chat's ``tools`` list holds it.
CHAT_WEATHER: dict[str, Any] = {"type": "function", "function": WEATHER_FUNCTION}
#: As a Realtime session's ``tools`` list holds it.
REALTIME_WEATHER: dict[str, Any] = {"type": "function", **WEATHER_FUNCTION}


def admitted(server: HttpServer, rid: str) -> Admitted:
    """Request ``rid``'s admission in the server's log."""
    (adm,) = [e for e in server.omni.log.events_for(rid) if isinstance(e, Admitted)]
    return adm
