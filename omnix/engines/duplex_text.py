"""Moshi's text tokens as text, frame by frame: its "inner monologue".

Owns: ``TextPieces`` (a Moshi folder's SentencePiece vocabulary, read from
its ``tokenizer.json``) and ``TextStream`` (one session's: each frame's
text token to the text it adds, as Kyutai's server writes it: a piece's
``▁`` is a space, the padding ids (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2,
``<pad>`` 3) and the "initial" token say nothing, and byte-fallback pieces
(``<0xNN>``) are decoded as UTF-8 across frames, a character split over
several frames coming with its last byte).

Does not own the model (``duplex_model.py``) nor which frame says what.
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path
from typing import Final

#: Kyutai's special text ids: unknown (ends a run of padding), bos, eos, pad.
SILENT_IDS: Final = frozenset((0, 1, 2, 3))
_BYTE: Final = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class TextPieces:
    """A Moshi folder's text vocabulary: id -> its piece's bytes."""

    def __init__(self, folder: str | Path) -> None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
        pieces: list[bytes] = []
        for i in range(tok.get_vocab_size()):
            piece = tok.id_to_token(i) or ""
            m = _BYTE.match(piece)
            pieces.append(bytes([int(m.group(1), 16)]) if m else piece.replace("▁", " ").encode())
        self._pieces = pieces

    def stream(self) -> TextStream:
        return TextStream(self)

    def piece(self, token: int) -> bytes:
        if token in SILENT_IDS or not 0 <= token < len(self._pieces):
            return b""
        return self._pieces[token]


class TextStream:
    """One session's text so far, one token at a time."""

    def __init__(self, pieces: TextPieces) -> None:
        self._pieces = pieces
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def text(self, token: int) -> str:
        """The text ``token`` adds ("" for padding, or a byte of a character
        not yet whole)."""
        return self._utf8.decode(self._pieces.piece(token))
