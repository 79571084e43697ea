"""``GET /v1/audio/speech/stream``: text in as it is written, speech out sentence by sentence.

Owns the WebSocket route in vLLM-Omni's message shape.  The client sends
``session.config`` first (``voice``, ``response_format`` ``"pcm"``,
``model``, ``speed``, ``instructions``, ``seed``, ``sampling_params_list``:
the fields of ``POST /v1/audio/speech`` but ``input``), then
``input.text`` pieces (``text``) as a language model writes them,
``input.done`` to flush a sentence left without its end, and
``session.close`` when there is no more.  Each sentence, once complete
(``SentenceSplitter``), is spoken at once: the first is admitted as the
request's prompt (``RequestSpec.input_streams``), each later one goes
into the running request as its next input piece (``Omni.append_input``:
an ``InputAppended`` in the log, which the orchestrator routes to the
source stage as it routes a stage's chunks to the next), the close as an
empty last piece.  The server's messages are the request's rendering
(``stream_render.SentenceStream``); bad input is an ``error`` message
and the socket stays open.  A client that goes away cancels the request.

Does not own the messages' bytes (``stream_render.py``) nor the speech
request's checks (``speech.py``'s ``speech_plan``, reused whole).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

import msgspec
from aiohttp import WSMsgType, web

from omnix.events.options import SpeechOptions
from omnix.http.audio.protocol import SpeechRequest
from omnix.http.audio.speech import speech_plan
from omnix.http.audio.stream_render import Message, SentenceStream, message
from omnix.http.common.plan import Plan
from omnix.http.core.cors import Cors
from omnix.http.core.errors import ApiError, from_decode_error
from omnix.http.core.respond import caught_up, durable
from omnix.http.core.route import Route, Undescribed
from omnix.http.core.server import Server
from omnix.http.core.submit import admit
from omnix.pipelines.validate import SENTENCE_ENDS

log = logging.getLogger("omnix.http.audio")

#: The largest message read (bytes); a text piece is small.
MAX_MESSAGE_BYTES: Final = 1 << 20
#: Sentence ends that need no space after them (CJK full-width marks).
_CJK_ENDS: Final = ("\u3002", "\uff01", "\uff1f", "\uff1b")  # full stop, !, ?, ;


class StreamConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``session.config``: ``POST /v1/audio/speech``'s fields but ``input``."""

    type: str = "session.config"
    model: str = ""
    voice: str = "default"
    response_format: str = "pcm"
    speed: float = 1.0
    instructions: str | None = None
    seed: int | None = None
    sampling_params_list: Any = None


class SentenceSplitter:
    """Text as it comes, out as whole sentences: one ends at ``.``, ``!``,
    ``?`` (and the like) followed by white space, or at a CJK mark."""

    def __init__(self) -> None:
        self.buf = ""

    def feed(self, text: str) -> list[str]:
        self.buf += text
        out: list[str] = []
        start = 0
        buf = self.buf
        for i, ch in enumerate(buf):
            end = ch in _CJK_ENDS or (
                ch.isspace() and i > start and buf[:i].rstrip().endswith(SENTENCE_ENDS)
            )
            if end:
                sentence = buf[start : i + 1].strip()
                if sentence:
                    out.append(sentence)
                start = i + 1
        self.buf = buf[start:]
        return out

    def flush(self) -> str:
        rest, self.buf = self.buf.strip(), ""
        return rest


def _plan(server: Server, cfg: StreamConfig, first: str) -> Plan:
    """The request of a session whose first sentence is ``first``."""
    if cfg.response_format != "pcm":
        raise ApiError(
            400,
            f"response_format {cfg.response_format!r}: this route streams raw pcm16 (send "
            '"pcm"); POST /v1/audio/speech encodes other formats.',
            param="response_format",
            code="unsupported_value",
        )
    try:
        body = msgspec.convert(
            {
                "input": first,
                "model": cfg.model,
                "voice": cfg.voice,
                "response_format": "pcm",
                "speed": cfg.speed,
                "instructions": cfg.instructions,
                "seed": cfg.seed,
                "sampling_params_list": cfg.sampling_params_list,
            },
            SpeechRequest,
        )
    except msgspec.ValidationError as exc:
        raise from_decode_error(exc) from None
    plan = speech_plan(body, server.served)
    ((rid, spec),) = plan.specs
    opts = spec.response
    assert isinstance(opts, SpeechOptions)
    response = msgspec.structs.replace(opts, stream=False, stream_format="websocket")
    spec = msgspec.structs.replace(spec, input_streams=True, response=response)
    return Plan(specs=((rid, spec),), stream=True)


class SpeechSession:
    """One socket's session (see the module's docstring)."""

    def __init__(self, server: Server, ws: web.WebSocketResponse) -> None:
        self.server = server
        self.ws = ws
        self.config: StreamConfig | None = None
        self.splitter = SentenceSplitter()
        self.rid = ""
        self.task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def send(self, messages: list[Message]) -> None:
        async with self._lock:
            for m in messages:
                if isinstance(m, bytes):
                    await self.ws.send_bytes(m)
                else:
                    await self.ws.send_str(m)

    async def run(self) -> None:
        closed = False
        try:
            async for msg in self.ws:
                if msg.type == WSMsgType.TEXT:
                    try:
                        closed = await self.on_text(msg.data)
                    except ApiError as err:
                        await self.send([message("error", message=err.message, code=err.code)])
                        continue
                    if closed:
                        break
                elif msg.type == WSMsgType.BINARY:
                    await self.send([message("error", message="send JSON text messages")])
                elif msg.type == WSMsgType.ERROR:
                    break
            if not closed:
                return  # the client went: the finally cancels what runs
            if self.task is not None:
                await self.task
            else:
                await self.send([message("session.done", total_sentences=0)])
        finally:
            if self.rid and self.task is not None and not self.task.done():
                self.server.omni.cancel(self.rid, "disconnect")
                self.task.cancel()

    async def on_text(self, text: str) -> bool:
        """Handle one message; True once the session closes."""
        try:
            obj = msgspec.json.decode(text)
        except msgspec.DecodeError:
            raise ApiError(400, "the message is not valid JSON.", code="invalid_json") from None
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind == "session.config":
            if self.config is not None:
                raise ApiError(400, "session.config comes once, first.", code="invalid_event")
            try:
                self.config = msgspec.convert(obj, StreamConfig)
            except msgspec.ValidationError as exc:
                raise from_decode_error(exc) from None
            return False
        if self.config is None:
            raise ApiError(400, "send session.config first.", code="config_required")
        if kind == "input.text":
            piece = obj.get("text")
            if not isinstance(piece, str):
                raise ApiError(400, "input.text needs its text (a string).", code="invalid_value")
            for sentence in self.splitter.feed(piece):
                await self.speak(sentence)
            return False
        if kind in ("input.done", "session.close"):
            rest = self.splitter.flush()
            if rest:
                await self.speak(rest)
            if kind == "session.close" and self.rid:
                self.server.omni.append_input(self.rid, "", last=True)
            return kind == "session.close"
        raise ApiError(
            400,
            f"unknown message type {kind!r}: send session.config, input.text, input.done or "
            "session.close.",
            code="invalid_event_type",
        )

    async def speak(self, sentence: str) -> None:
        """One complete sentence: the request's first, or its next piece."""
        server = self.server
        if self.rid:
            if not server.omni.append_input(self.rid, sentence):
                raise ApiError(
                    400, "the speech already ended; no more text is taken.", code="ended"
                )
            return
        assert self.config is not None
        plan = _plan(server, self.config, sentence)
        rejected = await admit(server, plan)
        self.rid = plan.request_ids[0]
        self.task = asyncio.create_task(self._stream(), name=f"omnix-speech-{self.rid}")
        if rejected is not None:
            log.info("speech stream %s: refused (%s)", self.rid, rejected[0].reason)

    async def _stream(self) -> None:
        omni = self.server.omni
        stream = SentenceStream(omni.blobs)
        buf: list[Message] = []
        last = -1
        async for ev in omni.events(self.rid):
            last = ev.pos
            buf += stream.feed(ev)
            if buf and caught_up(omni, self.rid, ev.pos):
                await durable(omni, ev.pos)
                await self.send(buf)
                buf = []
        await durable(omni, last)
        if buf:
            await self.send(buf)


async def speech_stream(server: Server, request: web.Request) -> web.StreamResponse:
    origin = request.headers.get("Origin")
    if origin is not None:
        cors = Cors(server.options.allowed_origins)
        if not cors.allows(origin):
            raise cors.refuse(origin)
    if "audio" not in server.omni.pipeline.outputs:
        raise ApiError(
            404,
            f"the pipeline {server.served.model!r} makes no audio: it has no speech stream.",
            code="unsupported_modality",
        )
    if server.phase != "serving" or not server.omni.accepting:
        raise server.not_accepting()
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES, heartbeat=30.0)
    if not ws.can_prepare(request).ok:
        raise ApiError(
            400,
            "GET /v1/audio/speech/stream is a WebSocket: send an Upgrade request.",
            code="websocket_required",
        )
    await ws.prepare(request)
    await SpeechSession(server, ws).run()
    await ws.close()
    return ws


SPEECH_STREAM = Route(
    "GET",
    "/v1/audio/speech/stream",
    speech_stream,
    Undescribed("a WebSocket (streaming text in, speech out); OpenAPI describes no WebSockets"),
)
