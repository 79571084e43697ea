"""One full-duplex session: the request it is, and what outlives a socket.

Owns ``DuplexSession``: its id (the request's, ``duplex-<hex>``), its
configuration, its admission (``open``: one request whose input streams,
``DuplexOptions`` naming its response and item; a server with no free
session slot answers ``resource_exhausted``, for a duplex stage queues no
session), the client's audio going in (``append``: cut into 80 ms frames,
each appended to the log as the request's next input piece, at most
``INPUT_AHEAD_FRAMES`` ahead of the frames the model has answered: past
that the append is refused with ``input_backpressure`` and the audio
dropped, so the engine's per-session input never grows without bound),
its end (``end_input``: the last piece; the model answers what came), the
socket it is attached to (one at a time: a newer one replaces it), and
what happens when no socket is: the request goes on, and is cancelled
(``disconnect``) when no client came back within ``DETACH_GRACE_S`` (a
session a restarted server took over with nobody attached ends at its
deadline, ``SESSION_DEADLINE_S``).

The sessions a server knows are in ``sessions(server)``; one this process
never saw (a server restarted on its log) is taken up again from the log
(``DuplexSession.restore``).

Does not own the socket or the events sent (``connection.py``,
``render.py``) nor the messages (``protocol.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import weakref
from typing import Final, Protocol

import numpy as np

from omnix.events.options import API_REALTIME_DUPLEX, DuplexOptions
from omnix.events.types import Admitted, InputAppended, RequestSpec, StageParams
from omnix.http.common.plan import Plan
from omnix.http.core.errors import ApiError
from omnix.http.core.server import Server
from omnix.http.core.submit import admit
from omnix.http.realtime.duplex.audio import Framer
from omnix.http.realtime.duplex.config import SAMPLE_RATE, DuplexConfig
from omnix.http.realtime.duplex.protocol import DuplexError

log = logging.getLogger("omnix.http.realtime")

#: Frames a session's client may send ahead of the model's answers (2 s).
INPUT_AHEAD_FRAMES: Final = 25
#: Seconds a session whose socket went (without ``session.close``) waits
#: for its client to come back (``session.resume``) before it is cancelled.
DETACH_GRACE_S: Final = 30.0
#: A session's deadline (its request's): past it the session is cancelled
#: whatever its client does, so one no client comes back to after a
#: restart (nothing here then waits for it) ends too.  The model's context
#: (Moshi's: 3,000 frames, 4 minutes) ends it sooner when it keeps talking.
SESSION_DEADLINE_S: Final = 600


class Socket(Protocol):
    """What holds a session: a socket (``connection.DuplexConnection``)."""

    def replaced(self, session: DuplexSession) -> None:
        """Another socket took the session over."""


_SESSIONS: weakref.WeakKeyDictionary[Server, dict[str, DuplexSession]] = weakref.WeakKeyDictionary()


def sessions(server: Server) -> dict[str, DuplexSession]:
    """The duplex sessions this server process knows, by id."""
    return _SESSIONS.setdefault(server, {})


def duplex_stage(server: Server) -> str:
    """The stage whose chunks are a duplex session's frames ("" none)."""
    from omnix.pipelines.config import DuplexArgs

    pipeline = server.served.pipeline
    stage = pipeline.outputs.get("audio", "")
    for st in pipeline.stages:
        if st.name == stage and isinstance(st.engine, DuplexArgs):
            return stage
    return ""


def resume_token(sid: str) -> str:
    """What vLLM-Omni's clients hand back to resume: derived from the
    session id, which is the credential (128 random bits, as a realtime
    session's ``?session_id=``)."""
    return "rt_" + hashlib.blake2b(sid.encode(), digest_size=12).hexdigest()


class DuplexSession:
    """One session (see the module's docstring)."""

    def __init__(self, server: Server, sid: str, config: DuplexConfig, stage: str) -> None:
        self.server = server
        self.id = sid
        self.config = config
        self.stage = stage
        self.opts: DuplexOptions | None = None
        self.framer = Framer()
        #: frames appended to the log
        self.appended = 0
        #: the client said ``session.close``: the input ended
        self.closing = False
        self.conn: Socket | None = None
        #: sockets attached so far (vLLM-Omni's ``attachment_generation``)
        self.generation = 0
        self.played_ms = 0
        self.committed_ms = 0
        self._grace: asyncio.TimerHandle | None = None

    @classmethod
    def new(cls, server: Server, config: DuplexConfig, stage: str) -> DuplexSession:
        s = cls(server, "duplex-" + secrets.token_hex(16), config, stage)
        sessions(server)[s.id] = s
        return s

    @classmethod
    def restore(cls, server: Server, sid: str) -> DuplexSession | None:
        """The session ``sid`` as this process knows it, or as the log
        holds it (a server restarted on its log); None when it is no
        duplex session of this server's."""
        known = sessions(server).get(sid)
        if known is not None:
            return known
        omni = server.omni
        rs = omni.state(sid)
        if rs is None:
            return None
        first = omni.log.get(rs.admitted_pos)
        if not isinstance(first, Admitted) or not isinstance(first.spec.response, DuplexOptions):
            return None
        opts = first.spec.response
        params = first.spec.stage_params.get(opts.audio_stage)
        config = DuplexConfig(
            model=first.spec.model or server.served.model,
            input_format=opts.input_format,
            output_format=opts.output_format,
            voice=opts.voice,
            instructions=opts.instructions,
            temperature=params.temperature if params is not None else None,
        )
        s = cls(server, sid, config, opts.audio_stage)
        s.opts = opts
        s.appended = sum(
            1 for e in omni.log.events_for(sid) if type(e) is InputAppended and e.blob is not None
        )
        s.closing = not rs.input_open
        sessions(server)[sid] = s
        return s

    @property
    def token(self) -> str:
        return resume_token(self.id)

    @property
    def admitted(self) -> bool:
        return self.opts is not None

    @property
    def ended(self) -> bool:
        rs = self.server.omni.state(self.id)
        return rs is not None and rs.terminal

    # -- admission ------------------------------------------------------------
    async def open(self) -> None:
        """Admit the session's request (``DuplexError`` when refused)."""
        if self.opts is not None:
            return
        server = self.server
        cfg = self.config
        opts = DuplexOptions(
            response="resp_" + self.id.removeprefix("duplex-"),
            item="item_" + self.id.removeprefix("duplex-"),
            audio_stage=self.stage,
            sample_rate=SAMPLE_RATE,
            input_format=cfg.input_format,
            output_format=cfg.output_format,
            voice=cfg.voice,
            instructions=cfg.instructions,
        )
        params = {}
        if cfg.temperature is not None or cfg.voice or cfg.instructions:
            # The persona goes to the engine as the stage's voice and
            # instructions: in the log, so a continuation opens the same.
            params[self.stage] = StageParams(
                temperature=cfg.temperature,
                voice=cfg.voice or None,
                instructions=cfg.instructions or None,
            )
        spec = RequestSpec(
            outputs=("audio",),
            stage_params=params,
            seed=server.served.new_seed(),
            deadline_ms=SESSION_DEADLINE_S * 1000,
            api=API_REALTIME_DUPLEX,
            model=cfg.model,
            response=opts,
            input_streams=True,
        )
        try:
            rejected = await admit(server, Plan(specs=((self.id, spec),)))
        except ApiError as err:
            raise DuplexError(
                "server_unavailable" if err.status >= 500 else (err.code or "bad_event"),
                err.message,
                err.param,
            ) from None
        if rejected:
            raise DuplexError(
                "resource_exhausted",
                f"every duplex session slot of this server is taken ({rejected[0].reason}); "
                "try again when a session ends.",
            )
        self.opts = opts

    # -- input -----------------------------------------------------------------
    def answered(self) -> int:
        """Frames the model has answered (its chunks in the log)."""
        rs = self.server.omni.state(self.id)
        st = rs.stage(self.stage) if rs is not None else None
        return st.chunks if st is not None else 0

    def append(self, pcm: np.ndarray) -> int:
        """The client's samples: whole frames into the log, at most
        ``INPUT_AHEAD_FRAMES`` ahead of the model's answers.  Returns the
        frames appended."""
        if self.closing:
            raise DuplexError(
                "session_closed", "the session is closing (session.close): it takes no more audio."
            )
        ahead = self.appended - self.answered()
        frames = self.framer.frames_after(pcm.shape[0])
        if ahead + frames > INPUT_AHEAD_FRAMES:
            raise DuplexError(
                "input_backpressure",
                f"the model is {ahead * 80} ms behind the audio sent and this append would put "
                f"it {(ahead + frames) * 80} ms behind (at most {INPUT_AHEAD_FRAMES * 80}); "
                "its audio was dropped. Send audio in real time, 80 ms a frame.",
                "audio",
            )
        n = 0
        for frame in self.framer.push(pcm):
            if not self.server.omni.append_input(self.id, audio=frame):
                raise DuplexError("session_closed", "the session ended: it takes no more audio.")
            self.appended += 1
            n += 1
        return n

    def end_input(self) -> None:
        """``session.close``: no more audio (a partial frame is dropped);
        the model answers the frames that came, then the request ends."""
        if self.closing:
            return
        self.closing = True
        self.framer.clear()
        if self.opts is not None:
            self.server.omni.append_input(self.id, last=True)

    # -- sockets -------------------------------------------------------------------
    def attach(self, conn: Socket) -> Socket | None:
        """``conn`` holds the session from now on; the one it replaces."""
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        old, self.conn = self.conn, conn
        self.generation += 1
        return old if old is not conn else None

    def detach(self, conn: Socket) -> None:
        """``conn`` went: unless another holds the session, it waits
        ``DETACH_GRACE_S`` for its client, then is cancelled."""
        if self.conn is not conn:
            return
        self.conn = None
        if self.opts is None or self.ended:
            sessions(self.server).pop(self.id, None)
            return
        loop = asyncio.get_running_loop()
        self._grace = loop.call_later(DETACH_GRACE_S, self._gone)

    def _gone(self) -> None:
        self._grace = None
        if self.conn is None:
            log.info("duplex session %s: no client came back; cancelled", self.id)
            self.server.omni.cancel(self.id, "disconnect")
            sessions(self.server).pop(self.id, None)
