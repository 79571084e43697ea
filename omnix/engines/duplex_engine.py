"""Moshi as a stage engine (engine kind ``moshi_duplex``): full-duplex
sessions stepped together on a thread of their own, a tick every 80 ms.

Owns: ``DuplexEngine``: a request is a session; its input pieces are the
user's audio as it streams (after an empty text piece, if any: the
admission of a request whose input streams), either 24 kHz mono float PCM (``modality ==
"audio"``, ``array`` of any length: the engine cuts it into 1920-sample
frames and encodes each with ``MimiEncodeStream``, a tail shorter than a
frame waiting for the next piece) or Mimi's codes (``modality == "codec"``,
``token_ids`` whole frames of K codes, frame after frame).  Every tick
each session with a user frame waiting steps by one frame in one batched
``DuplexBatch.tick``: a tick goes as soon as every session has its frame
in, else ``DuplexArgs.tick_ms`` after the last one (0: as soon as any
frame is in);
a session whose next frame is not in yet is set aside (its cache kept) and
steps again when it comes.  So a session's outputs are a pure function of
its user frames (and seed), however they were paced: the engine never makes
up audio the client did not send; a protocol that wants the model to go on
talking while the client is silent sends silence, and that silence is input
like any other.

Output, per user frame: ``EngineOutput(modality="audio", array=<1920
float32 PCM samples>, token_ids=(text token, *Moshi's K codes), text=<the
text the token adds>)`` (``duplex_text.py``; "" for padding); when the
input ended and every whole frame has been stepped (a last partial frame is
dropped), a payload-free output with ``finish_reason`` "stop" ("length"
when the session reached the model's context), ``prompt_tokens`` the user
frames taken and ``output_tokens`` the frames given.  ``temperature``
samples text and audio (seeded by the request's ``seed``); unset, greedy.
A continuation (``request.resume``: the session moved to this replica, its
replica lost or the server restarted on its log) gets every user frame
again: the model steps them all from the session's start, as fast as they
come, with the first execution's seed, and gives only the frames after the
``resume.chunks`` it had delivered, so the session goes on exactly as an
undisturbed one (greedy or sampled alike).

A session's persona, the request's ``voice`` and ``instructions`` (a
PersonaPlex folder's voice prompt and a role text), is its opening frames
(``duplex_persona.py``), stepped when it joins and before its first user
frame; they are a function of the folder and those two, so a continuation
opens the same.  A persona the folder cannot give (a voice it lacks, a
role text for a folder that takes none) fails that session alone, naming
it.

Does not own: the model's maths (``duplex_model.py``), Mimi's streaming
(``mimi_stream.py``), the batch (``duplex_batch.py``), the persona's
frames (``duplex_persona.py``), the realtime protocol nor the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from omnix.engines.device import pick_device, use_own_stream
from omnix.models.paths import resolve_model
from omnix.pipelines.config import DuplexArgs
from omnix.transport.work import EngineInfo, EngineOutput, GenerateRequest, InputPiece

if TYPE_CHECKING:
    import torch

    from omnix.engines.duplex_batch import DuplexBatch
    from omnix.engines.duplex_model import DuplexModel
    from omnix.engines.duplex_persona import PersonaPrompts
    from omnix.engines.duplex_text import TextPieces, TextStream
    from omnix.engines.mimi_stream import EncodeState, MimiEncodeStream

log = logging.getLogger(__name__)

Result = EngineOutput | BaseException | None


@dataclass
class _Session:
    key: str  # its row's name in the batch: unique, while a request id may come again
    rid: str
    request: GenerateRequest
    queue: asyncio.Queue[Result]
    #: pieces the feeder took, not yet read by the engine thread
    inbox: deque[InputPiece] = field(default_factory=deque)
    done: bool = False  # the input ended
    aborted: bool = False
    # the engine thread's
    joined: bool = False
    encoder: EncodeState | None = None
    text: TextStream | None = None
    pcm: Any = None  # samples short of a whole frame
    frames: deque[torch.Tensor] = field(default_factory=deque)  # user codes [K] to step
    taken: int = 0
    given: int = 0
    #: frames a continuation steps again without giving them (delivered before)
    skip: int = 0
    finished: bool = False


class DuplexEngine:
    """``Engine`` over ``DuplexBatch``.  Built as ``DuplexEngine(args)``;
    ``model`` hands it one already built instead of loading ``args.model``."""

    KIND = "moshi_duplex"

    def __init__(self, args: DuplexArgs, model: DuplexModel | None = None) -> None:
        self.args = args
        self._prebuilt = model
        self.model: DuplexModel | None = None
        self.device = "cpu"
        self._batch: DuplexBatch | None = None
        self._encode: MimiEncodeStream | None = None
        self._text: TextPieces | None = None
        self._persona: PersonaPrompts | None = None
        #: live sessions by key (a retried request's new session may start
        #: before the engine thread has dropped its aborted one)
        self._sessions: dict[str, _Session] = {}
        self._started = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> EngineInfo:
        import transformers.models.moshi.modeling_moshi  # noqa: F401  (see TalkerEngine.start)

        loop = self._loop = asyncio.get_running_loop()
        if self._prebuilt is not None:
            folder, model = self.args.model, self._prebuilt
            self.device = str(model.device)
        else:
            folder = str(resolve_model(self.args.model))
            self.device = pick_device(self.args.device)
            with ThreadPoolExecutor(max_workers=1) as pool:
                model = await loop.run_in_executor(pool, self._load, folder)
        self._start_model(model, folder)
        self._thread = threading.Thread(target=self._drive, name="omnix-duplex", daemon=True)
        self._thread.start()
        return EngineInfo(
            engine=self.KIND, capacity=self.args.max_sessions, device=self.device, model=folder
        )

    def _load(self, folder: str) -> DuplexModel:
        from omnix.engines.duplex_model import DuplexModel

        return DuplexModel.load(folder, self.device, self.args.dtype)

    def _start_model(self, model: DuplexModel, folder: str) -> None:
        from omnix.engines.duplex_batch import DuplexBatch
        from omnix.engines.duplex_persona import PersonaPrompts
        from omnix.engines.duplex_text import TextPieces
        from omnix.engines.mimi_stream import MimiEncodeStream

        self.model = model
        self._batch = DuplexBatch(model)
        self._persona = PersonaPrompts(folder, model)
        self._encode = MimiEncodeStream(model.mimi, model.layout.num_codebooks)
        if (Path(folder) / "tokenizer.json").is_file():
            self._text = TextPieces(folder)

    # -- requests --------------------------------------------------------------

    def generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        return self._generate(request, inputs)

    async def _generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        if self.model is None:
            raise RuntimeError("DuplexEngine.generate before start() (or after close())")
        self._started += 1
        s = _Session(
            f"{request.request_id}#{self._started}", request.request_id, request, asyncio.Queue()
        )
        if request.resume is not None:
            # A continuation: every user frame comes again; the model steps
            # them all (its state is a function of them) and the frames it
            # had delivered are not given twice.
            s.skip = request.resume.chunks
        with self._lock:
            self._sessions[s.key] = s
        feeder = asyncio.create_task(self._feed(s, inputs))
        try:
            while True:
                out = await s.queue.get()
                if out is None:
                    return
                if isinstance(out, BaseException):
                    raise out
                yield out
        finally:
            s.aborted = True
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
            self._wake.set()

    async def _feed(self, s: _Session, inputs: AsyncIterator[InputPiece]) -> None:
        try:
            async for piece in inputs:
                self._check(piece)
                s.inbox.append(piece)
                self._wake.set()
        except Exception as exc:  # a bad piece fails the session, not the engine
            s.aborted = True
            s.queue.put_nowait(exc)
            self._wake.set()
            return
        s.done = True
        self._wake.set()

    def _check(self, piece: InputPiece) -> None:
        """Refuse a piece that is not user audio, naming what was wrong."""
        assert self.model is not None
        lay = self.model.layout
        if piece.modality == "audio":
            a = piece.array
            if a is None or a.ndim != 1 or not np.issubdtype(a.dtype, np.floating):
                got = "none" if a is None else f"{a.dtype} of shape {a.shape}"
                raise ValueError(
                    f"a duplex session's audio must be mono float PCM at {lay.sample_rate} Hz "
                    f"(a 1-D float array); got {got}"
                )
        elif piece.modality == "codec":
            ids = piece.token_ids
            if len(ids) % lay.num_codebooks or any(not 0 <= c < lay.audio_vocab for c in ids):
                raise ValueError(
                    f"a duplex session's codes must be whole frames of {lay.num_codebooks} "
                    f"Mimi codes in [0, {lay.audio_vocab}); got {len(ids)} codes"
                )
        elif piece.modality == "text" and not (piece.text or piece.messages or piece.media):
            pass  # the session's opening piece (its admission): its persona is in its params
        else:
            what = "a text piece with a prompt" if piece.modality == "text" else "a piece"
            raise ValueError(
                f"a duplex session takes user audio (modality 'audio' or 'codec'); "
                f"got {what} of modality {piece.modality!r} (a persona is the stage's "
                "voice and instructions)"
            )

    async def abort(self, request_id: str) -> None:
        with self._lock:
            live = [s for s in self._sessions.values() if s.rid == request_id]
        for s in live:
            if not s.aborted:
                s.aborted = True
                s.queue.put_nowait(None)
        self._wake.set()

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, thread.join)
        self.model = None

    # -- the tick loop (its own thread) ------------------------------------------

    def _drive(self) -> None:
        """Ticks while a session has a frame to step: at once when every
        session in the batch has its frame in (there is no one to wait
        for), else ``tick_ms`` after the last tick, for those that have;
        sleeps until a feeder wakes it otherwise.  A frame that comes while
        it waits for the tick steps in that tick: the wait ends at every
        piece that comes, and what came is taken before the tick."""
        use_own_stream(self.device, urgent=True)
        period = self.args.tick_ms / 1000
        next_at = 0.0
        while not self._closing:
            self._wake.clear()
            try:
                ready, results = self._prepare()
                if results:
                    self._deliver(results)
                if not ready:
                    self._wake.wait()
                    continue
                now = time.monotonic()
                if now < next_at and not self._replaying() and not self._all_in():
                    self._wake.wait(next_at - now)
                    continue  # take what came meanwhile
                next_at = now + period
                results = self._tick()
            except Exception as exc:
                log.exception("duplex tick failed; failing its %d sessions", len(self._sessions))
                results = self._fail_all(exc)
            if results:
                self._deliver(results)

    def _all_in(self) -> bool:
        """Every session in the batch has a frame to step: a tick need wait
        for no one (a lone session's frame steps as it comes, and sessions
        whose frames come together step as the last of them comes)."""
        with self._lock:
            return all(s.frames for s in self._sessions.values() if s.joined and not s.finished)

    def _replaying(self) -> bool:
        """A continuation is stepping frames it had delivered: tick at once
        (the others step only when their frames come, so no session is
        hurried: the engine makes up no audio)."""
        with self._lock:
            return any(s.skip and s.frames for s in self._sessions.values() if s.joined)

    def _deliver(self, results: list[tuple[_Session, Result]]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(_deliver, results)

    def _prepare(self) -> tuple[bool, list[tuple[_Session, Result]]]:
        """Drop what ended, encode what came, join who can; whether any
        session has a frame to step."""
        assert self._batch is not None and self.model is not None
        out: list[tuple[_Session, Result]] = []
        with self._lock:
            sessions = list(self._sessions.values())
        # What ended first, so that its slot is free for a session waiting
        # in this same pass.
        for s in sessions:
            if s.aborted:
                self._forget(s)
                continue
            self._take_inbox(s)
            if not s.joined:
                continue
            if s.frames and self._batch.session(s.key).length >= self.model.layout.context:
                out += self._finish(s, "length")
            elif not s.frames and s.done and not s.inbox:
                out += self._finish(s, "stop")
        ready = False
        for s in sessions:
            if s.finished:
                continue
            if not s.joined and len(self._batch.sessions) < self.args.max_sessions:
                failed = self._join(s)
                if failed:
                    out += failed
                    continue
                self._wake.set()  # one that joined with its input already over ends next pass
            ready = ready or (s.joined and bool(s.frames))
        return ready, out

    def _take_inbox(self, s: _Session) -> None:
        import torch

        assert self._encode is not None and self.model is not None
        k = self.model.layout.num_codebooks
        frame = self._encode.frame_samples
        while s.inbox:
            piece = s.inbox.popleft()
            if piece.modality == "text":
                continue  # an empty opening piece (``_check``)
            if piece.modality == "codec":
                codes = torch.tensor(piece.token_ids, dtype=torch.long).reshape(-1, k)
                s.frames.extend(codes)
                continue
            assert piece.array is not None
            pcm = torch.from_numpy(np.asarray(piece.array, dtype=np.float32))
            if s.pcm is not None:
                pcm = torch.cat([s.pcm, pcm])
            whole = pcm.shape[0] // frame * frame
            s.pcm = pcm[whole:] if whole < pcm.shape[0] else None
            if whole:
                if s.encoder is None:
                    s.encoder = self._encode.start()
                s.frames.extend(self._encode.encode(s.encoder, pcm[:whole]).T.cpu())

    def _join(self, s: _Session) -> list[tuple[_Session, Result]]:
        """Start ``s`` in the batch, its persona's frames first (nothing:
        joined); a persona the folder cannot give fails ``s`` alone."""
        from omnix.engines.duplex_model import Sampling

        assert self._batch is not None and self._persona is not None
        params = s.request.params
        t = params.temperature or 0.0
        resume = s.request.resume
        seed = resume.seed if resume is not None else s.request.seed
        try:
            prompt = self._persona.prompt(params.voice or "", params.instructions or "")
            self._batch.join(
                s.key,
                prompt=prompt,
                sampling=Sampling(text_temperature=t, audio_temperature=t, seed=seed),
            )
        except (ValueError, OSError) as exc:
            self._forget(s)
            return [(s, exc)]
        s.joined = True
        if self._text is not None:
            s.text = self._text.stream()
        return []

    def _tick(self) -> list[tuple[_Session, Result]]:
        """One batched step of every session with a frame in; the others
        set aside until theirs comes."""
        assert self._batch is not None
        with self._lock:
            joined = [s for s in self._sessions.values() if s.joined and not s.finished]
        user = {}
        for s in joined:
            if s.frames:
                user[s.key] = s.frames.popleft()
            else:
                self._batch.set_aside(s.key)
        ticks = self._batch.tick(user)
        out: list[tuple[_Session, Result]] = []
        for s in joined:
            tick = ticks.get(s.key)
            if tick is None:
                continue
            s.taken += 1
            s.given += 1
            text = "" if s.text is None else s.text.text(tick.frame.text)
            if s.skip:
                s.skip -= 1
                continue
            pcm = None if tick.pcm is None else tick.pcm.numpy().astype(np.float32)
            out.append(
                (
                    s,
                    EngineOutput(
                        modality="audio",
                        text=text,
                        array=pcm,
                        token_ids=(tick.frame.text, *tick.frame.codes),
                    ),
                )
            )
        return out

    def _finish(self, s: _Session, reason: str) -> list[tuple[_Session, Result]]:
        self._forget(s)
        final = EngineOutput(
            modality="audio", finish_reason=reason, prompt_tokens=s.taken, output_tokens=s.given
        )
        return [(s, final), (s, None)]

    def _forget(self, s: _Session) -> None:
        assert self._batch is not None
        s.finished = True
        if s.joined:
            self._batch.leave(s.key)
            s.joined = False
        with self._lock:
            self._sessions.pop(s.key, None)

    def _fail_all(self, exc: BaseException) -> list[tuple[_Session, Result]]:
        """Every session ended with ``exc`` and the batch emptied (what a
        failed tick left there is not to be trusted)."""
        from omnix.engines.duplex_batch import DuplexBatch

        assert self.model is not None
        with self._lock:
            failed = list(self._sessions.values())
            self._sessions.clear()
        for s in failed:
            s.finished = True
        self._batch = DuplexBatch(self.model)
        return [(s, exc) for s in failed]


def _deliver(results: list[tuple[_Session, Result]]) -> None:
    for s, out in results:
        s.queue.put_nowait(out)
