"""A realtime session's input audio: the buffer, its limits, and audio items.

Owns ``InputBuffer``: the pcm16 24 kHz audio ``input_audio_buffer.append``
adds (base64 checked, whole samples, the buffer's limit: the seconds of
audio one clip may hold for the pipeline, ``MediaLimits``), what a commit
takes (``take``: at least ``MIN_COMMIT_MS``), and ``audio_entry``: audio
made a conversation item, decoded and resampled for the model by the
media decoder every chat request's audio goes through
(``omnix.http.media``), so a realtime turn and a chat request with the
same audio give the model the same samples.

Does not own finding speech in the buffer (``vad.py``) nor the
conversation (``conversation.py``).
"""

from __future__ import annotations

import base64
import binascii
from typing import Final

import msgspec

from omnix.http.common.fields import InputAudio, InputAudioPart
from omnix.http.core.errors import ApiError
from omnix.http.media.decoder import MediaDecoder
from omnix.http.media.parts import decode_parts
from omnix.http.realtime.conversation import Entry
from omnix.http.realtime.protocol import Content, Item
from omnix.pipelines.config import MediaLimits

#: pcm16 mono at 24 kHz: bytes per millisecond.
BYTES_PER_MS: Final = 48
#: A commit of less audio than this is refused, as OpenAI does.
MIN_COMMIT_MS: Final = 100


def decode_b64_audio(data: str, param: str) -> bytes:
    """Base64 pcm16 as bytes: 400 when not base64 or not whole samples."""
    try:
        pcm = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(
            400,
            f"{param} is not valid base64; send base64 of 16-bit little-endian mono PCM at "
            "24000 Hz.",
            param=param,
            code="invalid_audio",
        ) from None
    if len(pcm) % 2:
        raise ApiError(
            400,
            f"{param}: pcm16 audio is whole 16-bit samples, but this holds an odd number of "
            f"bytes ({len(pcm)}).",
            param=param,
            code="invalid_audio",
        )
    return pcm


class InputBuffer:
    """The audio appended since the last commit or clear."""

    def __init__(self, limits: MediaLimits | None) -> None:
        self.limits = limits
        # One clip's limits: its seconds, and its bytes once decoded from
        # base64 (the media decoder checks both when the buffer is committed).
        seconds = int((limits.max_audio_seconds if limits else 0) * 1000) * BYTES_PER_MS
        self.max_bytes = min(seconds, limits.max_part_bytes if limits else 0) // 2 * 2
        self.pcm = bytearray()
        #: bytes of audio taken by earlier commits and clears: where this
        #: buffer starts on the session's audio clock
        self.start = 0

    @property
    def ms(self) -> int:
        return len(self.pcm) // BYTES_PER_MS

    def append(self, data: str) -> bytes:
        """Add base64 pcm16; returns the bytes added."""
        if self.limits is None or not self.limits.audio:
            raise ApiError(
                400,
                "this pipeline takes no audio input: send text items (conversation.item.create).",
                param="audio",
                code="unsupported_input",
            )
        pcm = decode_b64_audio(data, "audio")
        if len(self.pcm) + len(pcm) > self.max_bytes:
            raise ApiError(
                400,
                f"the input audio buffer would hold more than {self.max_bytes // BYTES_PER_MS} ms, "
                "the most one turn may; commit or clear it first (this append was not added).",
                param="audio",
                code="input_audio_buffer_full",
            )
        self.pcm += pcm
        return pcm

    def take(self, upto_ms: int | None = None) -> bytes:
        """The buffer's audio (up to ``upto_ms`` on the session's audio
        clock), taken out of it."""
        end = len(self.pcm)
        if upto_ms is not None:
            end = min(end, max(0, upto_ms * BYTES_PER_MS - self.start))
        if end < MIN_COMMIT_MS * BYTES_PER_MS:
            raise ApiError(
                400,
                f"the input audio buffer holds {end // BYTES_PER_MS} ms; a commit needs at least "
                f"{MIN_COMMIT_MS} ms of audio.",
                code="input_audio_buffer_commit_empty",
            )
        pcm = bytes(self.pcm[:end])
        del self.pcm[:end]
        self.start += end
        return pcm

    @property
    def start_ms(self) -> int:
        """Where the buffer starts on the session's audio clock."""
        return self.start // BYTES_PER_MS

    @property
    def end_ms(self) -> int:
        """Where the buffer ends on the session's audio clock."""
        return (self.start + len(self.pcm)) // BYTES_PER_MS

    def drop_before(self, ms: int) -> None:
        """Let go of the audio before ``ms`` on the session's audio clock
        (server VAD keeps only the padding before speech)."""
        n = min(len(self.pcm), max(0, ms * BYTES_PER_MS - self.start))
        del self.pcm[:n]
        self.start += n

    def clear(self) -> None:
        self.start += len(self.pcm)
        self.pcm.clear()


async def audio_entry(decoder: MediaDecoder, item: Item, pcm: bytes, text_before: int = 0) -> Entry:
    """A user item holding ``pcm`` (24 kHz pcm16), decoded for the model."""
    part = InputAudioPart(
        input_audio=InputAudio(data=base64.b64encode(pcm).decode(), format="pcm16")
    )
    param = f"item {item.id}"
    media, blobs = await decode_parts(decoder, [(param, part)])
    decoded = media[param]
    return Entry(
        item=item,
        media=(msgspec.structs.replace(decoded, at=text_before),),
        blobs=blobs,
        pcm=pcm,
    )


def input_audio_item(item_id: str) -> Item:
    """The user item a committed buffer becomes (its audio is not echoed)."""
    return Item(id=item_id, role="user", content=[Content(type="input_audio", transcript=None)])
