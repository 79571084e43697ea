"""The full-duplex sessions one Moshi steps together, tick by tick.

Owns: ``DuplexBatch``: which sessions are in the batch (``join`` runs a
session's first positions and adds its KV cache as a row; ``leave`` drops
the row; ``set_aside`` takes a session's row out with its cache, for the
ticks it has no user frame, and ``tick`` brings it back when it has one), ``tick`` (every session's user frame in, every session's Moshi
frame and its 80 ms of PCM out, Mimi decoding each session's stream on:
``step`` then ``decode``, which a benchmark times apart)
and ``silence`` (Mimi's codes of 80 ms of silence, what transformers'
generate feeds as the user's audio after its prompt).  Synchronous and
single-threaded: one tick is one batched step of ``DuplexModel``.

Does not own: the model's maths (``duplex_model.py``), Mimi's streaming
(``mimi_stream.py``), pacing ticks at 12.5 a second, what a session hears
when its client sent nothing this tick, the realtime protocol or the log
(later: a stage engine over this batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omnix.engines.duplex_model import DuplexModel, Frame, Prompt, Sampling, Session
from omnix.engines.mimi_stream import DecodeState, MimiStream

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Tick:
    """One session's output of a tick: Moshi's frame and its waveform."""

    frame: Frame
    pcm: torch.Tensor | None  # [frame_samples] float PCM; None when not decoding


@dataclass
class _Member:
    session: Session
    stream: DecodeState | None
    aside: tuple[Any, int] | None = None  # its own KV cache and length while set aside


class DuplexBatch:
    """Sessions stepped together by one ``DuplexModel`` (rows in join order)."""

    def __init__(self, model: DuplexModel, decode: bool = True) -> None:
        self.model = model
        self.caches = model.new_cache()
        self._members: dict[str, _Member] = {}
        self._mimi = MimiStream(model.mimi) if decode else None
        self._silence: torch.Tensor | None = None

    @property
    def sessions(self) -> list[str]:
        return list(self._members)

    def session(self, sid: str) -> Session:
        return self._member(sid).session

    def join(
        self, sid: str, prompt: Prompt | None = None, sampling: Sampling | None = None
    ) -> None:
        """Start session ``sid`` (its initial frame and ``prompt``) and add
        it to the batch: it steps from the next tick on."""
        if sid in self._members:
            raise ValueError(f"session {sid!r} is already in the batch")
        cache, session = self.model.start(prompt, sampling)
        self.caches.add(cache, session.length)
        stream = self._mimi.start() if self._mimi is not None else None
        self._members[sid] = _Member(session, stream)

    def leave(self, sid: str) -> None:
        member = self._member(sid)
        if member.aside is None:
            self.caches.keep([i for i, name in enumerate(self._stepping) if name != sid])
        del self._members[sid]

    def set_aside(self, sid: str) -> None:
        """Take ``sid``'s row out of the batch, its KV cache kept: the ticks
        that follow step the others; the next tick given its user frame
        brings it back (as the last row).  Its state is as it was: a session
        set aside for a while continues as if it had not been."""
        member = self._member(sid)
        if member.aside is None:
            member.aside = self.caches.take(self._stepping.index(sid))

    @property
    def _stepping(self) -> list[str]:
        """The sessions with a row, in row order."""
        return [sid for sid, m in self._members.items() if m.aside is None]

    def silence(self) -> torch.Tensor:
        """Mimi's first K codes of 80 ms of silence ([K])."""
        if self._silence is None:
            import torch

            lay = self.model.layout
            zeros = torch.zeros(1, 1, lay.frame_samples, device=self.model.device)
            with torch.inference_mode():
                codes = self.model.mimi.encode(zeros, num_quantizers=lay.num_codebooks)[0]
            self._silence = codes[0, :, 0].cpu()
        return self._silence

    def tick(
        self, user: Mapping[str, torch.Tensor], forced: Mapping[str, Frame] | None = None
    ) -> dict[str, Tick]:
        """One step of every session: ``user[sid]`` its user frame ([K]
        codes); ``forced[sid]``, if any, the frame it says instead of its
        own.  Returns each session's tick.  A session set aside steps when
        ``user`` has its frame (it is brought back first); one not set aside
        must have a frame."""
        return self.decode(self.step(user, forced))

    def step(
        self, user: Mapping[str, torch.Tensor], forced: Mapping[str, Frame] | None = None
    ) -> dict[str, Frame]:
        """A tick's model step alone (``tick`` is ``decode(step(...))``):
        each stepping session's Moshi frame."""
        import torch

        missing = [sid for sid, m in self._members.items() if m.aside is None and sid not in user]
        unknown = [sid for sid in user if sid not in self._members]
        if missing or unknown:
            raise ValueError(
                f"a tick needs one user frame per session in the batch (or the session set "
                f"aside first): missing {missing}, not in the batch {unknown}"
            )
        for sid in user:
            member = self._members[sid]
            if member.aside is not None:
                self.caches.add(*member.aside)
                member.aside = None
                self._members[sid] = self._members.pop(sid)  # its row is now the last
        if not user:
            return {}
        forced = forced or {}
        sids = self._stepping
        frames = self.model.step(
            self.caches,
            [self._members[sid].session for sid in sids],
            torch.stack([user[sid].reshape(-1) for sid in sids]),
            [forced.get(sid) for sid in sids],
        )
        return dict(zip(sids, frames, strict=True))

    def decode(self, frames: Mapping[str, Frame]) -> dict[str, Tick]:
        """A tick's Mimi decode alone: each session's frame to its 80 ms of
        PCM on the host (by its own stream; none when not decoding)."""
        import torch

        out = {}
        for sid, frame in frames.items():
            stream = self._members[sid].stream
            pcm = None
            if self._mimi is not None and stream is not None:
                codes = torch.tensor(frame.codes, dtype=torch.long)[:, None]
                pcm = self._mimi.decode(stream, codes).cpu()
            out[sid] = Tick(frame, pcm)
        return out

    def _member(self, sid: str) -> _Member:
        try:
            return self._members[sid]
        except KeyError:
            raise KeyError(f"session {sid!r} is not in the batch") from None
