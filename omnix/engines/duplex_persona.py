"""PersonaPlex's persona as a Moshi session's opening frames.

Owns ``PersonaPrompts``: a session's voice prompt and role text made into
the ``Prompt`` its first positions take (``DuplexModel.start``), as
PersonaPlex's runtime steps its "system prompts" before a conversation
(``LMGen.step_system_prompts``), each frame forced:

1. the voice: each 80 ms frame of ``voices/NAME.wav`` (Mimi's codes, the
   last frame padded with zeros) as Moshi's own audio, its text the
   padding token (3), the user's audio a 440 Hz tone (the "silent" sine
   PersonaPlex feeds as the user's while it sets the persona);
2. half a second (6 frames) of silence as Moshi's audio (Mimi's codes of
   zeros), padding text, the tone as the user's;
3. the role text wrapped in PersonaPlex's system tags (``<system> ...
   <system>``), tokenised by the folder's tokenizer, one token a frame as
   Moshi's text, silence as its audio, the tone as the user's;
4. half a second of silence again.

A session with no voice skips 1, with no role text 3 (and with neither
has no prompt).  The frames are a function of the folder and the
session's ``voice`` and ``instructions`` alone, so a continuation that
starts the session again starts it the same.  omnix places the persona
after Moshi's initial frame, as transformers' ``generate`` places a
prompt; PersonaPlex's runtime writes its first frame over that initial
one (its text and semantic code), which omnix does not reproduce.  Nor
does it normalise the voice's loudness (PersonaPlex brings it to -24 LUFS
first): a voice file is heard as it is.

Does not own which voices a folder has (``omnix.pipelines.persona_card``)
nor stepping the frames (``duplex_model.py``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from omnix.pipelines.persona_card import read_persona_card, voice_file, voice_stem

if TYPE_CHECKING:
    import torch

    from omnix.engines.duplex_model import DuplexModel, Prompt

#: Moshi's text padding token (what its text stream holds between words).
TEXT_PAD: Final = 3
#: Half a second of frames (PersonaPlex's ``audio_silence_frame_cnt``).
SILENCE_FRAMES: Final = 6
SINE_HZ: Final = 440.0
SINE_AMPLITUDE: Final = 0.5


def system_text(instructions: str) -> str:
    """The role text as PersonaPlex's runtime gives it to the tokenizer."""
    cleaned = instructions.strip()
    if cleaned.startswith("<system>") and cleaned.endswith("<system>"):
        return cleaned
    return f"<system> {cleaned} <system>"


class PersonaPrompts:
    """The opening frames of a folder's personas (voices encoded once)."""

    def __init__(self, folder: str | Path, model: DuplexModel) -> None:
        self.folder = Path(folder)
        self.model = model
        self.card = read_persona_card(folder)
        self._voices: dict[str, torch.Tensor] = {}
        self._tokenizer: Any = None
        self._silence: torch.Tensor | None = None
        self._sine: torch.Tensor | None = None

    def prompt(self, voice: str, instructions: str) -> Prompt | None:
        """The session's opening frames (None: no persona).  A voice or role
        text the folder cannot give is a ``ValueError`` naming it."""
        import torch

        from omnix.engines.duplex_model import Prompt

        voice = "" if voice in ("", "default") else voice_stem(voice)
        if not voice and not instructions:
            return None
        k = self.model.layout.num_codebooks
        silence, sine = self._codes()
        parts: list[tuple[torch.Tensor, torch.Tensor]] = []  # (text [T], moshi [K, T])
        if voice:
            codes = self._voice(voice)
            parts.append((torch.full((codes.shape[1],), TEXT_PAD, dtype=torch.long), codes))
        quiet = silence[:, None].expand(k, SILENCE_FRAMES)
        parts.append((torch.full((SILENCE_FRAMES,), TEXT_PAD, dtype=torch.long), quiet))
        if instructions:
            ids = torch.tensor(self._tokens(system_text(instructions)), dtype=torch.long)
            parts.append((ids, silence[:, None].expand(k, ids.shape[0])))
            parts.append((torch.full((SILENCE_FRAMES,), TEXT_PAD, dtype=torch.long), quiet))
        text = torch.cat([t for t, _ in parts])
        moshi = torch.cat([m for _, m in parts], dim=1)
        user = sine[:, None].expand(k, text.shape[0])
        return Prompt(text=text, moshi=moshi.clone(), user=user.clone())

    # -- the parts -------------------------------------------------------------------

    def _voice(self, voice: str) -> torch.Tensor:
        """Mimi's codes of voice ``voice`` ([K, frames])."""
        got = self._voices.get(voice)
        if got is None:
            got = self._voices[voice] = self._encode(self._read_voice(voice))
        return got

    def _read_voice(self, voice: str) -> np.ndarray:
        import soundfile as sf

        card = self.card
        if voice not in card.voices:
            if voice in card.embeddings:
                raise ValueError(
                    f"voice {voice!r} is PersonaPlex's precomputed embedding "
                    f"(voices/{voice}.pt), which omnix does not read: put the voice's audio "
                    f"in the folder as voices/{voice}.wav (24 kHz mono)"
                )
            have = ", ".join(card.voices) or "none"
            raise ValueError(f"voice {voice!r} is not one of this checkpoint's voices ({have})")
        path = voice_file(self.folder, voice)
        pcm, rate = sf.read(str(path), dtype="float32", always_2d=True)
        lay = self.model.layout
        if rate != lay.sample_rate or pcm.shape[1] != 1 or not pcm.shape[0]:
            raise ValueError(
                f"voice {voice!r} ({path}) must be mono audio at {lay.sample_rate} Hz; "
                f"it is {pcm.shape[1]} channel(s) of {pcm.shape[0]} samples at {rate} Hz"
            )
        frame = lay.frame_samples
        whole = math.ceil(pcm.shape[0] / frame) * frame
        return np.pad(pcm[:, 0], (0, whole - pcm.shape[0]))

    def _encode(self, pcm: np.ndarray) -> torch.Tensor:
        """Mimi's first K codes of whole frames of ``pcm`` ([K, frames])."""
        import torch

        m = self.model
        x = torch.from_numpy(pcm)[None, None].to(m.device, next(m.mimi.parameters()).dtype)
        with torch.inference_mode():
            codes = m.mimi.encode(x, num_quantizers=m.layout.num_codebooks)[0]
        return codes[0].cpu()

    def _codes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mimi's codes of a frame of silence and of the 440 Hz tone ([K] each)."""
        if self._silence is None or self._sine is None:
            frame = self.model.layout.frame_samples
            rate = self.model.layout.sample_rate
            t = np.arange(frame) / rate
            tone = (SINE_AMPLITUDE * np.sin(2 * math.pi * SINE_HZ * t)).astype(np.float32)
            self._silence = self._encode(np.zeros(frame, dtype=np.float32))[:, 0]
            self._sine = self._encode(tone)[:, 0]
        return self._silence, self._sine

    def _tokens(self, text: str) -> list[int]:
        if not self.card.role_text:
            raise ValueError(
                "this checkpoint takes no role text (a Moshi folder without PersonaPlex's "
                "voices/ has no persona prompt)"
            )
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            path = self.folder / "tokenizer.json"
            if not path.is_file():
                raise ValueError(f"a role text needs the folder's text tokenizer: no {path}")
            self._tokenizer = Tokenizer.from_file(str(path))
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids
