"""A full-duplex socket: client events in, the session's events out, bounded.

Owns ``DuplexConnection``: the loop over one socket's messages, each
parsed (``protocol.parse``) and done (``handle``), any it cannot do
answered with one ``error`` event naming it, the session going on; the
handshake (``session.update`` opens a session, ``session.resume`` takes
one up again; with ``?autostart=`` not ``0`` a session is created as the
socket opens and admitted at its first ``session.update`` or audio); the
follower (the session's request tailed from the log and rendered,
``render.DuplexStream``, each burst sent once on disk: a resumed client
gets what follows the last ``server_event_seq`` it had); and the output's
bounds.

The output is bounded both ways: the server holds at most ``OUTBOX_MS``
of a session's audio for the socket (the follower waits for room; the log
is the buffer, and the log is bounded by the model's context and by
retention), and a client that stops reading falls behind: once it is
``WARN_MS`` behind the model (frames in the log not yet taken by its
socket, beyond what it was behind when it attached) it is told
(``error``, ``output_backpressure``, ahead of the frames queued); at
``DROP_MS`` it is dropped (``session.closed`` with that reason if it can
still be written, then the socket closed, 1008), and its session waits for
it to come back as after any lost socket.  The server's send buffer for
the socket is kept small, so that its backlog is seen here rather than
hidden in the kernel.

Does not own what outlives the socket (``session.py``), the session
object (``config.py``) nor the events' bytes (``render.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from collections import deque
from typing import Any, Final

from aiohttp import WSMsgType, web

from omnix.http.core.respond import caught_up, durable
from omnix.http.core.server import Server
from omnix.http.realtime.duplex.audio import decode
from omnix.http.realtime.duplex.config import FRAME_MS, DuplexConfig, check_rate, wire_format
from omnix.http.realtime.duplex.protocol import (
    AppendEvent,
    BadEvent,
    BargeInEvent,
    ClearEvent,
    ClientEvent,
    CloseEvent,
    CommitEvent,
    DuplexError,
    EventAckEvent,
    HeartbeatEvent,
    InputCancelEvent,
    NotInDuplexEvent,
    PlaybackAckEvent,
    ResponseCancelEvent,
    ResponseCreateEvent,
    ResumeEvent,
    SessionUpdateEvent,
    TextAppendEvent,
    TurnSignalEvent,
    error_event,
    parse,
    server_event,
)
from omnix.http.realtime.duplex.render import DuplexStream, frames_through
from omnix.http.realtime.duplex.session import DuplexSession, sessions

log = logging.getLogger("omnix.http.realtime")

#: The largest client event taken (bytes of its JSON text).
MAX_EVENT_BYTES: Final = 15 * 2**20
#: Audio the server holds for one socket; the follower waits for room.
OUTBOX_MS: Final = 1000
#: How far behind the model a client may fall before it is told, and dropped.
WARN_MS: Final = 1500
DROP_MS: Final = 5000
_AUDIO_DELTA: Final = "response.output_audio.delta"
#: How often the lag is looked at.
WATCH_S: Final = 0.1
#: How long the server waits, its last events written, for the client to
#: close the socket before it closes it itself.
LINGER_S: Final = 2.0
#: The kernel's send buffer for a duplex socket (it doubles it) and the
#: transport's: together with the writer's (``route.WRITER_LIMIT``) about
#: 1.5 s of 16-bit frames, so a client that stops reading shows here soon
#: (and what it is told reaches it soon).
SEND_BUFFER_BYTES: Final = 32 * 1024
TRANSPORT_BUFFER_BYTES: Final = 16 * 1024


class DuplexConnection:
    """One client's socket (see the module's docstring)."""

    def __init__(self, server: Server, ws: web.WebSocketResponse, request: web.Request) -> None:
        self.server = server
        self.ws = ws
        self.request = request
        self.session: DuplexSession | None = None
        self._out: deque[tuple[bytes, int]] = deque()
        self._out_ms = 0
        self._room = asyncio.Event()
        self._room.set()
        self._more = asyncio.Event()
        self._drained = asyncio.Event()
        self._client_gone = asyncio.Event()
        self._sending = False
        self._n = 0
        self._tag = secrets.token_hex(2)
        self._closed = False
        self._warned = False
        #: model frames written to the socket since it attached; the
        #: session's frames then, and those of them the client had not had
        self._sent_frames = 0
        self._base = 0
        self._replay = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._follower: asyncio.Task[None] | None = None
        _small_send_buffer(request)

    # -- sending ---------------------------------------------------------------
    def event(self, type_: str, **fields: Any) -> bytes:
        """A session-level event (no ``server_event_seq``: not replayed)."""
        self._n += 1
        return server_event(type_, f"event_d{self._tag}_{self._n}", **fields)

    def send(self, *frames: bytes, first: bool = False) -> None:
        """Queue session events (``first``: ahead of everything queued)."""
        if self._closed:
            return
        if first:
            self._out.extendleft((f, 0) for f in reversed(frames))
        else:
            self._out.extend((f, 0) for f in frames)
        self._more.set()

    def error(self, err: DuplexError, client_event_id: str | None, first: bool = False) -> None:
        self._n += 1
        frame = error_event(f"event_d{self._tag}_{self._n}", err, client_event_id)
        self.send(frame, first=first)

    async def _push(self, frames: list[tuple[bytes, int]]) -> None:
        """Queue rendered frames once the socket has room for them."""
        while self._out_ms >= OUTBOX_MS and not self._closed:
            self._room.clear()
            await self._room.wait()
        if self._closed:
            return
        for frame, ms in frames:
            self._out.append((frame, ms))
            self._out_ms += ms
        self._more.set()

    async def _sender(self) -> None:
        ws = self.ws
        while not self._closed:
            if not self._out:
                self._drained.set()
                self._more.clear()
                await self._more.wait()
                continue
            frame, ms = self._out.popleft()
            self._sending = True
            try:
                await ws.send_frame(frame, WSMsgType.TEXT)
            finally:
                self._sending = False
            if ms:
                self._out_ms -= ms
                self._sent_frames += 1
                if self._out_ms < OUTBOX_MS:
                    self._room.set()

    async def _watch(self) -> None:
        """Tell a client that falls behind, then drop it."""
        while not self._closed:
            await asyncio.sleep(WATCH_S)
            s = self.session
            if s is None or not s.admitted:
                continue
            # The live frames not yet taken (a resumed client's missed
            # frames go first and are no lag).
            live = s.answered() - self._base - max(0, self._sent_frames - self._replay)
            behind = live * FRAME_MS
            if behind >= DROP_MS:
                await self._drop(behind)
                return
            if behind >= WARN_MS and not self._warned:
                self._warned = True
                self.error(
                    DuplexError(
                        "output_backpressure",
                        f"this client is {behind} ms behind the model's audio: read the socket "
                        f"as fast as the audio comes (real time); at {DROP_MS} ms behind the "
                        "socket is closed (the session waits for session.resume).",
                    ),
                    None,
                    first=True,
                )
            elif behind < WARN_MS // 2:
                self._warned = False

    async def _drop(self, behind: int) -> None:
        s = self.session
        log.info("duplex session %s: its client is %d ms behind; dropped", s and s.id, behind)
        self._closed = True
        self._room.set()
        self._out.clear()
        reason = "output_backpressure"
        closed = self.event("session.closed", session_id=s and s.id, reason=reason)
        try:
            async with asyncio.timeout(1.0):
                await self.ws.send_frame(closed, WSMsgType.TEXT)
                await self.ws.close(code=1008, message=reason.encode())
        except (TimeoutError, ConnectionResetError):
            transport = self.request.transport
            if transport is not None:
                transport.abort()

    # -- the session's frames -----------------------------------------------------
    def _follow(self, after: int) -> None:
        """Send the session's events with a ``server_event_seq`` past
        ``after`` (0: all), from the log, as they come."""
        s = self.session
        assert s is not None and s.admitted
        self._sent_frames = 0
        self._base = s.answered()
        self._replay = max(0, self._base - frames_through(after))
        if self._follower is not None:
            self._follower.cancel()
        self._follower = asyncio.create_task(self._run_follower(s, after))

    async def _run_follower(self, s: DuplexSession, after: int) -> None:
        omni = self.server.omni
        stream = DuplexStream(omni.blobs)
        buf: list[tuple[bytes, int]] = []
        last = -1
        try:
            async for ev in omni.events(s.id):
                last = ev.pos
                frames = stream.feed(ev)
                for frame, seq, kind in zip(frames, stream.seqs, stream.types, strict=True):
                    if seq > after:
                        buf.append((frame, FRAME_MS if kind == _AUDIO_DELTA else 0))
                if stream.done:
                    break
                if buf and caught_up(omni, s.id, ev.pos):
                    await durable(omni, ev.pos)
                    await self._push(buf)
                    buf = []
            await durable(omni, last)
            if buf:
                await self._push(buf)
            self._ended(s)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("duplex session %s: sending its frames failed", s.id)

    def _ended(self, s: DuplexSession) -> None:
        """The session's request ended and its last frames are queued."""
        reason = "client_close" if s.closing else "session_ended"
        rs = self.server.omni.state(s.id)
        if rs is not None and rs.status == "cancelled" and rs.cancel_reason == "shutdown":
            reason = "shutdown"
        self.send(
            self.event(
                "session.closed",
                session_id=s.id,
                epoch=0,
                reason=reason,
                event={"type": "session.closed", "reason": reason},
            )
        )
        sessions(self.server).pop(s.id, None)
        self._tasks.append(asyncio.create_task(self._close_after_sent()))

    async def _close_after_sent(self) -> None:
        """Close the socket once what is queued was written."""
        while (self._out or self._sending) and not self._closed:
            self._drained.clear()
            await self._drained.wait()
        # The client closes first where it will (on session.closed): a socket
        # closed here while its last messages (acks) are unread ends in a
        # reset, and the client's kernel drops what it had not yet read (the
        # closing events among them).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(LINGER_S):
                await self._client_gone.wait()
        self._closed = True
        await self.ws.close()

    # -- the socket's life ------------------------------------------------------------
    async def run(self, autostart: bool) -> None:
        self._tasks = [
            asyncio.create_task(self._sender(), name="omnix-duplex-send"),
            asyncio.create_task(self._watch(), name="omnix-duplex-watch"),
        ]
        try:
            if autostart:
                config = DuplexConfig(model=self.server.served.model)
                self._created(DuplexSession.new(self.server, config, _stage(self.server)))
            async for msg in self.ws:
                if msg.type == WSMsgType.TEXT:
                    await self._on_text(msg.data)
                elif msg.type == WSMsgType.BINARY:
                    self.error(
                        DuplexError("bad_event", "client events are JSON text messages."), None
                    )
                elif msg.type == WSMsgType.ERROR:
                    break
        except ConnectionResetError:
            pass
        finally:
            self._client_gone.set()
            self._closed = True
            self._room.set()
            self._more.set()
            self._drained.set()
            if self.session is not None:
                self.session.detach(self)
            for t in (*self._tasks, *([self._follower] if self._follower else [])):
                t.cancel()
            for t in self._tasks:
                with contextlib.suppress(asyncio.CancelledError, ConnectionResetError):
                    await t

    async def _on_text(self, text: str) -> None:
        try:
            ev = parse(text, MAX_EVENT_BYTES)
        except BadEvent as bad:
            self.error(bad.error, bad.event_id)
            return
        try:
            await self.handle(ev)
        except DuplexError as err:
            self.error(err, ev.event_id)

    def _created(self, s: DuplexSession) -> None:
        self.session = s
        s.attach(self)
        self.send(
            self.event(
                "session.created",
                session=s.config.shown(s.id),
                resume_token=s.token,
                attachment_generation=s.generation,
                incarnation=0,
            )
        )

    # -- what each client event does --------------------------------------------------
    async def handle(self, ev: ClientEvent) -> None:
        s = self.session
        match ev:
            case SessionUpdateEvent():
                await self._update(ev)
            case ResumeEvent():
                await self._resume(ev)
            case HeartbeatEvent():
                self.send(self.event("session.heartbeat_ack", session_id=s and s.id))
            case EventAckEvent():
                pass  # (vLLM-Omni trims its replay journal by it; here the log is it)
            case CloseEvent():
                if s is None or not s.admitted:
                    self.send(
                        self.event("session.closed", session_id=s and s.id, reason="client_close")
                    )
                    if s is not None:
                        s.closing = True
                        sessions(self.server).pop(s.id, None)
                    self._tasks.append(asyncio.create_task(self._close_after_sent()))
                    return
                s.end_input()  # the follower sends session.closed once drained
            case AppendEvent():
                s = self._session(s)
                fmt = s.config.input_format
                named = ev.format or ev.input_audio_format
                if named is not None:
                    fmt = wire_format(named, "format")
                check_rate(ev.sample_rate_hz, "sample_rate_hz")
                pcm = decode(ev.audio, fmt)
                s = await self._admitted(s)  # (a session that autostarted: now)
                s.append(pcm)
            case CommitEvent():
                s = self._session(s)
                self.send(
                    self.event(
                        "input_audio_buffer.committed",
                        previous_item_id=None,
                        item_id=None,
                        event={
                            "type": "input.committed",
                            "session_id": s.id,
                            "turn_id": 0,
                            "epoch": 0,
                            "note": "a full-duplex model listens continuously: a commit "
                            "changes nothing",
                        },
                    )
                )
            case ClearEvent() | InputCancelEvent():
                s = self._session(s)
                s.framer.clear()
                self.send(self.event("input_audio_buffer.cleared"))
            case TextAppendEvent():
                raise DuplexError(
                    "native_text_append_unsupported",
                    "this model hears audio only: send the user's words as "
                    "input_audio_buffer.append.",
                    "type",
                )
            case BargeInEvent():
                raise _no_barge_in("barge_in")
            case TurnSignalEvent():
                if ev.event == "barge_in":
                    raise _no_barge_in("turn.signal")
                if ev.event == "input.cancel":
                    await self.handle(InputCancelEvent(event_id=ev.event_id))
                    return
                raise DuplexError(
                    "unsupported_turn_signal",
                    f"turn.signal event {ev.event!r}: the model takes turns itself; this "
                    "session takes only 'input.cancel' as a signal.",
                    "event",
                )
            case PlaybackAckEvent():
                self._playback(self._session(s), ev)
            case ResponseCreateEvent():
                raise DuplexError(
                    "response_already_active",
                    "a full-duplex session is one continuous response, open while the session "
                    "is: there is none to create.",
                )
            case ResponseCancelEvent():
                raise DuplexError(
                    "response_cancel_unsupported",
                    "the response is the session's continuous stream: end it with session.close.",
                )
            case NotInDuplexEvent():
                raise DuplexError(
                    "unsupported_event",
                    f"{ev.type}: a full-duplex session has no conversation items nor output "
                    "buffer to act on.",
                    "type",
                )

    def _session(self, s: DuplexSession | None) -> DuplexSession:
        if s is None:
            raise DuplexError(
                "session_not_open",
                "no session yet: send session.update first (or session.resume).",
            )
        return s

    async def _admitted(self, s: DuplexSession | None) -> DuplexSession:
        s = self._session(s)
        if not s.admitted:
            await s.open()
            self._follow(0)
        return s

    async def _update(self, ev: SessionUpdateEvent) -> None:
        served = self.server.served
        obj = ev.session or {}
        s = self.session
        if s is None:
            config = DuplexConfig(model=served.model).update(obj, served.names, served.persona())
            s = DuplexSession.new(self.server, config, _stage(self.server))
            try:
                await s.open()  # refused: an error instead of session.created
            except DuplexError:
                sessions(self.server).pop(s.id, None)
                raise
            self._created(s)
            self._follow(0)
        else:
            config = s.config.update(obj, served.names, served.persona())
            if s.admitted:
                for field in ("output_format", "voice", "instructions", "temperature"):
                    if getattr(config, field) != getattr(s.config, field):
                        raise DuplexError(
                            "session_update_unsupported",
                            f"session {field} cannot change once the session has started "
                            "(its request is running); open a new session for another.",
                            f"session.{field}",
                        )
            s.config = config
            if not s.admitted:
                await s.open()
                self._follow(0)
        self.send(self.event("session.updated", session=s.config.shown(s.id)))

    async def _resume(self, ev: ResumeEvent) -> None:
        if self.session is not None and self.session.admitted:
            raise DuplexError(
                "session_exists",
                f"this socket holds session {self.session.id!r}; resume on a new socket.",
                "session_id",
            )
        s = DuplexSession.restore(self.server, ev.session_id)
        if s is None:
            raise DuplexError(
                "session_resume_expired",
                f"unknown duplex session {ev.session_id!r}: this server never had it, or it "
                "ended and retention let it go; open a new session (session.update).",
                "session_id",
            )
        if ev.resume_token and ev.resume_token != s.token:
            raise DuplexError(
                "invalid_resume_token",
                f"resume_token does not match session {ev.session_id!r}'s.",
                "resume_token",
            )
        if self.session is not None:
            sessions(self.server).pop(self.session.id, None)
        self.session = s
        old = s.attach(self)
        if old is not None:
            old.replaced(s)
        self.send(
            self.event(
                "session.resumed",
                session_id=s.id,
                session=s.config.shown(s.id),
                attachment_generation=s.generation,
                resume_token=s.token,
            )
        )
        self._follow(ev.last_received_server_event_seq or 0)

    def replaced(self, s: DuplexSession) -> None:
        """Another socket resumed this one's session."""
        self.session = None
        if self._follower is not None:
            self._follower.cancel()
        self.send(
            self.event("session.replaced", session_id=s.id, attachment_generation=s.generation - 1)
        )
        self._tasks.append(asyncio.create_task(self._close_after_sent()))

    def _playback(self, s: DuplexSession, ev: PlaybackAckEvent) -> None:
        opts = s.opts
        if ev.response_id and (opts is None or ev.response_id != opts.response):
            raise DuplexError(
                "playback_item_mismatch",
                f"response_id {ev.response_id!r} is not this session's response.",
                "response_id",
            )
        if ev.item_id and (opts is None or ev.item_id != opts.item):
            raise DuplexError(
                "playback_item_not_found",
                f"item_id {ev.item_id!r} is not this session's item.",
                "item_id",
            )
        sent_ms = s.answered() * FRAME_MS
        s.played_ms = max(s.played_ms, min(int(ev.played_ms), sent_ms))
        committed = ev.committed_ms if ev.committed_ms is not None else ev.played_ms
        s.committed_ms = max(s.committed_ms, min(int(committed), s.played_ms))
        playback = {
            "generated_ms": sent_ms,
            "sent_ms": sent_ms,
            "played_ms": s.played_ms,
            "committed_ms": s.committed_ms,
        }
        self.send(
            self.event(
                "playback.acknowledged",
                event={
                    "type": "playback.acknowledged",
                    "session_id": s.id,
                    "epoch": 0,
                    "item_id": opts.item if opts else None,
                    "played_ms": s.played_ms,
                    "committed_ms": s.committed_ms,
                    "truncate": ev.truncate,
                    "playback": playback,
                    "history_committed": False,
                },
            )
        )


def _no_barge_in(name: str) -> DuplexError:
    return DuplexError(
        "barge_in_unsupported",
        f"{name}: this model hears the user while it speaks and yields by itself "
        "(capabilities.supports_barge_in is false); just keep sending audio.",
        "type",
    )


def _stage(server: Server) -> str:
    from omnix.http.realtime.duplex.session import duplex_stage

    return duplex_stage(server)


def _small_send_buffer(request: web.Request) -> None:
    transport = request.transport
    if transport is None:
        return
    with contextlib.suppress(AttributeError, NotImplementedError):
        transport.set_write_buffer_limits(high=TRANSPORT_BUFFER_BYTES)
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
