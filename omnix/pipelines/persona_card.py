"""What persona a Moshi checkpoint takes, read from its folder alone.

Owns: ``PersonaCard`` (the voice prompts a PersonaPlex-style folder ships
in ``voices/`` and whether it takes a role text) and ``read_persona_card``,
which checking a duplex session's ``session.update`` before admission
(``omnix.http.realtime.duplex.config``) and building its opening frames
(``omnix.engines.duplex_persona``) both read; ``voice_stem``, the one way
a voice's name is read.

NVIDIA's PersonaPlex is Moshi with a persona: a voice prompt (audio the
model hears as its own voice before the conversation) and a role text
(its text stream before the conversation), both given as the session's
opening frames.  Its folder carries the voices in ``voices/`` (its
``voices.tgz`` unpacks there).  omnix takes a voice given as audio,
``voices/NAME.wav`` (24 kHz mono, as PersonaPlex's loader also takes
audio prompts); PersonaPlex's published voices are ``NAME.pt``, the
temporal transformer's input embeddings of the prompt saved by its own
runtime (with that runtime's delay cache), which omnix does not read:
they are listed apart (``embeddings``) so that asking for one says so.
A folder with ``voices/`` takes a role text; a plain Moshi folder (no
``voices/``) takes neither a voice nor a role.

Does not own the frames (``omnix.engines.duplex_persona``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import msgspec

VOICES_DIR: Final = "voices"
#: A voice prompt omnix takes: audio.
VOICE_SUFFIX: Final = ".wav"
#: PersonaPlex's precomputed voice embeddings (its runtime's format).
EMBEDDING_SUFFIX: Final = ".pt"


class PersonaCard(msgspec.Struct, frozen=True):
    """A Moshi checkpoint's persona: its voice prompts' names (``voices/
    NAME.wav``, sorted), the PersonaPlex embeddings it ships that omnix
    does not take (``voices/NAME.pt`` with no ``NAME.wav``), and whether it
    takes a role text (a PersonaPlex-style folder)."""

    voices: tuple[str, ...] = ()
    embeddings: tuple[str, ...] = ()
    role_text: bool = False


def voice_stem(name: str) -> str:
    """A voice's name as the card lists it: PersonaPlex's clients name a
    voice by its file (``NATF2.pt``), others by the voice (``NATF2``)."""
    for suffix in (EMBEDDING_SUFFIX, VOICE_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def read_persona_card(folder: str | Path) -> PersonaCard:
    """The card of a Moshi folder (an empty one without ``voices/``)."""
    voices = Path(folder) / VOICES_DIR
    if not voices.is_dir():
        return PersonaCard()
    files = [p for p in voices.iterdir() if p.is_file()]
    audio = sorted(p.stem for p in files if p.suffix == VOICE_SUFFIX)
    saved = sorted({p.stem for p in files if p.suffix == EMBEDDING_SUFFIX} - set(audio))
    return PersonaCard(voices=tuple(audio), embeddings=tuple(saved), role_text=True)


def voice_file(folder: str | Path, voice: str) -> Path:
    """Where voice ``voice`` (a card's name) is."""
    return Path(folder) / VOICES_DIR / f"{voice_stem(voice)}{VOICE_SUFFIX}"
