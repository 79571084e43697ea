"""``/v1/audio/speech/stream``'s messages, as a pure function of an utterance's events.

Owns ``SentenceStream``: feed it the events of one utterance's request
(one ``input.done`` cycle of a connection: ``RequestSpec.input_streams``,
its first sentence the prompt, each later one an ``InputAppended``) and
it returns the WebSocket messages they make, in vLLM-Omni's shape, each
carrying the utterance's index on its connection (``utterance_index``,
given: the log holds one utterance's request, not the connection): per
sentence ``audio.start`` (``sentence_index``, counted within the
utterance, ``sentence_text``, ``format``, ``sample_rate``, ``channels``),
its audio as binary messages of raw pcm16 as the decoder produces it, and
``audio.done`` (``total_bytes``, ``error``) once the next sentence's
audio starts or the speech ends (a stage reports no end per input piece,
so a sentence's audio is known whole only then); at the end
``session.done`` (``total_sentences``: the utterance is over, the
connection is not), or for a request that failed or was cancelled an
``error`` (``message``), after which the socket says ``session.done``
itself once the client ends the utterance (``said_done``, ``session_done``).
Text messages are ``str``, audio ``bytes``.

Which sentence an audio chunk speaks is read from the log: an input piece
is a sentence (the admission is the first, each ``InputAppended`` the
next); a stage's input piece (``Routed``) speaks the earliest sentence
among its sources.  A chunk of a stage that reads the sentences itself
speaks the sentence of the piece that produced it (``Chunk.piece``: the
engine that reads them says which); a later stage's (a decoder, whose
engine says no piece) that of the latest piece it was given, which it
decodes as it comes.  A decoder piece that joins the end of one sentence
to the start of the next is told as the first.

Does not own the socket, its utterances nor the sentences' splitting
(``speech_stream.py``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from omnix.events.blobs import BlobStore
from omnix.events.types import (
    Admitted,
    Cancelled,
    Chunk,
    Event,
    Failed,
    Finished,
    InputAppended,
    Rejected,
    Routed,
)
from omnix.http.common.audio import to_pcm16
from omnix.http.common.rendering import terminal_error
from omnix.http.common.summary import RequestSummary

Message = str | bytes

_enc = msgspec.json.Encoder()


def message(type_: str, **fields: Any) -> str:
    return _enc.encode({"type": type_, **fields}).decode()


class SentenceStream:
    """One streamed-input speech request's messages (see the module's docstring)."""

    def __init__(self, blobs: BlobStore, utterance: int = 0) -> None:
        self.s = RequestSummary(blobs, collect_media=False)
        self.utterance = utterance
        #: the request ended (its last messages were returned)
        self.done = False
        #: ... and said ``session.done`` (it finished; a failure leaves that to the socket)
        self.said_done = False
        #: the sentences' texts, in order (an empty last piece is none)
        self.sentences: list[str] = []
        self._seg: dict[int, int] = {}  # log position -> sentence
        self._routed: dict[tuple[str, int], int] = {}  # (stage, piece) -> sentence
        self._latest: dict[str, int] = {}  # stage -> its latest piece's sentence
        self._reads: set[str] = set()  # the stages that read the sentences
        self._inputs: set[int] = set()  # positions of the input pieces
        self._open = -1  # the latest sentence whose audio started
        self._active = False  # its audio.done is still to come
        self._bytes = 0

    def feed(self, ev: Event) -> list[Message]:
        if self.done:
            return []
        if type(ev) is Chunk:
            return self._chunk(ev)
        if type(ev) is Routed:
            segs = [self._seg[p] for p in ev.sources if p in self._seg]
            if segs:
                seg = self._routed.setdefault((ev.stage, ev.seq), min(segs))
                self._latest[ev.stage] = max(self._latest.get(ev.stage, 0), seg)
            if ev.sources and ev.sources[0] in self._inputs:
                self._reads.add(ev.stage)
            return []
        if type(ev) is InputAppended:
            self._inputs.add(ev.pos)
            if ev.text:
                self._seg[ev.pos] = len(self.sentences)
                self.sentences.append(ev.text)
            return []
        if type(ev) is Admitted:
            self.s.admitted(ev)
            self._inputs.add(ev.pos)
            self._seg[ev.pos] = 0
            self.sentences.append(ev.spec.prompt)
            return []
        if type(ev) is Finished:
            self.done = self.said_done = True
            return [*self._close(), self.session_done()]
        if type(ev) is Failed or type(ev) is Cancelled or type(ev) is Rejected:
            self.done = True
            err = terminal_error(ev)
            text = msgspec.json.decode(err[1])["error"]["message"] if err else ev.reason
            return [*self._close(error=True), message("error", message=text)]
        return []

    def session_done(self) -> str:
        """The utterance's end: how many sentences it had."""
        return message(
            "session.done", utterance_index=self.utterance, total_sentences=len(self.sentences)
        )

    def _chunk(self, ev: Chunk) -> list[Message]:
        s = self.s
        if ev.stage in self._reads:
            seg = self._routed.get((ev.stage, ev.piece), -1)
        else:
            seg = self._latest.get(ev.stage, -1)
        self._seg[ev.pos] = seg
        if ev.modality != "audio" or ev.stage != s.audio_stage:
            return []
        arr = s.chunk_audio(ev)
        if arr is None or arr.size == 0:
            return []
        out: list[Message] = []
        if seg > self._open:
            out += self._close()
            self._open, self._active = seg, True
            out.append(
                message(
                    "audio.start",
                    utterance_index=self.utterance,
                    sentence_index=seg,
                    sentence_text=self.sentences[seg] if seg < len(self.sentences) else "",
                    format="pcm",
                    sample_rate=s.sample_rate,
                    channels=1,
                )
            )
        pcm = to_pcm16(arr)
        self._bytes += len(pcm)
        out.append(pcm)
        return out

    def _close(self, error: bool = False) -> list[Message]:
        """The open sentence's ``audio.done``, if one is open."""
        if not self._active:
            return []
        self._active = False
        bytes_, self._bytes = self._bytes, 0
        return [
            message(
                "audio.done",
                utterance_index=self.utterance,
                sentence_index=self._open,
                total_bytes=bytes_,
                error=error,
            )
        ]
