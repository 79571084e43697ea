"""Uploaded voices as files on disk: what ``POST /v1/audio/voices`` keeps.

Owns ``VoiceStore``: one folder per voice under its root, named by the
voice's name in lower case (names compare without case, as ``voice``
does): ``voice.json`` (``StoredVoice``: the name as given, the consent,
the transcript, when, what was uploaded), ``audio.wav``, the reference
audio as decoded (float32 mono at the rate the checkpoint clones from, so
reading it back gives the same samples to the bit) and ``speaker.npy``,
its speaker vector (float32, made once at upload: a request clones with
it; a voice an older omnix kept has none until its first use adds it).
A voice is written whole or not at all (a hidden temporary folder renamed
into place) and removed the same way; the store reads its folders back
when opened, so voices outlive a restart.  The root is the server's ``--log-dir``'s
``voices/``; without one, a temporary folder made on the first upload
and removed when the server closes.

Does not own what a name may be, the limits, decoding the upload or
making its speaker vector (``cloning.py``), nor any route (``voices.py``).
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
_SPEAKER: Final = "speaker.npy"


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

    async def read(self, voice: StoredVoice) -> tuple[np.ndarray, np.ndarray | None]:
        """The voice's reference audio, as uploaded and decoded, and its
        speaker vector (None: kept by an omnix that made none), read-only.
        ``FileNotFoundError`` when it was deleted meanwhile."""
        folder = self._folder(voice.name)
        return await asyncio.to_thread(_read_voice, folder)

    async def add(self, voice: StoredVoice, samples: np.ndarray, speaker: np.ndarray) -> bool:
        """Keep ``voice`` with its audio and speaker vector; False when its
        name is taken."""
        async with self._lock:
            if voice.name.lower() in self._voices:
                return False
            await asyncio.to_thread(self._write, voice, samples, speaker)
            self._voices[voice.name.lower()] = voice
            return True

    async def keep_speaker(self, voice: StoredVoice, speaker: np.ndarray) -> None:
        """Add the speaker vector a voice kept without one was found to have
        (nothing when the voice was deleted meanwhile)."""
        async with self._lock:
            if self._voices.get(voice.name.lower()) is voice:
                await asyncio.to_thread(_write_speaker, self._folder(voice.name), speaker)

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

    def _write(self, voice: StoredVoice, samples: np.ndarray, speaker: np.ndarray) -> None:
        import soundfile as sf

        final = self._folder(voice.name)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{final.name}.{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            sf.write(tmp / _AUDIO, samples, voice.sample_rate, subtype="FLOAT", format="WAV")
            np.save(tmp / _SPEAKER, np.asarray(speaker, dtype=np.float32), allow_pickle=False)
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


def _read_voice(folder: Path) -> tuple[np.ndarray, np.ndarray | None]:
    import soundfile as sf

    data, _ = sf.read(str(folder / _AUDIO), dtype="float32", always_2d=False)
    samples = np.ascontiguousarray(data, dtype=np.float32)
    samples.flags.writeable = False
    try:
        speaker: np.ndarray | None = np.load(folder / _SPEAKER, allow_pickle=False)
    except FileNotFoundError:
        speaker = None
    if speaker is not None:
        speaker.flags.writeable = False
    return samples, speaker


def _write_speaker(folder: Path, speaker: np.ndarray) -> None:
    tmp = folder / f".{_SPEAKER}.{uuid.uuid4().hex}"
    with tmp.open("wb") as f:  # a file: np.save would add ".npy" to a path
        np.save(f, np.asarray(speaker, dtype=np.float32), allow_pickle=False)
    tmp.rename(folder / _SPEAKER)  # whole or not at all
