"""A vLLM stage's continuation: resuming after the chunks a lost replica delivered.

Owns: ``ResumePlan`` (which input piece a continuation resumes and with
what: the ``Resume``'s delivered outputs split by ``Resume.pieces``),
``PieceResume`` (one piece's share), ``resumed_ids`` (the delivered ids in
the model's vocabulary: codec codes shifted back) and ``ContinuedText``
(the continuation's text deltas, decoded here rather than taken from vLLM).

The rules (see also docs/engines.md, "Continuing a migrated execution"):
the pieces before the last one that delivered anything had finished and do
not run again (their seeds' places are kept); that piece's prompt is its
usual prompt followed by its own resumed ids, with the budget the
undisturbed sub-request had left; later pieces run as in any request.  A
text piece whose delivered ids end with an EOS id had finished too.  vLLM
only streams what it generates, so nothing resumed is emitted again.  A
``Resume`` without ``pieces`` (not built from the log) is taken as the
first piece's, and a second non-empty piece is then refused.

Does not own rendering the prompt (``vllm_prompt.py``) nor running the
request (``vllm_loop.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from omnix.engines.vllm_setup import VocabLayout
from omnix.transport.work import GenerateRequest, Resume


class PieceResume(msgspec.Struct, frozen=True):
    """One input piece's share of a ``Resume``: the ids and text it had
    delivered, and whether it had finished (a later piece delivered)."""

    token_ids: tuple[int, ...]
    text: str
    finished: bool


class ResumePlan:
    """Which input piece a continuation resumes, and with what: the
    ``Resume``'s delivered outputs split by ``Resume.pieces``.  Pieces
    before the last one that delivered anything had finished; the last
    one continues from its share; later pieces run as in any request.
    Without a split (``pieces == ()``) everything belongs to the first
    non-empty piece, and a second non-empty piece is refused: where the
    first one's generation ended is not known."""

    __slots__ = ("resume", "shares", "taken")

    def __init__(self, resume: Resume | None) -> None:
        self.resume = resume
        self.taken = False
        self.shares: dict[int, PieceResume] = {}
        if resume is None or not resume.pieces:
            return
        ids_at = text_at = 0
        last = len(resume.pieces) - 1
        for i, p in enumerate(resume.pieces):
            # A piece before the last had finished, even one that
            # delivered nothing: none of them runs again.
            self.shares[i] = PieceResume(
                resume.token_ids[ids_at : ids_at + p.token_ids],
                resume.text[text_at : text_at + p.text],
                finished=i < last,
            )
            ids_at += p.token_ids
            text_at += p.text
        if ids_at != len(resume.token_ids) or text_at != len(resume.text):
            raise ValueError(
                f"Resume.pieces accounts for {ids_at} token ids and {text_at} characters, "
                f"but the resume holds {len(resume.token_ids)} and {len(resume.text)}: "
                "the orchestrator built an inconsistent Resume (a bug)"
            )

    def take(self, index: int, request: GenerateRequest) -> PieceResume | None:
        """Input piece ``index``'s share (``None``: it runs as in any
        request).  Called for non-empty pieces only, in order."""
        resume = self.resume
        if resume is None:
            return None
        if resume.pieces:
            return self.shares.get(index)
        if self.taken:
            raise ValueError(
                f"request {request.request_id!r} continues a migrated execution of stage "
                f"{request.stage!r}, which has more than one input piece, and its Resume does "
                "not say how the delivered outputs split over the pieces (Resume.pieces), so "
                "the continuation cannot be exact; build the Resume from the log "
                "(omnix.orchestrator.dispatch) or feed the stage one piece"
            )
        self.taken = True
        return PieceResume(resume.token_ids, resume.text, finished=False)


def resumed_ids(
    token_ids: tuple[int, ...], codec: bool, layout: VocabLayout, folder: Path | None
) -> list[int]:
    """The resumed ids in this model's vocabulary: text ids as emitted;
    codec codes shifted back by ``codec_offset``."""
    ids = list(token_ids)
    if not codec:
        return ids
    if not all(0 <= t < layout.codec_size for t in ids):
        bad = next(t for t in ids if not 0 <= t < layout.codec_size)
        raise ValueError(
            f"resumed codec code {bad} is outside [0, {layout.codec_size}) of {folder}: "
            "the continuation must come from the same talker model"
        )
    return [t + layout.codec_offset for t in ids]


class ContinuedText:
    """The text deltas of a continuation: the decode of every output id
    (resumed and new, special tokens skipped, as vLLM's own streams
    concatenate to) past the ``resume.text`` already delivered.  A
    trailing incomplete character is held back until its last byte comes,
    and never emitted if it does not (as vLLM's detokenizer: a stream
    ending inside a character ends before it), so nothing is emitted twice
    or mangled at the cut.

    Why not vLLM's text: vLLM primes its detokenizer with the prompt, and a
    prompt ending inside a character (a cut between the byte tokens of one
    character) makes it emit the whole prompt's text as the first delta.
    Decoding all ids per delta costs O(n) a step; only continuations pay
    it."""

    __slots__ = ("ids", "sent", "tok")

    def __init__(self, tok: Any, token_ids: tuple[int, ...], text: str) -> None:
        self.tok = tok
        self.ids = list(token_ids)
        # What was delivered, not what the ids decode to: vLLM may have
        # held back text of the last ids (an unfinished character).
        self.sent = len(text)

    def _decode(self) -> str:
        return str(self.tok.decode(self.ids, skip_special_tokens=True))

    def delta(self, ids: tuple[int, ...], stop: str | None) -> str:
        self.ids.extend(ids)
        full = self._decode()
        if stop:  # vLLM ends the text before the stop string it matched
            at = full.find(stop, max(0, self.sent - len(stop) + 1))
            if at >= 0:
                full = full[:at]
        full = full.rstrip(_INCOMPLETE)
        out = full[self.sent :]
        self.sent = max(self.sent, len(full))
        return out


_INCOMPLETE = "\ufffd"  # what decoding shows for the bytes of an unfinished character
