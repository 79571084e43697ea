"""A realtime WebSocket: messages in, server events out, bad input answered.

Owns ``Connection``: the loop over one socket's messages: each text
message parsed into its client event (``parse``: JSON, a known ``type``,
the event's fields, the size limit) and handed to the ``Session``; every
failure of one message (bad JSON, an unknown or unsupported type, a bad
field, audio that is not base64, a ``response.create`` while one runs,
anything the session refuses) answered with OpenAI's ``error`` event
naming the client event (``event_id``), the session going on as it was.
Sends are serialized (one lock), so a response's events and the session's
never interleave inside a message.  When the client goes, its running
response is cancelled (``disconnect``).  A resumed session (``Resumed``)
goes on with the requests it had in flight, from after the event the
client names.

Does not own what the events do (``session.py``) nor the route
(``router.py``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

import msgspec
from aiohttp import WSMsgType, web

from omnix.http.core.errors import ApiError, from_decode_error
from omnix.http.core.server import Server
from omnix.http.realtime.protocol import CLIENT_EVENTS, NOT_TAKEN, ClientEvent, error_event
from omnix.http.realtime.session import Resumed, Session

log = logging.getLogger("omnix.http.realtime")

#: The largest client event omnix takes (bytes of its JSON text), as
#: OpenAI's 15 MiB for an ``input_audio_buffer.append``; larger ones are
#: answered with an ``error`` event and dropped.
MAX_EVENT_BYTES: Final = 15 * 2**20
#: The largest WebSocket message read at all: past it aiohttp closes the
#: socket (1009, message too big) rather than buffer without bound.
MAX_MESSAGE_BYTES: Final = 2 * MAX_EVENT_BYTES


class BadEvent(Exception):
    """A message that is no client event omnix takes."""

    def __init__(self, error: ApiError, event_id: str | None) -> None:
        super().__init__(error.message)
        self.error = error
        self.event_id = event_id


def parse(text: str) -> ClientEvent:
    """The client event of one text message (``BadEvent`` otherwise)."""
    if len(text) > MAX_EVENT_BYTES:
        raise BadEvent(
            ApiError(
                400,
                f"the event is {len(text)} bytes; this server takes at most {MAX_EVENT_BYTES} "
                "per event. Send audio in smaller appends.",
                code="event_too_large",
            ),
            None,
        )
    try:
        obj: Any = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise BadEvent(
            ApiError(400, f"the message is not valid JSON ({exc}).", code="invalid_json"), None
        ) from None
    if not isinstance(obj, dict):
        raise BadEvent(
            ApiError(400, "a client event is a JSON object.", code="invalid_event"), None
        )
    event_id = obj.get("event_id") if isinstance(obj.get("event_id"), str) else None
    kind = obj.get("type")
    cls = CLIENT_EVENTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        why = NOT_TAKEN.get(kind) if isinstance(kind, str) else None
        message = (
            f"omnix does not take {kind!r} events: {why}."
            if why
            else f"unknown client event type {kind!r}; send one of {', '.join(CLIENT_EVENTS)}."
        )
        code = "unsupported_event" if why else "invalid_event_type"
        raise BadEvent(ApiError(400, message, param="type", code=code), event_id)
    try:
        return msgspec.convert(obj, cls)
    except msgspec.ValidationError as exc:
        raise BadEvent(from_decode_error(exc), event_id) from None


class Connection:
    """One client's socket and its session."""

    def __init__(
        self,
        server: Server,
        ws: web.WebSocketResponse,
        resumed: Resumed | None = None,
        after: str = "",
    ) -> None:
        self.ws = ws
        self._lock = asyncio.Lock()
        self.session = Session(server, self.send, self.error, resumed)
        self._after = after
        self._errors = 0

    async def send(self, frames: list[bytes]) -> None:
        async with self._lock:
            for frame in frames:
                await self.ws.send_str(frame.decode())

    async def error(self, err: ApiError, event_id: str | None) -> None:
        self._errors += 1
        frame = error_event(
            f"event_e{self._errors}",
            err.message,
            code=err.code,
            type_=err.type,
            param=err.param,
            client_event_id=event_id,
        )
        await self.send([frame])

    async def run(self) -> None:
        session = self.session
        try:
            await self.send([session.session_event("session.created")])
            session.resume(self._after)
            async for msg in self.ws:
                if msg.type == WSMsgType.TEXT:
                    await self.on_text(msg.data)
                elif msg.type == WSMsgType.BINARY:
                    await self.error(
                        ApiError(
                            400,
                            "client events are JSON text messages, not binary ones.",
                            code="invalid_event",
                        ),
                        None,
                    )
                elif msg.type == WSMsgType.ERROR:
                    log.info("realtime session %s: %s", session.id, self.ws.exception())
                    break
        except ConnectionResetError:
            pass
        finally:
            session.close()

    async def on_text(self, text: str) -> None:
        try:
            ev = parse(text)
        except BadEvent as bad:
            await self.error(bad.error, bad.event_id)
            return
        try:
            await self.session.handle(ev)
        except ApiError as err:
            await self.error(err, ev.event_id)
