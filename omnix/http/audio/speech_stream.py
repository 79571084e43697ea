"""``GET /v1/audio/speech/stream``: text in as it is written, speech out sentence by sentence.

Owns the WebSocket route in vLLM-Omni's message shape, so a client
written for vLLM-Omni's ``/v1/audio/speech/stream`` works unchanged.  A
connection carries utterances, one after another.  The client sends
``session.config`` first (``voice``, ``response_format`` ``"pcm"``,
``model``, ``speed``, ``instructions``, ``seed``, ``sampling_params_list``,
and on Qwen3-TTS ``language``, ``task_type``, ``ref_audio``, ``ref_text``:
the fields of ``POST /v1/audio/speech`` but ``input``; and vLLM-Omni's
``stream_audio`` and ``split_granularity`` ``"sentence"``), checked as it
comes and sticky: it may be sent again between utterances, and then
replaces the last.  Then ``input.text`` pieces (``text``) as a language
model writes them; ``input.done`` ends the utterance (its last words
spoken without a sentence end) and is answered by ``session.done``
(``utterance_index``, ``total_sentences``) once the utterance's audio is
all sent, the connection staying open for the next; ``session.close``
ends an utterance still open the same way, then closes the socket.

An utterance is one request: each sentence, once complete
(``SentenceSplitter``), is spoken at once: the first is admitted as the
request's prompt (``RequestSpec.input_streams``), each later one goes
into the running request as its next input piece (``Omni.append_input``:
an ``InputAppended`` in the log, which the orchestrator routes to the
source stage as it routes a stage's chunks to the next), the end as an
empty last piece.  Its messages are the request's rendering
(``stream_render.SentenceStream``), sent in utterance order: the next
utterance's request may already run, its messages wait for the previous
utterance's ``session.done``.  Bad input is an ``error`` message and the
socket stays open.  A client that goes away cancels what still runs.

Does not own the messages' bytes (``stream_render.py``), the speech
request's checks (``speech.py``'s ``speech_plan``, reused whole) nor the
admission every WebSocket passes (``omnix.http.core.websocket``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

import msgspec
from aiohttp import WSMsgType, web

from omnix.events.options import SpeechOptions
from omnix.http.audio.cloning import Reference
from omnix.http.audio.protocol import SpeechRequest
from omnix.http.audio.speech import speech_plan
from omnix.http.audio.stream_render import Message, SentenceStream, message
from omnix.http.common.plan import Plan
from omnix.http.core.errors import ApiError, from_decode_error
from omnix.http.core.respond import caught_up, durable
from omnix.http.core.route import Route, Undescribed
from omnix.http.core.server import Server
from omnix.http.core.submit import admit
from omnix.http.core.websocket import check_admission, upgrade
from omnix.pipelines.validate import SENTENCE_ENDS

log = logging.getLogger("omnix.http.audio")

#: The largest message read (bytes); a text piece is small.
MAX_MESSAGE_BYTES: Final = 1 << 20
#: Sentence ends that need no space after them (CJK full-width marks).
_CJK_ENDS: Final = ("\u3002", "\uff01", "\uff1f", "\uff1b")  # full stop, !, ?, ;


class StreamConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``session.config``: ``POST /v1/audio/speech``'s fields but ``input``, and
    vLLM-Omni's ``stream_audio`` (pcm is streamed as it is decoded either
    way: a client joins the binary messages of a sentence) and
    ``split_granularity`` (``"sentence"``, the only one)."""

    type: str = "session.config"
    model: str = ""
    voice: str = "default"
    response_format: str = "pcm"
    speed: float = 1.0
    instructions: str | None = None
    seed: int | None = None
    sampling_params_list: Any = None
    language: str | None = None
    task_type: str | None = None
    ref_audio: str | None = None
    ref_text: str | None = None
    stream_audio: bool = True
    split_granularity: str = "sentence"


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


def _body(cfg: StreamConfig, first: str) -> SpeechRequest:
    """The speech body of an utterance whose first sentence is ``first``."""
    if cfg.response_format != "pcm":
        raise ApiError(
            400,
            f"response_format {cfg.response_format!r}: this route streams raw pcm16 (send "
            '"pcm"); POST /v1/audio/speech encodes other formats.',
            param="response_format",
            code="unsupported_value",
        )
    if cfg.split_granularity != "sentence":
        raise ApiError(
            400,
            f"split_granularity {cfg.split_granularity!r}: this route speaks sentence by "
            'sentence (send "sentence", or leave it out).',
            param="split_granularity",
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
                "language": cfg.language,
                "task_type": cfg.task_type,
                "ref_audio": cfg.ref_audio,
                "ref_text": cfg.ref_text,
            },
            SpeechRequest,
        )
    except msgspec.ValidationError as exc:
        raise from_decode_error(exc) from None
    return body


def _plan(server: Server, body: SpeechRequest, reference: Reference | None) -> Plan:
    """The request of an utterance (``body``: ``_body``'s; ``reference``: the
    clip a Base checkpoint clones from, ``Cloning.reference``'s)."""
    plan = speech_plan(body, server.served, reference=reference)
    ((rid, spec),) = plan.specs
    opts = spec.response
    assert isinstance(opts, SpeechOptions)
    response = msgspec.structs.replace(opts, stream=False, stream_format="websocket")
    spec = msgspec.structs.replace(spec, input_streams=True, response=response)
    return Plan(specs=((rid, spec),), stream=True, blobs=plan.blobs)


class Utterance:
    """One ``input.done`` cycle of a connection: its config, its sentences'
    splitter, its request once the first sentence is complete, and the task
    that sends its messages (after the previous utterance's)."""

    def __init__(
        self,
        index: int,
        config: StreamConfig,
        reference: Reference | None,
        after: Utterance | None,
    ) -> None:
        self.index = index
        self.config = config
        self.reference = reference
        self.splitter = SentenceSplitter()
        self.rid = ""
        self.after = after
        #: whether any text came (the utterance is open)
        self.text = False
        #: the client ended it (input.done or session.close)
        self.ended = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


class SpeechSession:
    """One socket's session (see the module's docstring)."""

    def __init__(self, server: Server, ws: web.WebSocketResponse) -> None:
        self.server = server
        self.ws = ws
        self.config: StreamConfig | None = None
        #: the clip the config clones from (a Qwen3-TTS Base checkpoint)
        self.reference: Reference | None = None
        #: the utterance the client is writing (None between utterances)
        self.open: Utterance | None = None
        #: the utterance whose messages are sent last
        self.last: Utterance | None = None
        self.count = 0  # utterances begun
        self.ended = 0  # utterances the client ended
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
            u = self.last
            while u is not None and u.task is None:  # an utterance begun and never ended
                u = u.after
            if closed and u is not None and u.task is not None:
                await u.task  # the last utterance's messages are out, and so all before
        finally:
            self._cancel()

    def _cancel(self) -> None:
        """Cancels what still runs (the client went, or the server stops)."""
        u = self.last
        while u is not None:
            if u.task is not None and not u.task.done():
                if u.rid:
                    self.server.omni.cancel(u.rid, "disconnect")
                u.task.cancel()
            u = u.after

    async def on_text(self, text: str) -> bool:
        """Handle one message; True once the session closes."""
        try:
            obj = msgspec.json.decode(text)
        except msgspec.DecodeError:
            raise ApiError(400, "the message is not valid JSON.", code="invalid_json") from None
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind == "session.config":
            await self.configure(obj)
            return False
        if self.config is None:
            raise ApiError(400, "send session.config first.", code="config_required")
        if kind == "input.text":
            piece = obj.get("text")
            if not isinstance(piece, str):
                raise ApiError(400, "input.text needs its text (a string).", code="invalid_value")
            u = self._utterance()
            u.text = u.text or bool(piece)
            for sentence in u.splitter.feed(piece):
                await self.speak(u, sentence)
            return False
        if kind == "input.done":
            await self.end(self._utterance())
            return False
        if kind == "session.close":
            # An utterance still open ends as input.done would end it (and so
            # does a connection that never ended one: it hears session.done).
            if (self.open is not None and self.open.text) or not self.ended:
                await self.end(self._utterance())
            return True
        raise ApiError(
            400,
            f"unknown message type {kind!r}: send session.config, input.text, input.done or "
            "session.close.",
            code="invalid_event_type",
        )

    async def configure(self, obj: dict[str, Any]) -> None:
        """A ``session.config``: checked now, kept until the next one."""
        if self.open is not None and self.open.text:
            raise ApiError(
                400,
                f"session.config cannot change utterance {self.open.index} while it is being "
                "written: send input.done first, then the new session.config.",
                code="utterance_in_progress",
            )
        try:
            config = msgspec.convert(obj, StreamConfig)
        except msgspec.ValidationError as exc:
            raise from_decode_error(exc) from None
        body = _body(config, "-")
        reference = await self.server.cloning.reference(body)
        _plan(self.server, body, reference)  # the speech route's checks, on no text yet
        self.config, self.reference = config, reference
        if self.open is not None:  # begun by no text: it takes the new config
            self.open.config, self.open.reference = config, reference

    def _utterance(self) -> Utterance:
        if self.open is None:
            assert self.config is not None
            self.open = Utterance(self.count, self.config, self.reference, self.last)
            self.last = self.open
            self.count += 1
        return self.open

    async def speak(self, u: Utterance, sentence: str) -> None:
        """One complete sentence: the utterance's first, or its next piece."""
        server = self.server
        if u.rid:
            if not server.omni.append_input(u.rid, sentence):
                raise ApiError(
                    400,
                    f"utterance {u.index}'s speech already ended (its error said why); its "
                    "text is dropped: send input.done, then the next utterance.",
                    code="utterance_ended",
                )
            return
        plan = _plan(server, _body(u.config, sentence), u.reference)
        rejected = await admit(server, plan)
        u.rid = plan.request_ids[0]
        u.task = asyncio.create_task(self._stream(u), name=f"omnix-speech-{u.rid}")
        if rejected is not None:
            log.info("speech stream %s: refused (%s)", u.rid, rejected[0].reason)

    async def end(self, u: Utterance) -> None:
        """The client ended the utterance: its last words, then its end (which
        comes even when those words are refused: the client waits for it)."""
        self.open = None
        self.ended += 1
        try:
            rest = u.splitter.flush()
            if rest:
                await self.speak(u, rest)
        finally:
            if u.rid:
                self.server.omni.append_input(u.rid, "", last=True)
            if u.task is None:  # no sentence spoken: only its session.done
                u.task = asyncio.create_task(self._stream(u), name="omnix-speech-empty")
            u.ended.set()

    async def _stream(self, u: Utterance) -> None:
        """Sends the utterance's messages once the previous utterance's are out."""
        before = u.after
        while before is not None and before.task is None:
            before = before.after
        if before is not None and before.task is not None:
            await asyncio.wait([before.task])
        u.after = None  # its messages are out: a long connection keeps no chain of them
        omni = self.server.omni
        stream = SentenceStream(omni.blobs, u.index)
        if u.rid:
            buf: list[Message] = []
            last = -1
            async for ev in omni.events(u.rid):
                last = ev.pos
                buf += stream.feed(ev)
                if buf and caught_up(omni, u.rid, ev.pos):
                    await durable(omni, ev.pos)
                    await self.send(buf)
                    buf = []
            await durable(omni, last)
            if buf:
                await self.send(buf)
        if not stream.said_done:  # none spoken, or the speech failed: end it all the same
            await u.ended.wait()
            await self.send([stream.session_done()])


async def speech_stream(server: Server, request: web.Request) -> web.StreamResponse:
    check_admission(server, request)
    if "audio" not in server.omni.pipeline.outputs:
        raise ApiError(
            404,
            f"the pipeline {server.served.model!r} makes no audio: it has no speech stream.",
            code="unsupported_modality",
        )
    ws = await upgrade(request, max_msg_size=MAX_MESSAGE_BYTES)
    await SpeechSession(server, ws).run()
    await ws.close()
    return ws


SPEECH_STREAM = Route(
    "GET",
    "/v1/audio/speech/stream",
    speech_stream,
    Undescribed("a WebSocket (streaming text in, speech out); OpenAPI describes no WebSockets"),
)
