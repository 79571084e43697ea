"""Uploaded voices as files on disk: what ``POST /v1/audio/voices`` keeps.

Owns ``VoiceStore``: one folder per voice under its root, named by the
voice's name in lower case (names compare without case, as ``voice``
does): ``voice.json`` (``StoredVoice``: the name as given, the consent,
the transcript, when, what was uploaded) and ``audio.wav``, the reference
audio as decoded (float32 mono at the rate the checkpoint clones from, so
reading it back gives the same samples to the bit).  A voice is written
whole or not at all (a hidden temporary folder renamed into place) and
removed the same way; the store reads its folders back when opened, so
voices outlive a restart.  The root is the server's ``--log-dir``'s
``voices/``; without one, a temporary folder made on the first upload
and removed when the server closes.

Does not own what a name may be, the limits or decoding the upload
(``cloning.py``), nor any route (``voices.py``).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Final

import msgspec
import numpy as np

log = logging.getLogger("omnix.http.audio")

_META: Final = "voice.json"
_AUDIO: Final = "audio.wav"


class StoredVoice(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One uploaded voice, as ``GET /v1/audio/voices`` lists it (vLLM-Omni's
    fields, and the clip's rate and length)."""

    name: str
    consent: str
    #: Unix seconds of the upload
    created_at: int
    #: the uploaded file's media type and size in bytes
    mime_type: str
    file_size: int
    sample_rate: int
    #: the clip's length in seconds
    seconds: float
    #: the clip's transcript (cloning in context); None: the speaker vector alone
    ref_text: str | None = None


class VoiceStore:
    """The uploaded voices under ``root`` (None: a temporary folder)."""

    def __init__(self, root: Path | None) -> None:
        self._root = root
        self._temporary = root is None
        self._voices: dict[str, StoredVoice] = {}
        self._lock = asyncio.Lock()
        if root is not None and root.is_dir():
            self._voices = _read_all(root)

    def voices(self) -> list[StoredVoice]:
        """The voices, oldest first (then by name)."""
        return sorted(self._voices.values(), key=lambda v: (v.created_at, v.name.lower()))

    def get(self, name: str) -> StoredVoice | None:
        return self._voices.get(name.lower())

    async def samples(self, voice: StoredVoice) -> np.ndarray:
        """The voice's reference audio, as uploaded and decoded (read-only).
        ``FileNotFoundError`` when it was deleted meanwhile."""
        folder = self._folder(voice.name)
        return await asyncio.to_thread(_read_audio, folder / _AUDIO)

    async def add(self, voice: StoredVoice, samples: np.ndarray) -> bool:
        """Keep ``voice`` with its audio; False when its name is taken."""
        async with self._lock:
            if voice.name.lower() in self._voices:
                return False
            await asyncio.to_thread(self._write, voice, samples)
            self._voices[voice.name.lower()] = voice
            return True

    async def delete(self, name: str) -> StoredVoice | None:
        """Remove the voice; None when there is none by that name."""
        async with self._lock:
            voice = self._voices.pop(name.lower(), None)
            if voice is not None:
                await asyncio.to_thread(self._remove, voice.name)
            return voice

    def close(self) -> None:
        """Remove a temporary root (voices kept under ``--log-dir`` stay)."""
        if self._temporary and self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
            self._voices.clear()

    def _folder(self, name: str) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="omnix-voices-"))
        return self._root / name.lower()

    def _write(self, voice: StoredVoice, samples: np.ndarray) -> None:
        import soundfile as sf

        final = self._folder(voice.name)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{final.name}.{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            sf.write(tmp / _AUDIO, samples, voice.sample_rate, subtype="FLOAT", format="WAV")
            (tmp / _META).write_bytes(msgspec.json.encode(voice))
            tmp.rename(final)  # whole or not at all
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _remove(self, name: str) -> None:
        folder = self._folder(name)
        gone = folder.parent / f".{folder.name}.{uuid.uuid4().hex}.deleted"
        try:
            folder.rename(gone)  # out of sight at once
        except FileNotFoundError:
            return
        shutil.rmtree(gone, ignore_errors=True)


def _read_all(root: Path) -> dict[str, StoredVoice]:
    voices: dict[str, StoredVoice] = {}
    for folder in sorted(root.iterdir()):
        if folder.name.startswith("."):
            # A write or a removal a crash interrupted: never a voice.
            shutil.rmtree(folder, ignore_errors=True)
            continue
        try:
            voice = msgspec.json.decode((folder / _META).read_bytes(), type=StoredVoice)
        except (OSError, msgspec.DecodeError) as exc:
            log.warning("voices: skipping %s (%s)", folder, exc)
            continue
        if voice.name.lower() != folder.name or not (folder / _AUDIO).is_file():
            log.warning("voices: skipping %s (not a voice this store wrote)", folder)
            continue
        voices[folder.name] = voice
    return voices


def _read_audio(path: Path) -> np.ndarray:
    import soundfile as sf

    data, _ = sf.read(str(path), dtype="float32", always_2d=False)
    samples = np.ascontiguousarray(data, dtype=np.float32)
    samples.flags.writeable = False
    return samples
