"""Base's voice to clone: reference audio decoded, or an uploaded voice read back.

Owns: ``Reference`` (the clip to clone from: float32 mono samples at the
rate the checkpoint clones from, its speaker vector, its transcript, and
the uploaded voice's name when it is one); ``Cloning``, one server's: its
``VoiceStore``, the speaker vectors (``speaker_vector``: the served
checkpoint's speaker encoder, loaded on first use, run on a thread of its
own one clip at a time: an uploaded voice's once, at upload, kept with it;
a ``ref_audio`` clip's at admission), the
decoding of reference audio, whatever its format and rate (PyAV, as
chat's audio parts: resampled with libswresample to the cloning rate,
channels averaged), at most ``MAX_BYTES`` and ``MAX_SECONDS``: a
``ref_audio`` ``data:`` URL, a ``ref_audio`` http(s) URL fetched as chat's
media are (only from ``--allowed-media-domains`` hosts, under a timeout
and the byte limit, never another scheme), or an uploaded file; and
``reference``, what a speech body clones from (``voice``, an uploaded
voice; else ``ref_audio`` with ``ref_text``), with the 400s naming the
field for a voice that is not one, a voice and ``ref_audio`` both, a
``ref_text`` beside an uploaded voice; and the rule of an uploaded voice's
name (``check_name``).

Does not own the other checks of a speech body (``speech_tts.check_tts``),
recording the clip in the request (``speech_tts.reference_message``) nor
the voices' routes (``voices.py``).
"""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec
import numpy as np

from omnix.http.audio.protocol import SpeechRequest
from omnix.http.audio.voice_store import StoredVoice, VoiceStore
from omnix.http.common.fields import AudioUrl, AudioUrlPart
from omnix.http.common.form import Upload
from omnix.http.common.plan import PlanContext
from omnix.http.common.sampling import bad
from omnix.http.media.common import AUDIO_MEDIA_TYPES, PCM16_RATE, too_big
from omnix.http.media.decoder import MediaDecoder
from omnix.http.media.sound import decode_audio, from_extension
from omnix.pipelines.config import MediaLimits
from omnix.pipelines.tts_card import TTSCard

if TYPE_CHECKING:
    from omnix.engines.qwen3_tts_clone import SpeakerEncoder

#: The largest reference clip, as sent (bytes after base64), and its
#: longest (seconds): vLLM-Omni's 10 MB; a minute is 750 frames of the
#: talker's context, far more than cloning needs (a few seconds).
MAX_BYTES: Final = 10 * 2**20
MAX_SECONDS: Final = 60.0
#: At most this many uploaded voices per server.
MAX_VOICES: Final = 256
#: An uploaded voice's name: a path segment and a ``voice`` value.
NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_FETCH_TIMEOUT_S: Final = 10.0


class Reference(msgspec.Struct, frozen=True, kw_only=True):
    """The clip a request clones from, decoded (read-only samples)."""

    samples: np.ndarray
    rate: int
    #: its speaker vector (float32 [dim]), what the talker clones with
    speaker: np.ndarray
    text: str | None = None
    #: the uploaded voice it is, "" for ``ref_audio``
    voice: str = ""


class Cloning:
    """One server's uploaded voices and decoding of reference audio."""

    def __init__(
        self, served: PlanContext, root: Path | None, allowed_domains: frozenset[str]
    ) -> None:
        self.served = served
        self.store = VoiceStore(root)
        self.allowed_domains = allowed_domains
        self._decoder: MediaDecoder | None = None
        self._speaker: asyncio.Future[SpeakerEncoder] | None = None
        self._pool: ThreadPoolExecutor | None = None

    def card(self) -> TTSCard | None:
        """The served checkpoint's card when it clones voices (Base)."""
        card = self.served.tts_card()
        return card if card is not None and card.variant == "base" else None

    def close(self) -> None:
        self.store.close()
        if self._decoder is not None:
            self._decoder.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def speaker_vector(self, samples: np.ndarray, rate: int) -> np.ndarray:
        """The speaker vector (float32 [dim], read-only) of ``samples`` at
        ``rate`` (the checkpoint's cloning rate), as the talker would make
        it: the served Base checkpoint's speaker encoder, loaded on first
        use."""
        loop = asyncio.get_running_loop()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="omnix-speaker")
        if self._speaker is None:
            folder = self.served.tts_folder()
            if folder is None or self.card() is None:
                raise RuntimeError(f"pipeline {self.served.model!r} clones no voices")
            from omnix.engines.qwen3_tts_clone import SpeakerEncoder

            self._speaker = loop.run_in_executor(self._pool, SpeakerEncoder.load, folder)
        try:
            encoder = await asyncio.shield(self._speaker)
        except Exception:
            self._speaker = None  # the next clip tries again
            raise
        vector = await loop.run_in_executor(self._pool, encoder.vector_of, samples, rate)
        vector.flags.writeable = False
        return vector

    def limits(self, rate: int) -> MediaLimits:
        return MediaLimits(
            audio=True, max_part_bytes=MAX_BYTES, max_audio_seconds=MAX_SECONDS, sample_rate=rate
        )

    async def decode_url(self, param: str, url: str, rate: int) -> np.ndarray:
        """``url`` (``data:`` or http(s)) decoded at ``rate``; 400 naming ``param``."""
        if self._decoder is None:
            self._decoder = MediaDecoder(
                self.limits(rate),
                allowed_domains=self.allowed_domains,
                workers=1,
                pipeline=self.served.model,
                fetch_timeout_s=_FETCH_TIMEOUT_S,
            )
        (decoded,) = await self._decoder.decode(
            [(param, AudioUrlPart(audio_url=AudioUrl(url=url)))]
        )
        return decoded.array

    async def decode_upload(self, param: str, upload: Upload, rate: int) -> np.ndarray:
        """An uploaded file decoded at ``rate``; 400 naming ``param``."""
        data = upload.data
        if len(data) > MAX_BYTES:
            raise too_big(param, len(data), MAX_BYTES)
        if not data:
            raise bad(param, f"{param} is empty: upload an audio file of the voice.")
        media_type = upload.content_type.partition(";")[0].strip().lower()
        hint = AUDIO_MEDIA_TYPES.get(media_type, "") or from_extension(upload.filename)
        samples = await asyncio.to_thread(
            decode_audio, param, data, hint, PCM16_RATE, self.limits(rate)
        )
        samples.flags.writeable = False
        return samples

    async def reference(self, body: SpeechRequest) -> Reference | None:
        """What ``body`` clones from on a Base checkpoint (None elsewhere,
        and on Base without a voice to clone: ``check_tts`` answers that)."""
        card = self.card()
        if card is None:
            return None
        rate = card.clone_rate
        if body.voice != "default":
            voice = self._uploaded(body)
            try:
                samples, speaker = await self.store.read(voice)
            except FileNotFoundError:
                raise bad("voice", f"Voice {body.voice!r} was deleted; upload it again.") from None
            if speaker is None:  # kept by an omnix that made none at upload
                speaker = await self.speaker_vector(samples, rate)
                await self.store.keep_speaker(voice, speaker)
            return Reference(
                samples=samples, rate=rate, speaker=speaker, text=voice.ref_text, voice=voice.name
            )
        if body.ref_audio is None:
            return None
        samples = await self.decode_url("ref_audio", body.ref_audio, rate)
        speaker = await self.speaker_vector(samples, rate)
        return Reference(samples=samples, rate=rate, speaker=speaker, text=body.ref_text)

    def _uploaded(self, body: SpeechRequest) -> StoredVoice:
        voice = self.store.get(body.voice)
        if voice is None:
            names = [v.name for v in self.store.voices()]
            have = (
                f"the voices uploaded here are {', '.join(names)}"
                if names
                else "no voice is uploaded here"
            )
            raise bad(
                "voice",
                f"Unknown voice {body.voice!r}: {self.served.model!r} is Qwen3-TTS Base, which "
                f"has no named speakers, and {have} (GET /v1/audio/voices). Upload one with "
                "POST /v1/audio/voices, or clone from ref_audio and omit voice.",
            )
        if body.ref_audio is not None:
            raise bad(
                "ref_audio",
                f"voice {body.voice!r} is an uploaded voice and ref_audio gives another: "
                "send one of them.",
            )
        if body.ref_text is not None:
            raise bad(
                "ref_text",
                f"voice {body.voice!r} is cloned with the transcript uploaded with it (or "
                "its speaker vector alone when none was): omit ref_text.",
            )
        return voice


def check_name(name: str) -> None:
    """400 naming ``name`` unless it can name an uploaded voice."""
    if not NAME.match(name):
        raise bad(
            "name",
            f"name {name[:80]!r} is not a voice name: 1-64 letters, digits, '_' or '-', "
            "starting with a letter or digit.",
        )
    if name.lower() == "default":
        raise bad("name", "name 'default' is reserved (the checkpoint's own voice): pick another.")
