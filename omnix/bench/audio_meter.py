"""Counting the seconds of audio in a byte stream as it arrives (``AudioMeter``).

Owns: telling a WAV stream (its ``fmt`` chunk's rate, channels and sample
width; a streamed header's unknown sizes; one file per chunk) from raw
16-bit PCM, and adding up the sample bytes and seconds received, so
``omnix bench serve`` can time the first audio sample (TTFP) and the
real-time factor.  Does not own decoding the audio.
"""

from __future__ import annotations

import struct


class AudioMeter:
    """Counts the audio seconds in a byte stream as it arrives.

    A stream that starts with a RIFF/WAVE header is read as WAV (rate,
    channels and sample width from its ``fmt`` chunk; the data chunk's
    size is ignored: streamed WAV headers say 0xFFFFFFFF); a piece that
    starts a new RIFF header starts a new WAV (servers that send each
    chunk as a file of its own).  Anything else is raw 16-bit mono PCM at
    ``sample_rate``."""

    def __init__(self, sample_rate: int) -> None:
        self.default_rate = sample_rate
        self.seconds = 0.0
        self.sample_bytes = 0
        self._head = b""  # header bytes not parsed yet
        self._in_data = False
        self._bytes_per_s = float(sample_rate * 2)

    def feed(self, piece: bytes) -> None:
        if not piece:
            return
        if self._in_data and piece[:4] == b"RIFF" and piece[8:12] == b"WAVE":
            self._in_data = False
            self._head = b""
        if self._in_data:
            self._add(len(piece))
            return
        self._head += piece
        head = self._head
        if len(head) < 12:
            if b"RIFF".startswith(head[:4]):
                return  # wait for the rest of a possible header
        if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            self._bytes_per_s = float(self.default_rate * 2)
            self._in_data = True
            self._head = b""
            self._add(len(head))
            return
        pos = 12
        while pos + 8 <= len(head):
            cid = head[pos : pos + 4]
            (size,) = struct.unpack("<I", head[pos + 4 : pos + 8])
            if cid == b"data":
                self._in_data = True
                self._head = b""
                self._add(len(head) - pos - 8)
                return
            if cid == b"fmt " and pos + 8 + 16 <= len(head):
                _, channels, rate, _, _, bits = struct.unpack("<HHIIHH", head[pos + 8 : pos + 24])
                self._bytes_per_s = float(max(1, rate * channels * max(1, bits // 8)))
            pos += 8 + size + (size & 1)

    def _add(self, n: int) -> None:
        if n > 0:
            self.sample_bytes += n
            self.seconds += n / self._bytes_per_s
